"""A report with a drifting and a quiet segment and an hour of history: what docs/drift.md's
screenshot shows (python -m tests.drift.report_sample OUT.html)."""

from __future__ import annotations

import sys

from inferwatch.drift.service import report
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records

T0 = 1_800_000_000.0  # a fixed clock: the same report every time


def sample_html() -> str:
    clock = Clock(T0)
    state = DriftState(Store(":memory:"), WindowConfig(window_s=3600, buckets=60), clock=clock)
    for variant in ("stable", "canary"):
        state.ingest.add(body(records(4000, T0 - 7200, T0 - 5400, seed=1, model="llama-3.1-8b", variant=variant)))
        state.baselines.freeze(("llama-3.1-8b", variant), T0 - 7200, T0 - 5400)
    for step in range(40):  # 40 minutes of traffic; the canary's answers get longer after 20
        clock.now = T0 + 60 * step
        shift = step >= 20
        state.ingest.add(body(records(150, clock.now - 60, clock.now, seed=100 + step, model="llama-3.1-8b",
                                  variant="stable")))
        state.ingest.add(body(records(150, clock.now - 60, clock.now, seed=200 + step, model="llama-3.1-8b",
                                  variant="canary",
                                  prompt_mu=5.4 if shift else 5.0, ttft_scale=0.13 if shift else 0.1,
                                  length_share=0.35 if shift else 0.2)))
        for segment in state.ingest.segments():
            state.verdicts.calibrated(segment)
    rows = [report.SegmentReport(s, state.baselines.held[s], state.ingest.current(s), state.verdicts.calibrated(s),
                                 state.verdicts.history(s), state.verdicts.drifting_since(s), state.ingest.records(s))
            for s in state.ingest.segments()]
    return report.render(rows, clock.now)


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        fh.write(sample_html())
