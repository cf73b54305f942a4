"""The report is worst first across A/B experiments and drift segments alike (rollback, hold,
drift, calibrating, continue, promote, no drift, insufficient data), the summary lists both,
and it is bounded: the worst ``detail`` entries in full, the rest as summary rows.
/metrics keeps per-method series to each feature's headline method (and every method of a
drifted feature) unless asked for all."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferwatch.drift.ab.report import AbEntry
from inferwatch.drift.service import report
from inferwatch.drift.service.collector import DriftCollector
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.feature_records import body, records

T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def scored():
    """A quiet segment and a drifting one (longer prompts), each with a calibrated verdict."""
    state = DriftState(Store(":memory:"), WindowConfig(), clock=lambda: T0)
    for variant, mu in (("quiet", 5.0), ("drifting", 5.6)):
        state.ingest.add(body(records(1000, T0 - 7200, T0 - 5400, seed=1, variant=variant)))
        state.baselines.freeze(("m", variant), T0 - 7200, T0 - 5400)
        state.ingest.add(body(records(400, T0 - 600, T0 - 1, seed=2, variant=variant, prompt_mu=mu)))
    rows = [report.SegmentReport(s, state.baselines.held[s], state.ingest.current(s), state.verdicts.calibrated(s),
                                 state.verdicts.history(s), state.verdicts.drifting_since(s), state.ingest.records(s))
            for s in state.ingest.segments()]
    assert {r.segment[1]: r.verdict.status for r in rows} == {"quiet": "no_drift", "drifting": "drift"}
    return state, rows


def _ab(decision: str, model: str) -> AbEntry:
    return AbEntry(model, "v1", "v2", decision, (f"{decision} because of a test",), (500, 500),
                   f"<h2 id='ab-{model}'>A/B {model}: {decision.upper()}</h2>")


def test_worst_first_across_ab_and_drift_and_the_summary_lists_decisions(scored):
    _, rows = scored
    page = report.render(rows, T0, [_ab("continue", "a-continue"), _ab("rollback", "z-rollback")])
    headings = re.findall(r"<h2 id='([^']+)'", page)
    assert headings == ["ab-z-rollback", "m/drifting", "ab-a-continue", "m/quiet"]
    summary = page[page.index("<table class='summary'>"):]
    summary = summary[:summary.index("</table>")]
    assert re.findall(r"<td>(A/B|drift)</td>", summary) == ["A/B", "drift", "A/B", "drift"]
    assert "ROLLBACK" in summary and "rollback because of a test" in summary


def test_detail_is_bounded_and_the_rest_are_summary_rows(scored):
    _, rows = scored
    many = [replace(rows[0], segment=("m", f"copy-{i:03d}")) for i in range(60)]
    page = report.render(many, T0, [], detail=5)
    assert len(re.findall(r"<h2 id='m/copy", page)) == 5
    assert page.count("<td>drift</td>") == 60
    assert "?detail=" in page
    one_in_full = len(report.render(many[:1], T0, [], detail=1))
    assert len(page) < 5 * one_in_full + 60 * 600  # five in full, 60 rows of at most 0.6 KB


def test_one_history_point_is_a_point(scored):
    svg = report.history_svg([(T0, 0.2, 0.3)], "wasserstein")
    assert "<circle" in svg and "<polyline" not in svg


def _series(state: DriftState, methods: str) -> list[str]:
    registry = CollectorRegistry()
    registry.register(DriftCollector(state, methods))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line.startswith("inferwatch_drift_score{")]


def test_metrics_keep_the_headline_method_unless_asked_for_all(scored):
    state, rows = scored
    verdicts = {r.segment: r.verdict for r in rows}
    ok = sum(f.status == "ok" for v in verdicts.values() for f in v.features.values())
    every = sum(len(f.methods) for v in verdicts.values() for f in v.features.values() if f.status == "ok")
    drifted_extra = sum(len(f.methods) - 1 for v in verdicts.values() for f in v.features.values() if f.drifted)
    assert len(_series(state, "all")) == every
    headline = _series(state, "headline")
    assert len(headline) == ok + drifted_extra < every
    assert any('feature="prompt_tokens",method="psi"' in line and 'variant="drifting"' in line for line in headline)
    assert not any('method="psi"' in line and 'variant="quiet"' in line for line in headline)
