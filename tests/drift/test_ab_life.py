"""A canary's whole life through the drift service's state: three simulated days (injected
clock) of 20,000 unequal users, four ramp steps (1 %, 5 %, 25 %, 50 %: four weight epochs),
records ingested hour by hour into a real SQLite store, and the verdict asked every hour as a
rollout controller would: no weights, no start.

- A/A: never a rollback, and never a sample-ratio hold, over all 72 looks and four epochs.
- The drift service restarts at hour 40, its ledgers last checkpointed at hour 35: the
  restarted service replays what came after, and every later verdict is the one a service
  that never stopped gives (compared in full, every number).
- TTFT 5 % slower for the canary's users: a rollback naming ttft alone, at some look.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferwatch.drift.ab.verdict import AbRequest, judge, read
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support import ab_simulation as sim

T0 = 1.8e9
RAMP = ((0, 6, (0.99, 0.01)), (6, 18, (0.95, 0.05)), (18, 36, (0.75, 0.25)), (36, 72, (0.5, 0.5)))
QUESTION = AbRequest(control="control", treatment="treatment")


def _state(path, clock) -> DriftState:
    state = DriftState(Store(path), WindowConfig(), clock=lambda: clock[0])
    state.restore()
    return state


def _look(state: DriftState) -> dict:
    _, doc = judge(sim.MODEL, QUESTION, state.ledgers.read(lambda ledgers: read(ledgers, sim.MODEL, QUESTION)))
    return doc


def life(tmp_path, effect: float, restart_at: int | None = None, checkpoint_every: int = 5):
    """Each hour's verdict; with ``restart_at``, also those of a second service fed the same
    batches that restarts then (their docs per hour, or None before the restart)."""
    rng = np.random.default_rng(20)
    users = sim.users(20_000, 9, 72, rng)
    clock = [T0]
    main = _state(tmp_path / "main.sqlite3", clock)
    other = _state(tmp_path / "other.sqlite3", clock) if restart_at is not None else None
    looks: list[tuple[dict, dict | None]] = []
    for epoch, (h0, h1, weights) in enumerate(RAMP):
        split = sim.split(weights, epoch)
        for hour in range(h0, h1):
            r = sim.requests(users, split, T0 + hour * 3600, T0 + (hour + 1) * 3600, rng, effect)
            clock[0] = T0 + (hour + 1) * 3600
            for body in sim.bodies(sim.feature_records(r)):
                main.ingest.add(body)
                if other is not None:
                    other.ingest.add(body)
            if other is not None and (hour + 1) % checkpoint_every == 0:
                other.ledgers.checkpoint()
            if other is not None and hour + 1 == restart_at:
                other.store.close()  # no final checkpoint: as after a kill
                other = _state(tmp_path / "other.sqlite3", clock)
            looks.append((_look(main), _look(other) if other is not None and hour + 1 >= restart_at else None))
            if effect and looks[-1][0]["decision"] == "rollback":
                return looks
    return looks


def test_aa_three_days_four_ramp_steps_never_rolls_back_and_a_restart_changes_nothing(tmp_path):
    looks = life(tmp_path, effect=0.0, restart_at=40)
    assert len(looks) == 72
    decisions = [doc["decision"] for doc, _ in looks]
    assert "rollback" not in decisions
    assert not any(doc["srm"]["alarm"] for doc, _ in looks if doc["srm"] is not None)
    assert [doc["epoch"] for doc, _ in looks] == [e for e, (h0, h1, _) in enumerate(RAMP) for _ in range(h0, h1)]
    last = looks[-1][0]
    assert last["alpha"] == pytest.approx(0.05 / 16) and last["weights"] == {"control": 0.5, "treatment": 0.5}
    assert min(last["units"].values()) > 5000
    assert decisions[-1] in ("continue", "promote")
    after = [(a, b) for a, b in looks if b is not None]
    assert len(after) == 33
    for a, b in after:
        assert a == b


def test_a_five_percent_slower_first_token_is_caught(tmp_path):
    looks = life(tmp_path, effect=0.05)
    doc = looks[-1][0]
    assert doc["decision"] == "rollback" and "ttft" in doc["worse"], doc["reasons"]
    assert set(doc["worse"]) <= {"ttft", "ttft_per_request"}
    assert doc["metrics"]["ttft"]["relative"] > 0
