"""Feature records in: each batch validated, stored (idempotently, by the sender's key) and
counted into its segments' current windows; idle windows swept. The windows and the health
counts are this role's; what else a stored batch feeds (the experiment ledgers) is told
through ``on_batch``."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from inferwatch.drift.schema import Batch, BatchError, parse_batch
from inferwatch.drift.store import Store
from inferwatch.drift.verdicts import Windows
from inferwatch.drift.window_config import OTHER_SEGMENT, WindowConfig
from inferwatch.drift.windows import Segment, SegmentWindow, segments_of

# (the batch, its id in the store, when it was taken): the ledgers add what they keep of it
OnBatch = Callable[[Batch, int, float], None]


class HealthSnapshot(NamedTuple):
    """/health's numbers, replaced whole after each change so a reader never takes the lock
    (an ingest holding it must not hold /health)."""

    segments: int
    ingested: int
    overflow_records: int
    window_bytes: int


class SegmentLimit(BatchError):
    """A new segment would exceed INFERWATCH_DRIFT_MAX_SEGMENTS."""


class Ingest:
    """The current windows, one per (model, variant) segment, bounded in number: records of
    segments past ``max_segments`` are counted in OTHER_SEGMENT. Segments with a baseline
    (``baselines``) count against the bound too and are never folded away."""

    def __init__(self, store: Store, config: WindowConfig, lock: threading.RLock, clock: Callable[[], float],
                 baselines: Callable[[], Mapping[Segment, Any]]) -> None:
        self.store, self.config, self.clock = store, config, clock
        self._lock = lock  # shared with the other roles: a checkpoint sees batches and ledgers as one
        self._baselines = baselines
        self.windows: dict[Segment, SegmentWindow] = {}
        self.ingested = 0
        self.overflow = 0  # records folded into OTHER_SEGMENT
        self.expired = 0  # idle segments dropped
        self.on_batch: OnBatch = lambda batch, batch_id, now: None
        self.on_sweep: Callable[[float], None] = lambda now: None  # once per time bucket, under the lock
        self.on_expired: Callable[[Segment], None] = lambda segment: None  # a window gone idle, under the lock
        self._last_sweep = -math.inf
        self._bytes_at = -math.inf
        # what /health reads without the lock (one attribute read): counts as of the last change
        self.snapshot = HealthSnapshot(0, 0, 0, 0)

    def add(self, body: bytes, key: str | None = None) -> tuple[int, int] | None:
        """Validate, persist, count. Returns (records accepted, records inside the window),
        or None for a batch stored already under ``key`` (its sender's earlier try got no
        answer back). Stored and handed on under the lock, so a ledger checkpoint includes
        exactly the batches up to its id."""
        now = self.clock()
        batch = parse_batch(body, now)
        with self._lock:  # received_at taken under the lock: a restart replays batches and ratings in this order
            batch_id = self.store.append(body, float(batch.finished_at.min()), float(batch.finished_at.max()),
                                         self.clock(), key)
            if batch_id is None:
                return None
            self.on_batch(batch, batch_id, now)
            return batch.size, self.count(batch, now)

    def count(self, batch: Batch, now: float) -> int:
        """Add ``batch`` to its segments' windows (a restart replays stored batches here);
        returns how many of its records fall inside the window."""
        inside = 0
        cfg = self.config
        with self._lock:
            self._sweep(now)
            baselines = self._baselines()
            held = self._held()  # once per batch: a batch of 10,000 new names used to recount per name
            for segment, rows in segments_of(batch).items():
                window = self.windows.get(segment)
                if window is None:
                    if segment not in baselines and held >= cfg.max_segments - 1:
                        self.overflow += rows.size
                        segment = OTHER_SEGMENT
                        window = self.windows.get(segment)
                    if window is None:
                        window = self.windows[segment] = SegmentWindow(cfg.window_s, cfg.buckets, cfg.reservoir)
                        held += segment != OTHER_SEGMENT and segment not in baselines
                inside += window.add(batch, rows, now)
            self.ingested += batch.size
            self.publish(now)
        return inside

    def admit(self, segment: Segment) -> None:
        """Raise ``SegmentLimit`` if ``segment`` is new and the bound is reached (the last of
        ``max_segments`` is kept for OTHER_SEGMENT)."""
        with self._lock:
            known = segment in self.windows or segment in self._baselines()
            if not known and self._held() >= self.config.max_segments - 1:
                raise SegmentLimit(f"{len(self.segments())} segments are held, the limit "
                                   f"(INFERWATCH_DRIFT_MAX_SEGMENTS) is {self.config.max_segments}: raise it, or wait "
                                   f"for idle segments to expire ({self.config.window_s:g} s without records)")

    def _held(self) -> int:
        """Segments held, not counting OTHER_SEGMENT."""
        return len((self.windows.keys() | self._baselines().keys()) - {OTHER_SEGMENT})

    def publish(self, now: float) -> None:
        """Refresh what /health shows (under the lock). Window bytes walk every bucket of every
        window, so they are recounted at most once a second."""
        if now - self._bytes_at >= 1.0:
            self._bytes_at = now
            window_bytes = sum(w.nbytes() for w in self.windows.values())
        else:
            window_bytes = self.snapshot.window_bytes
        self.snapshot = HealthSnapshot(len(self.windows.keys() | self._baselines().keys()), self.ingested,
                                       self.overflow, window_bytes)

    def _sweep(self, now: float) -> None:
        """Drop windows that hold nothing any more, at most once per time bucket (with what
        the other roles keep for them: ``on_expired``)."""
        if now - self._last_sweep < self.config.bucket_s:
            return
        self._last_sweep = now
        self.on_sweep(now)
        for segment, window in list(self.windows.items()):
            window.expire(now)
            if not window.live:
                del self.windows[segment]
                self.on_expired(segment)
                self.expired += 1
        self.publish(now)

    def segments(self) -> list[Segment]:
        """Every segment held (a window or a baseline); idle ones are swept here too, so they
        expire without new records."""
        with self._lock:
            self._sweep(self.clock())
            return sorted(set(self.windows) | set(self._baselines()))

    def current(self, segment: Segment) -> Windows:
        now = self.clock()
        with self._lock:
            window = self.windows.get(segment)
            return window.histograms(now) if window else {}

    def samples(self, segment: Segment, feature: str) -> np.ndarray:
        with self._lock:
            window = self.windows.get(segment)
            return window.samples(feature, self.clock()) if window else np.empty(0)

    def records(self, segment: Segment) -> int:
        with self._lock:
            window = self.windows.get(segment)
            return window.records(self.clock()) if window else 0

    def memory_bytes(self) -> int:
        """Bytes held by windows (counts and samples): what the segment bound limits."""
        with self._lock:
            return sum(w.nbytes() for w in self.windows.values())
