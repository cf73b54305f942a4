"""A drift replica killed and restarted goes on from its own verdict history: once it has
caught up on the records it missed, its ``drifting_since`` is its twin's (it was null for a
minute or more, the history's first point after the restart having been taken before the
catch-up). Two replicas of a pair, each with its own store, fed the same records, on one
clock; the restart is a new state on the killed one's SQLite file, as a restarted process."""

from __future__ import annotations

from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records

T0 = 1_800_000_000.0
SEGMENT = ("m", "v1")
CONFIG = WindowConfig(window_s=3600, buckets=60)


def minute(step: int, shifted: bool) -> bytes:
    now = T0 + 60 * step
    return body(records(150, now - 60, now, seed=100 + step, prompt_mu=5.6 if shifted else 5.0,
                        ttft_scale=0.14 if shifted else 0.1))


def replica(path: str, clock: Clock) -> DriftState:
    state = DriftState(Store(path), CONFIG, clock=clock)
    state.restore()
    return state


def test_a_restarted_replica_dates_its_drift_as_its_twin_does_once_caught_up(tmp_path):
    clock = Clock(T0)
    a, b = replica(str(tmp_path / "a.sqlite3"), clock), replica(str(tmp_path / "b.sqlite3"), clock)
    reference = body(records(4000, T0 - 7200, T0 - 5400, seed=1))
    for state in (a, b):
        state.ingest.add(reference)
        state.baselines.freeze(SEGMENT, T0 - 7200, T0 - 5400)
    for step in range(25):  # drift from minute 10; both see every minute
        clock.now = T0 + 60 * step + 5
        batch = minute(step, shifted=step >= 10)
        for state in (a, b):
            state.ingest.add(batch)
            state.verdicts.calibrated(SEGMENT)
    since = a.verdicts.drifting_since(SEGMENT)
    assert since is not None and b.verdicts.drifting_since(SEGMENT) == since
    assert T0 + 60 * 10 <= since <= T0 + 60 * 25

    b.store.close()  # b is killed; a goes on alone for five minutes, the gateway holds b's records
    missed = []
    for step in range(25, 30):
        clock.now = T0 + 60 * step + 5
        missed.append(minute(step, shifted=True))
        a.ingest.add(missed[-1])
        a.verdicts.calibrated(SEGMENT)

    clock.now = T0 + 60 * 30 + 5
    b = replica(str(tmp_path / "b.sqlite3"), clock)  # restarted on its own file
    b.verdicts.calibrated(SEGMENT)  # asked before the records it missed reach it
    for batch in missed:  # the gateway's queue delivers them
        b.ingest.add(batch)
    verdicts = [state.verdicts.calibrated(SEGMENT).status for state in (a, b)]
    assert verdicts == ["drift", "drift"]
    assert b.verdicts.drifting_since(SEGMENT) == a.verdicts.drifting_since(SEGMENT) == since
    assert b.verdicts.history(SEGMENT)[-1].t == a.verdicts.history(SEGMENT)[-1].t  # one point per bucket, at its start


def test_a_new_baseline_starts_a_new_history_also_after_a_restart(tmp_path):
    clock = Clock(T0)
    path = str(tmp_path / "a.sqlite3")
    a = replica(path, clock)
    a.ingest.add(body(records(4000, T0 - 7200, T0 - 5400, seed=1)))
    a.baselines.freeze(SEGMENT, T0 - 7200, T0 - 5400)
    for step in range(5):
        clock.now = T0 + 60 * step + 5
        a.ingest.add(minute(step, shifted=True))
        a.verdicts.calibrated(SEGMENT)
    assert a.verdicts.history(SEGMENT)
    a.baselines.freeze(SEGMENT, T0 - 7200, T0 - 5400)  # a new baseline: the old verdicts are not its
    assert replica(path, clock).verdicts.history(SEGMENT) == []
