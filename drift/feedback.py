"""User ratings of answers, per (model, variant), for the A/B verdict's feedback guardrail.

The gateway joins each rating to the variant that gave the answer and posts it here. Ratings
are kept in memory for the window (``INFERWATCH_DRIFT_WINDOW_S``), at most ``per_segment``
per variant: a few numbers each, far fewer than requests. A score of 0.5 or more (thumbs up
is 1) counts as positive. They are not persisted: after a restart the guardrail counts the
ratings that arrive from then on.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from inferwatch.drift.feature_record import TEXT_MAX, UNIX_S

POSITIVE = 0.5
MAX_RECORDS = 10_000


class FeedbackRecord(BaseModel):
    """One rating, joined by the gateway to the variant that gave the answer. Strict: a
    number is a JSON number (``"at": false`` or ``"score": "1"`` is refused, as the schema says)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=TEXT_MAX)
    variant: str = Field(min_length=1, max_length=TEXT_MAX)
    experiment: str | None = Field(None, min_length=1, max_length=TEXT_MAX)
    score: float = Field(ge=0, le=1, allow_inf_nan=False, description="0..1; 0.5 or more is positive")
    at: float = Field(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False, description="unix seconds")


class FeedbackBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    records: list[FeedbackRecord] = Field(min_length=1, max_length=MAX_RECORDS)


class FeedbackLog:
    """(model, variant) → recent (time, positive) pairs. Written by the event loop, read by
    A/B verdicts on the thread pool: a lock keeps each read consistent."""

    def __init__(self, window_s: float, max_segments: int, per_segment: int = 100_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.window_s, self.max_segments, self.per_segment, self.clock = window_s, max_segments, per_segment, clock
        self._ratings: dict[tuple[str, str], deque[tuple[float, bool]]] = {}
        self._lock = threading.Lock()

    def add(self, batch: FeedbackBatch) -> int:
        """Keep the batch's ratings; those of variants beyond ``max_segments`` are not kept.
        Returns how many were."""
        kept = 0
        with self._lock:
            for r in batch.records:
                ratings = self._ratings.get((r.model, r.variant))
                if ratings is None:
                    if len(self._ratings) >= self.max_segments:
                        continue
                    ratings = self._ratings[(r.model, r.variant)] = deque(maxlen=self.per_segment)
                ratings.append((r.at, r.score >= POSITIVE))
                kept += 1
        return kept

    def counts(self, model: str, variant: str, since: float | None = None) -> tuple[int, int]:
        """(positive, total) within the window, from ``since`` if given."""
        start = self.clock() - self.window_s
        if since is not None and math.isfinite(since):
            start = max(start, since)
        with self._lock:
            ratings = self._ratings.get((model, variant), ())
            kept = [positive for at, positive in ratings if at >= start]
        return sum(kept), len(kept)
