"""Each role of the drift service on its own: its state, what it tells the others, and what it
keeps in the store. The service's tests cover them wired together (``DriftState``)."""

from __future__ import annotations

import threading

import pytest

from inferwatch.drift.ab.book import LedgerBook
from inferwatch.drift.baselines import Baselines
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.feedback import FeedbackBatch
from inferwatch.drift.ingest import Ingest, SegmentLimit
from inferwatch.drift.ratings import Ratings
from inferwatch.drift.schema import BatchError, parse_batch
from inferwatch.drift.segment_verdicts import SegmentVerdicts
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.thresholds import Thresholds
from inferwatch.drift.verdicts import CalibrationCache
from inferwatch.drift.window_config import OTHER_SEGMENT, WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records

T0 = 1_800_000_000.0


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "drift.sqlite3"))
    yield s
    s.close()


def _ingest(store, config=WindowConfig(), baselines=None, clock=None):
    held = {} if baselines is None else baselines
    return Ingest(store, config, threading.RLock(), clock or Clock(T0), lambda: held), held


def test_ingest_counts_stores_once_per_key_and_hands_each_stored_batch_on(store):
    ingest, _ = _ingest(store)
    seen = []
    ingest.on_batch = lambda batch, batch_id, now: seen.append((batch.size, batch_id, now))
    raw = body(records(40, T0 - 60, T0, seed=1))
    assert ingest.add(raw, key="k1") == (40, 40)
    assert ingest.add(raw, key="k1") is None  # the sender's retry: stored already, counted once
    assert seen == [(40, 1, T0)] and ingest.records(("m", "v1")) == 40 and ingest.ingested == 40
    assert ingest.snapshot.segments == 1 and ingest.snapshot.ingested == 40


def test_ingest_folds_segments_past_the_bound_and_refuses_a_new_baseline_there(store):
    ingest, held = _ingest(store, WindowConfig(max_segments=3))
    for variant in ("a", "b", "c", "d"):
        ingest.add(body(records(10, T0 - 60, T0, seed=2, variant=variant)))
    assert sorted(ingest.windows) == [("m", "a"), ("m", "b"), OTHER_SEGMENT]
    assert ingest.overflow == 20
    ingest.admit(("m", "a"))  # held already
    with pytest.raises(SegmentLimit, match="INFERWATCH_DRIFT_MAX_SEGMENTS"):
        ingest.admit(("m", "new"))
    held[("m", "x")] = object()  # a baseline's segment counts against the bound too
    assert ingest.snapshot.segments == 3  # published at the last change; the next one counts it
    ingest.add(body(records(1, T0 - 60, T0, seed=3, variant="a")))
    assert ingest.snapshot.segments == 4


def test_ingest_sweeps_idle_windows_and_says_which(store):
    clock = Clock(T0)
    ingest, _ = _ingest(store, WindowConfig(window_s=600, buckets=10), clock=clock)
    swept, expired = [], []
    ingest.on_sweep, ingest.on_expired = swept.append, expired.append
    ingest.add(body(records(10, T0 - 60, T0, seed=4)))
    clock.now = T0 + 700  # the window is empty now
    assert ingest.segments() == [] and expired == [("m", "v1")] and ingest.expired == 1
    assert swept == [T0, T0 + 700]


def test_ratings_count_each_answer_once_and_hand_the_kept_ones_on(store):
    ratings = Ratings(store, threading.RLock(), Clock(T0))
    handed = []
    ratings.on_ratings = lambda batch, rating_id: handed.append((len(batch.records), rating_id)) or 1
    rating = {"model": "m", "variant": "v1", "response_id": "r1", "score": 1.0, "at": T0}
    assert ratings.add(FeedbackBatch.model_validate({"records": [rating]})) == (1, 0)
    assert ratings.add(FeedbackBatch.model_validate({"records": [rating, {**rating, "response_id": "r2"}]})) == (1, 1)
    assert handed == [(1, 1), (1, 2)]
    assert [rid for rid, _, _ in store.ratings_after(0)] == [1, 2]


def _assigned(n: int, seed: int) -> bytes:
    return body([r | {"experiment": "canary", "epoch": 0, "weight": 0.5, "unit": f"{i % 7:016x}"}
                 for i, r in enumerate(records(n, T0 - 60, T0, seed=seed))])


def test_the_ledger_book_checkpoints_with_its_ids_and_a_new_one_reads_it_back(store):
    book = LedgerBook(store, WindowConfig(), threading.RLock())
    book.add_batch(parse_batch(_assigned(30, 5), T0), batch_id=4, now=T0)
    rating = {"model": "m", "variant": "v1", "experiment": "canary", "epoch": 0, "unit": f"{0:016x}",
              "score": 1.0, "at": T0}
    assert book.add_ratings(FeedbackBatch.model_validate({"records": [rating]}), rating_id=2) == 1
    assert book.upto == (4, 2) and book.checkpoint() == 1 and book.checkpoint() == 0  # written once
    again = LedgerBook(store, WindowConfig(), threading.RLock())
    assert again.restore_checkpoint() == (4, 2)
    assert again.read(lambda ledgers: sorted(ledgers.ledgers)) == [("m", "canary")]


def test_thresholds_change_whole_or_not_at_all_and_survive_a_restart(store):
    changed = []
    thresholds = Thresholds(store, WindowConfig(), threading.RLock())
    thresholds.on_change = lambda: changed.append(True)
    with pytest.raises(BatchError, match="'psi'"):
        thresholds.set({"alpha": 0.05, "psi": -1})
    assert thresholds.alpha == 0.01 and changed == []  # the valid half did not apply either
    assert thresholds.set({"alpha": 0.05, "psi": 0.3})["methods"]["psi"] == {"mode": "fixed", "threshold": 0.3}
    assert changed == [True] and thresholds.policy.alpha == 0.05
    again = Thresholds(store, WindowConfig(), threading.RLock())
    again.restore()
    assert again.alpha == 0.05 and again.fixed == {"psi": 0.3}


def test_baselines_are_taken_within_the_bound_stored_and_restored(store):
    calibrator = BackgroundCalibrator(CalibrationCache(64), 16)
    refused = {("m", "full")}

    def admit(segment):
        if segment in refused:
            raise SegmentLimit("full")

    told = []
    baselines = Baselines(store, threading.RLock(), Clock(T0), admit, calibrator)
    baselines.on_rebased = lambda segment: told.append(("rebased", segment))
    baselines.on_put = lambda segment: told.append(("put", segment))
    store.append(body(records(200, T0 - 600, T0 - 60, seed=6)), T0 - 600, T0 - 60, T0)
    frozen = baselines.freeze(("m", "v1"), T0 - 600, T0)
    assert frozen.records == 200 and told == [("rebased", ("m", "v1")), ("put", ("m", "v1"))]
    with pytest.raises(SegmentLimit):
        baselines.freeze(("m", "full"), T0 - 600, T0)
    again = Baselines(store, threading.RLock(), Clock(T0), admit, calibrator)
    again.restore()
    assert list(again.held) == [("m", "v1")] and again.held[("m", "v1")].records == 200


def test_verdicts_are_cached_until_told_and_keep_the_history_of_a_baselined_segment(tmp_path):
    clock = Clock(T0)
    state = DriftState(Store(str(tmp_path / "v.sqlite3")), WindowConfig(), clock=clock)
    verdicts: SegmentVerdicts = state.verdicts
    state.ingest.add(body(records(2000, T0 - 7200, T0 - 5400, seed=7)))
    state.baselines.freeze(("m", "v1"), T0 - 7200, T0 - 5400)
    state.ingest.add(body(records(500, T0 - 600, T0, seed=8)))
    first = verdicts.calibrated(("m", "v1"))
    assert first is not None and first.status == "no_drift"
    assert verdicts.verdict(("m", "v1")) is first  # cached
    verdicts.stale()
    assert verdicts.verdict(("m", "v1")) is not first and len(verdicts.history(("m", "v1"))) == 1
    verdicts.expired(("m", "v1"))  # a baselined segment keeps its history
    assert len(verdicts.history(("m", "v1"))) == 1
    verdicts.rebased(("m", "v1"))
    assert verdicts.history(("m", "v1")) == [] and state.store.history() == {}
    state.store.close()
