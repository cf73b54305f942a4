"""The drift service's roles, built and wired: ingest, ratings, the experiment ledgers,
baselines, thresholds and verdicts, over one store and one lock (a ledger checkpoint sees
the batches and ratings up to its ids as one), and the restart that rebuilds them all from
the store. No HTTP here: the service and the tests drive it with batches and clocks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from inferwatch.drift.ab.book import LedgerBook
from inferwatch.drift.baselines import Baselines
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.feedback import FeedbackBatch
from inferwatch.drift.ingest import Ingest
from inferwatch.drift.ratings import Ratings
from inferwatch.drift.schema import BatchError, parse_stored
from inferwatch.drift.segment_verdicts import SegmentVerdicts
from inferwatch.drift.store import Store
from inferwatch.drift.thresholds import Thresholds
from inferwatch.drift.verdicts import CalibrationCache
from inferwatch.drift.window_config import WindowConfig
from inferwatch.drift.windows import Segment

log = logging.getLogger(__name__)


class DriftState:
    def __init__(self, store: Store, config: WindowConfig, clock: Callable[[], float] = time.time,
                 calibrator: BackgroundCalibrator | None = None) -> None:
        self.store, self.config, self.clock = store, config, clock
        self.calibrator = calibrator or BackgroundCalibrator(CalibrationCache(config.calibration_cache),
                                                             config.calibration_queue)
        lock = threading.RLock()
        self.thresholds = Thresholds(store, config, lock)
        self.ingest = Ingest(store, config, lock, clock, lambda: self.baselines.held)
        self.baselines = Baselines(store, lock, clock, self.ingest.admit, self.calibrator)
        self.ratings = Ratings(store, lock, clock)
        self.ledgers = LedgerBook(store, config, lock)
        self.verdicts = SegmentVerdicts(store, config, lock, clock, self.ingest, lambda: self.baselines.held,
                                        self.thresholds, self.calibrator)
        self.ingest.on_batch = self.ledgers.add_batch
        self.ingest.on_sweep = self.ledgers.expire
        self.ingest.on_expired = self.verdicts.expired
        self.ratings.on_ratings = self.ledgers.add_ratings
        self.thresholds.on_change = self.verdicts.stale
        self.baselines.on_rebased = self._rebased
        self.baselines.on_put = self.verdicts.verdict

    def _rebased(self, segment: Segment) -> None:
        self.verdicts.rebased(segment)
        self.ingest.publish(self.clock())

    def restore(self) -> int:
        """Rebuild every role from the store (after a restart or a crash): baselines, the
        ledgers from their checkpoint and the batches and ratings after it (in the order they
        came), the windows from the batches still inside them, thresholds and history; then
        queue the calibrations the windows need. Returns the records replayed into windows."""
        now = self.clock()
        self.store.prune(now - self.config.retention_s)
        self.baselines.restore()
        upto = self.ledgers.restore_checkpoint()
        replayed, since = 0, now - self.config.window_s
        ratings = self.store.ratings_after(upto[1])  # replayed between the batches, as they came
        for batch_id, received_at, body in self.store.batches_for_restore(since, upto[0]):
            while ratings and batch_id > self.ledgers.upto[0] and ratings[0][1] < received_at:
                rating_id, _, rated = ratings.pop(0)
                self.ledgers.add_ratings(FeedbackBatch.model_validate_json(rated), rating_id)
            try:
                batch = parse_stored(body)
            except BatchError as exc:  # only if the record contract changed between versions; never fatal
                log.error("skipping a stored batch that no longer validates: %s", exc)
                continue
            if batch_id > self.ledgers.upto[0]:
                self.ledgers.add_batch(batch, batch_id, now)
            if batch.finished_at.max() >= since:
                self.ingest.count(batch, now)
                replayed += batch.size
        for rating_id, _, rated in ratings:
            self.ledgers.add_ratings(FeedbackBatch.model_validate_json(rated), rating_id)
        self.thresholds.restore()
        self.verdicts.restore_history()
        for segment in list(self.baselines.held):
            self.verdicts.verdict(segment)  # queues the calibrations the current windows need
        return replayed
