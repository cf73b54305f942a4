"""The experiment ledgers as the service keeps them: fed by stored batches and ratings, read
under the lock, checkpointed with the ids of the last batch and rating they include, and
rebuilt from the checkpoint and what came after it on a restart."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from inferwatch.drift.ab.ledger import LedgerKey, Ledgers, restore_ledger, snapshot
from inferwatch.drift.feedback import POSITIVE, FeedbackBatch
from inferwatch.drift.schema import Batch
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


class LedgerBook:
    def __init__(self, store: Store, config: WindowConfig, lock: threading.RLock) -> None:
        self.store, self.config = store, config
        self._lock = lock  # shared with ingest and ratings: a checkpoint includes exactly what its ids say
        self.ledgers = Ledgers(config.ab_experiments, config.ab_units)
        self.upto = (0, 0)  # the last batch and rating the ledgers include
        self._gone: list[LedgerKey] = []  # expired since the last checkpoint

    def add_batch(self, batch: Batch, batch_id: int, now: float) -> None:
        """A stored batch (called under the lock, as it is stored)."""
        self.ledgers.add_batch(batch, now - self.config.retention_s)
        self.upto = (max(self.upto[0], batch_id), self.upto[1])

    def add_ratings(self, batch: FeedbackBatch, rating_id: int) -> int:
        """Stored ratings (called under the lock); returns how many joined an experiment."""
        kept = sum(self.ledgers.add_rating(r.model, r.experiment, r.epoch, r.variant, r.unit, r.score >= POSITIVE,
                                           r.at)
                   for r in batch.records if r.experiment is not None and r.epoch is not None)
        self.upto = (self.upto[0], max(self.upto[1], rating_id))
        return kept

    def expire(self, now: float) -> None:
        """Drop ledgers idle past the retention (called under the lock, at a sweep)."""
        self._gone += self.ledgers.expire(now - self.config.retention_s)

    def read(self, read: Callable[[Ledgers], T]) -> T:
        """``read`` under the lock: it must copy what it keeps, and be quick."""
        with self._lock:
            return read(self.ledgers)

    def checkpoint(self) -> int:
        """Write the ledgers that changed since the last checkpoint; returns how many."""
        with self._lock:
            changed = {key: ledger for key, ledger in self.ledgers.ledgers.items() if ledger.dirty}
            blobs = {key: snapshot(ledger) for key, ledger in changed.items()}
            for ledger in changed.values():
                ledger.dirty = False
            gone, self._gone = self._gone, []
            upto = self.upto
        try:
            self.store.checkpoint_ledgers(blobs, gone, upto)
        except BaseException:
            with self._lock:
                for ledger in changed.values():
                    ledger.dirty = True
                self._gone += gone
            raise
        return len(blobs)

    def restore_checkpoint(self) -> tuple[int, int]:
        """Load the checkpointed ledgers; returns the (batch id, rating id) they include, from
        which the stored batches and ratings after them are replayed. (0, 0), and no ledger,
        when a checkpoint is unreadable (another version's): everything is replayed."""
        blobs, upto = self.store.ledgers()
        for blob in blobs:
            try:
                ledger = restore_ledger(blob, self.config.ab_units)
            except (ValueError, KeyError, OSError) as exc:  # a checkpoint of another version: rebuilt from batches
                log.error("experiment ledger checkpoint unreadable, skipped: %s", exc)
                upto = (0, 0)
                continue
            self.ledgers.ledgers[(ledger.model, ledger.experiment)] = ledger
        if upto == (0, 0):
            self.ledgers.ledgers.clear()
        self.upto = upto
        return upto
