"""Each incident pages once, while it lasts, for real failures only (issue 19): SLO burn
alerts replayed by promtool over incident timelines at the shipped 10s intervals, against
the workbook's times computed from the spec's windows and burn factors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferwatch.alerts.routing import timing
from inferwatch.alerts.spec import DEFAULT
from inferwatch.common.durations import seconds
from inferwatch.config.settings import Routing
from tests.alerts.promtool import run_promtool
from tests.alerts.timelines import (
    Incident,
    Timeline,
    doc,
    expected,
    promtool_timeline,
    tolerance_s,
    workbook_detection_s,
)

AVAILABILITY, TTFT = DEFAULT.slo_of("availability"), DEFAULT.slo_of("ttft")
FAST_BURN, SLOW_BURN = DEFAULT.tiers
PAGE = timing(Routing().page)

QUICK_STEP_S = 60  # for timelines that check states, not detection times: promtool runs 6x fewer evaluations

HISTORY_S = 6 * 3600  # steady healthy traffic before the incident: every page window is full
MINUTE = 60


def first_page(tl: Timeline, slo, tier) -> tuple[float, float]:
    """(workbook detection time of the incident's steady burn, the pair's tolerance)."""
    [incident] = tl.incidents
    return min((incident.onset_s + workbook_detection_s(slo, w, incident.bad_share), tolerance_s(w, tl.step_s))
               for w in tier.windows)


def check_detection(tl: Timeline, slo, tier, target_s: float) -> list[tuple[float, bool]]:
    """Quiet just before the workbook's detection time, firing just after; and that time,
    with the rules' tolerance and Alertmanager's group_wait, within ``target_s`` of onset."""
    at, tol = first_page(tl, slo, tier)
    onset = tl.incidents[0].onset_s
    assert at + tol + seconds(PAGE.group_wait) - onset <= target_s, (at - onset, tol)
    return [(at - tol, False), (at + tol, True)]


def run(tmp_path, step_s: int, *tests: dict) -> None:
    result = run_promtool(doc(list(tests), step_s), tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_a_total_outage_pages_within_two_minutes_once_and_never_after_recovery(tmp_path):
    """10 minutes of total outage at steady traffic: one page identity, from ~1 minute in
    (the 1h window at 14.4x), held by the 6h/30m pair until the outage leaves its 30m
    window; the resolution comes from the short window, no page starts after recovery."""
    history = 3600  # enough for the 1h/5m pair, which pages first; the 6h pair sees more of the outage
    outage = Incident(history, history + 10 * MINUTE, 1.0)
    tl = Timeline(per_s=10, incidents=(outage,), length_s=history + 60 * MINUTE)
    exp = expected(tl, AVAILABILITY, FAST_BURN)
    assert [after for _, after, _ in exp.changes] == [True, False]  # one page, one resolution
    (start, _, _), (end, _, tol) = exp.changes
    assert start < outage.recovery_s
    # the 30m short window resets the 6h page once the outage's share of it drops below 6x
    threshold = FAST_BURN.windows[1].factor(AVAILABILITY.period) * AVAILABILITY.budget
    assert end == pytest.approx(outage.recovery_s + seconds("30m") - threshold * seconds("30m")
                                + seconds(FAST_BURN.keep_firing_for), abs=5)
    checks = check_detection(tl, AVAILABILITY, FAST_BURN, target_s=120)
    run(tmp_path, tl.step_s, promtool_timeline("10m total outage", tl, AVAILABILITY,
                                               {FAST_BURN: checks + [(end - tol, True), (end + tol, False)]}))


def test_an_outage_that_keeps_coming_back_is_one_page(tmp_path):
    """A minute of total outage every 8 minutes: the 1h/5m pair resets 5 minutes after each,
    two minutes before the next (until the 6h pair holds too); the page holds over the lulls
    (the tier's keep_firing_for) instead of paging at each return."""
    outages = tuple(Incident(HISTORY_S + k * 480, HISTORY_S + k * 480 + 60, 1.0) for k in range(4))
    tl = Timeline(per_s=10, incidents=outages, length_s=HISTORY_S + 70 * MINUTE, step_s=30)
    flapping = expected(tl, AVAILABILITY, replace(FAST_BURN, keep_firing_for="0s"))
    assert len(flapping.changes) > 2  # what it would page without holding over the lulls
    assert [after for _, after, _ in expected(tl, AVAILABILITY, FAST_BURN).changes] == [True, False]
    run(tmp_path, tl.step_s, promtool_timeline("recurring outage", tl, AVAILABILITY, {FAST_BURN: []}))


def test_a_20x_burn_pages_at_the_workbooks_time(tmp_path):
    """2% errors against a 0.1% budget: the 1h window reaches 14.4x after 43.2 minutes."""
    burn = Incident(HISTORY_S, HISTORY_S + 60 * MINUTE, 0.02)
    tl = Timeline(per_s=5, incidents=(burn,), length_s=HISTORY_S + 55 * MINUTE, step_s=30)
    at, _ = first_page(tl, AVAILABILITY, FAST_BURN)
    assert at - burn.onset_s == pytest.approx(43.2 * MINUTE)
    checks = check_detection(tl, AVAILABILITY, FAST_BURN, target_s=at - burn.onset_s + 120)
    run(tmp_path, tl.step_s, promtool_timeline("2% errors", tl, AVAILABILITY, {FAST_BURN: checks}))


def test_a_latency_objective_fully_breached_pages_at_the_workbooks_time(tmp_path):
    """Every first token later than the threshold against a 1% budget: 8.64 minutes."""
    slow = Incident(HISTORY_S, HISTORY_S + 30 * MINUTE, 1.0)
    tl = Timeline(per_s=5, incidents=(slow,), length_s=HISTORY_S + 30 * MINUTE, step_s=30)
    at, _ = first_page(tl, TTFT, FAST_BURN)
    assert at - slow.onset_s == pytest.approx(8.64 * MINUTE)
    checks = check_detection(tl, TTFT, FAST_BURN, target_s=at - slow.onset_s + 120)
    run(tmp_path, tl.step_s, promtool_timeline("TTFT over its threshold", tl, TTFT, {FAST_BURN: checks}))


QUIET_PER_S = 12 / 3600  # 12 requests an hour


@pytest.mark.parametrize(("name", "incident"), [
    # 1 request every 10 minutes, one of which fails: 1/36 of the 6h window is 4.6x the 6h page's threshold
    ("one failure on a model with a request every 10 minutes",
     Incident(HISTORY_S, HISTORY_S + 10 * MINUTE, 1.0), ),
    ("four failures in a row on a model with 12 requests an hour", Incident(HISTORY_S, HISTORY_S + 20 * MINUTE, 1.0)),
])
def test_a_single_failure_or_a_handful_on_a_quiet_model_never_pages(tmp_path, name, incident):
    per_s = 1 / 600 if "every 10 minutes" in name else QUIET_PER_S
    tl = Timeline(per_s=per_s, incidents=(incident,), length_s=HISTORY_S + 3 * 3600, step_s=QUICK_STEP_S)
    assert tl.bad(0, tl.length_s) < AVAILABILITY.min_bad_events
    for tier in (FAST_BURN, SLOW_BURN):
        assert expected(tl, AVAILABILITY, tier).changes == []
    run(tmp_path, tl.step_s, promtool_timeline(name, tl, AVAILABILITY, {FAST_BURN: [], SLOW_BURN: []}, grid_s=300))


def test_a_quiet_model_that_really_fails_still_pages(tmp_path):
    """Half of 12 requests an hour fail: too few requests for the 1h window, and the 6h
    window pages once it holds five failures (50 minutes)."""
    failing = Incident(HISTORY_S, HISTORY_S + 3 * 3600, 0.5)
    tl = Timeline(per_s=QUIET_PER_S, incidents=(failing,), length_s=HISTORY_S + 3 * 3600, step_s=QUICK_STEP_S)
    exp = expected(tl, AVAILABILITY, FAST_BURN)
    [(start, firing, tol)] = exp.changes
    assert firing and start - failing.onset_s == pytest.approx(
        AVAILABILITY.min_bad_events / (QUIET_PER_S * failing.bad_share), abs=5)
    run(tmp_path, tl.step_s, promtool_timeline("half of 12 requests an hour", tl, AVAILABILITY,
                                               {FAST_BURN: [(start - tol, False), (start + tol, True)]}, grid_s=300))


@pytest.mark.parametrize(("share", "fires"), [(0.01441, True), (0.01439, False)])
def test_the_1h_pair_pages_just_above_14_4x_and_not_just_below(tmp_path, share, fires):
    """With 6h of healthy traffic before, only the 1h/5m pair can see a burn this size."""
    burn = Incident(HISTORY_S, HISTORY_S + 90 * MINUTE, share)
    tl = Timeline(per_s=100, incidents=(burn,), length_s=HISTORY_S + 75 * MINUTE, step_s=QUICK_STEP_S)
    run(tmp_path, tl.step_s, promtool_timeline(f"{share:.3%} errors", tl, AVAILABILITY,
                                               {FAST_BURN: [(HISTORY_S + 70 * MINUTE, fires)]}, grid_s=300))


def test_half_a_percent_for_hours_is_a_ticket_not_a_page(tmp_path):
    burn = Incident(HISTORY_S, HISTORY_S + 5 * 3600, 0.005)
    tl = Timeline(per_s=5, incidents=(burn,), length_s=HISTORY_S + 5 * 3600, step_s=QUICK_STEP_S)
    assert expected(tl, AVAILABILITY, FAST_BURN).changes == []
    [(start, _, tol)] = expected(tl, AVAILABILITY, SLOW_BURN).changes
    run(tmp_path, tl.step_s, promtool_timeline("0.5% errors", tl, AVAILABILITY,
                                               {FAST_BURN: [], SLOW_BURN: [(start - tol, False), (start + tol, True)]},
                                               grid_s=300))
