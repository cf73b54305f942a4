"""Incident timelines for the SLO burn alerts: what an on-call SRE lives through, replayed by
promtool against the committed rules, with the expected paging computed independently.

A timeline is steady traffic with incidents (a share of requests failing from an onset to a
recovery). The expected state of a tier's alert at any time comes from the SRE workbook's
definition applied to that traffic, exactly: each window's ratio is the bad share of the
requests it holds, a window pair burns when both ratios exceed ``factor * budget`` and the
long window holds the floors, a tier fires while any of its pairs burns. promtool then
checks, minute by minute, that the real rules fire exactly then and as one alert identity.

The rules compute some windows from 5-minute rates or 5-minute samples (cheaper, smoothed);
near a change of the expected state they may lag by up to that resolution, so each window
pair has a tolerance and grid points that close to a change are not checked. Detection and
reset are then checked on both sides of each change, just outside its tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inferwatch.alerts.generate import RAW_WINDOWS, RULES_DIR, SHORT_WINDOWS
from inferwatch.alerts.model import SLO, BurnTier, BurnWindow
from inferwatch.common.durations import seconds
from tests.alerts.promtool import selector

SHIPPED_STEP_S = 10  # the shipped scrape and evaluation interval
CHAT = {"job": "inferwatch-gateway", "instance": "gw:8080", "model": "m1", "variant": "v1",
        "route": "/v1/chat/completions"}


@dataclass(frozen=True)
class Incident:
    onset_s: float
    recovery_s: float
    bad_share: float  # of the requests while it lasts


@dataclass(frozen=True)
class Timeline:
    per_s: float  # requests per second, steady from t=0
    incidents: tuple[Incident, ...]
    length_s: int
    step_s: int = SHIPPED_STEP_S  # scrape and evaluation interval

    def requests(self, a: float, b: float) -> float:
        return self.per_s * max(0.0, b - max(a, 0.0))

    def bad(self, a: float, b: float) -> float:
        return sum(self.per_s * i.bad_share * max(0.0, min(b, i.recovery_s) - max(a, i.onset_s, 0.0))
                   for i in self.incidents)

    def series(self, slo: SLO) -> dict[str, str]:
        """The counters ``slo`` reads as promtool input, a sample per step, every child present
        from t=0 as the gateway exports them: for availability the 2xx and 5xx requests, for
        a latency SLO the histogram's count and the bucket at its threshold."""
        times = range(0, self.length_s + 1, self.step_s)
        good = " ".join(f"{self.requests(0, t) - self.bad(0, t):.10g}" for t in times)
        bad = " ".join(f"{self.bad(0, t):.10g}" for t in times)
        total = " ".join(f"{self.requests(0, t):.10g}" for t in times)
        if slo.errors is not None:
            return {selector("inferwatch_gateway_requests_total", {**CHAT, "status_class": "2xx"}): good,
                    selector("inferwatch_gateway_requests_total", {**CHAT, "status_class": "5xx"}): bad}
        count, bucket = slo.total.split("{")[0], slo.good.split("{")[0]
        le = slo.good.split('le="')[1].split('"')[0]
        return {selector(count, CHAT): total, selector(bucket, {**CHAT, "le": le}): good,
                selector(bucket, {**CHAT, "le": "+Inf"}): total}


def burns(tl: Timeline, slo: SLO, window: BurnWindow, t: float) -> bool:
    """The workbook's condition for one window pair at ``t``, on the exact traffic."""
    threshold = window.factor(slo.period) * slo.budget
    long_s, short_s = seconds(window.long), seconds(window.short)

    def ratio(w: float) -> float:
        n = tl.requests(t - w, t)
        return tl.bad(t - w, t) / n if n else 0.0

    return (ratio(long_s) > threshold and ratio(short_s) > threshold
            and tl.requests(t - long_s, t) >= slo.min_events and tl.bad(t - long_s, t) >= slo.min_bad_events)


def tolerance_s(window: BurnWindow, step_s: int) -> float:
    """How far from the exact change the rules may change state: a few evaluations for
    windows read from raw counters; for windows read from 5m rates and floors from 5m
    samples, up to a sample interval and a rate window more."""
    if window.long in RAW_WINDOWS and window.short in RAW_WINDOWS:
        return 3 * step_s
    if window.long in SHORT_WINDOWS:
        return 600 + 3 * step_s
    return 900 + 3 * step_s


@dataclass
class Expected:
    """Where the tier's alert changes state, each with its tolerance."""

    changes: list[tuple[float, bool, float]] = field(default_factory=list)  # (time, firing after, tolerance)

    def firing_at(self, t: float) -> bool | None:
        """The expected state at ``t``, or None within the tolerance of a change."""
        state = False
        for at, after, tol in self.changes:
            if abs(t - at) <= tol:
                return None
            if t > at:
                state = after
        return state


def expected(tl: Timeline, slo: SLO, tier: BurnTier, resolution_s: int = 5) -> Expected:
    """Scan the exact tier state; a change takes the tolerance of the pair that made it. The
    alert stops ``keep_firing_for`` after its condition, and a return within that time is
    the same alert."""
    raw, before = [], (False,) * len(tier.windows)
    for t in range(0, tl.length_s + 1, resolution_s):
        now = tuple(burns(tl, slo, w, t) for w in tier.windows)
        if any(now) != any(before):
            changed = [i for i, (a, b) in enumerate(zip(before, now)) if a != b]
            raw.append((t, any(now), max(tolerance_s(tier.windows[i], tl.step_s) for i in changed)))
        before = now
    keep, out = seconds(tier.keep_firing_for), Expected()
    for at, firing, tol in raw:
        if firing and out.changes and not out.changes[-1][1] and at <= out.changes[-1][0]:
            out.changes.pop()  # back before the kept alert stopped: one alert
        elif firing:
            out.changes.append((at, True, tol))
        else:
            out.changes.append((at + keep, False, tol))
    return out


def workbook_detection_s(slo: SLO, window: BurnWindow, bad_share: float) -> float:
    """The SRE workbook's detection time of a steady burn: the long window fills to the
    threshold after ``factor * budget / bad_share`` of its length."""
    return window.factor(slo.period) * slo.budget / bad_share * seconds(window.long)


def firing_query(slo: SLO, tier: BurnTier) -> str:
    return f'ALERTS{{alertname="SLOErrorBudgetBurn",alertstate="firing",slo="{slo.name}",burn="{tier.name}"}}'


def identity(slo: SLO, tier: BurnTier) -> str:
    return selector("ALERTS", {"alertname": "SLOErrorBudgetBurn", "alertstate": "firing", "burn": tier.name,
                               "model": CHAT["model"], "severity": tier.severity, "slo": slo.name})


def promtool_timeline(name: str, tl: Timeline, slo: SLO, checks: dict[BurnTier, list[tuple[float, bool]]],
                      grid_s: int = 60) -> dict:
    """A promtool test: for each tier, its alert at every grid point outside the tolerances
    and at the ``checks`` (time, firing) given explicitly; firing means exactly the one
    identity of that tier."""
    tests = []
    for tier, explicit in checks.items():
        exp = expected(tl, slo, tier)
        points = [(t, exp.firing_at(t)) for t in range(grid_s, tl.length_s + 1, grid_s)]
        points = [(t, state) for t, state in points if state is not None] + explicit
        tests += [{"expr": firing_query(slo, tier), "eval_time": f"{round(t)}s",
                   "exp_samples": [{"labels": identity(slo, tier), "value": 1}] if firing else []}
                  for t, firing in sorted(points)]
    return {"name": name, "interval": f"{tl.step_s}s",
            "input_series": [{"series": k, "values": v} for k, v in tl.series(slo).items()],
            "promql_expr_test": tests}


def doc(tests: list[dict], evaluation_s: int, rules: Path = RULES_DIR / "slos.yml") -> dict:
    """The SLO rule file alone (the other alerts read none of these series), evaluated as
    often as the timelines are scraped."""
    return {"rule_files": [str(rules)], "evaluation_interval": f"{evaluation_s}s", "tests": tests}
