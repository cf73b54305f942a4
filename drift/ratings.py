"""User ratings in: each answer counts once (the store remembers which were rated), the
ratings kept are stored, and what else they feed (the experiment ledgers) is told through
``on_ratings``."""

from __future__ import annotations

import threading
from collections.abc import Callable

from inferwatch.drift.feedback import FeedbackBatch
from inferwatch.drift.store import Store

# (the ratings kept, their id in the store) -> how many joined an experiment
OnRatings = Callable[[FeedbackBatch, int], int]


class Ratings:
    def __init__(self, store: Store, lock: threading.RLock, clock: Callable[[], float]) -> None:
        self.store, self.clock = store, clock
        self._lock = lock  # shared: stored and handed on as one step, as batches are
        self.on_ratings: OnRatings = lambda batch, rating_id: 0

    def add(self, batch: FeedbackBatch) -> tuple[int, int]:
        """Persist ratings and hand them on. Returns how many joined a ledger (a rating of an
        answer no experiment assigned joins none), and how many rated an answer rated before
        (kept out: each answer counts once)."""
        with self._lock:
            received_at = self.clock()
            ids = [r.response_id for r in batch.records if r.response_id is not None]
            first = self.store.first_ratings(ids, received_at) if ids else set()
            records = [r for r in batch.records if r.response_id is None or r.response_id in first]
            duplicates = len(batch.records) - len(records)
            if not records:
                return 0, duplicates
            batch = FeedbackBatch(records=records)
            rating_id = self.store.append_ratings(batch.model_dump_json().encode(), received_at)
            kept = self.on_ratings(batch, rating_id)
        return kept, duplicates
