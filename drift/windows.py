"""Sliding windows kept as time-bucketed histograms, per (model, variant) segment.

A window of length W is split into B time buckets of W/B seconds held in a ring. Adding a
record increments one bin of one bucket; reading the window sums the B newest buckets, so
the window covers between W - W/B and W seconds of history. Memory is segments x features
x bins x buckets, whatever the traffic.

Each bucket also keeps a small reservoir (Vitter's algorithm R) of raw values per numeric
feature, so exact tests (KS, Wasserstein on samples) can audit the binned ones with a
bounded sample of the current window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from drift.binning import CategoricalCounts, Histogram, histogram
from drift.schema import CATEGORICAL_FEATURES, NUMERIC_FEATURES, Batch

Segment = tuple[str, str]  # (model, variant)


@dataclass
class _Bucket:
    epoch: int  # floor(t / width) this slot holds; -1 when empty
    counts: dict[str, np.ndarray]
    cats: dict[str, np.ndarray]
    reservoir: dict[str, np.ndarray]
    seen: dict[str, int]


def _empty_bucket(reservoir: int) -> _Bucket:
    return _Bucket(
        -1,
        {f.name: np.zeros(f.edges.bins, dtype=np.int64) for f in NUMERIC_FEATURES},
        {f.name: np.zeros(len(f.categories) + 1, dtype=np.int64) for f in CATEGORICAL_FEATURES},
        {f.name: np.empty(reservoir) for f in NUMERIC_FEATURES},
        {f.name: 0 for f in NUMERIC_FEATURES},
    )


@dataclass
class SegmentWindow:
    window_s: float
    buckets: int
    reservoir_per_bucket: int
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __post_init__(self) -> None:
        self.width = self.window_s / self.buckets
        self.ring = [_empty_bucket(self.reservoir_per_bucket) for _ in range(self.buckets)]

    def _slot(self, epoch: int) -> _Bucket | None:
        bucket = self.ring[epoch % self.buckets]
        if bucket.epoch == epoch:
            return bucket
        if bucket.epoch > epoch:  # the slot already holds newer data: this record is too old
            return None
        fresh = _empty_bucket(self.reservoir_per_bucket)
        fresh.epoch = epoch
        self.ring[epoch % self.buckets] = fresh
        return fresh

    def add(self, batch: Batch, rows: np.ndarray, now: float) -> int:
        """Count ``rows`` of ``batch``; returns how many fell inside the window."""
        epochs = np.floor(batch.finished_at[rows] / self.width).astype(np.int64)
        oldest = math.floor(now / self.width) - self.buckets + 1
        added = 0
        for epoch in np.unique(epochs):
            if epoch < oldest:
                continue
            bucket = self._slot(int(epoch))
            if bucket is None:
                continue
            sel = rows[epochs == epoch]
            added += sel.size
            for f in NUMERIC_FEATURES:
                values = batch.numeric[f.name][sel]
                hist = histogram(values, f.edges)
                bucket.counts[f.name] += hist.counts
                self._sample(bucket, f.name, values[np.isfinite(values)])
            for name, counts in categorical_counts_of(batch, sel).items():
                bucket.cats[name] += counts
        return added

    def _sample(self, bucket: _Bucket, name: str, values: np.ndarray) -> None:
        """Algorithm R over this bucket's values, vectorised per batch."""
        k, seen, res = self.reservoir_per_bucket, bucket.seen[name], bucket.reservoir[name]
        take = min(max(k - seen, 0), values.size)
        res[seen:seen + take] = values[:take]
        rest = values[take:]
        if rest.size:
            positions = seen + take + np.arange(rest.size)  # 0-based index of each value in the stream
            slots = (self.rng.random(rest.size) * (positions + 1)).astype(np.int64)
            keep = slots < k
            res[slots[keep]] = rest[keep]
        bucket.seen[name] = seen + values.size

    def _live(self, now: float) -> list[_Bucket]:
        oldest = math.floor(now / self.width) - self.buckets + 1
        return [b for b in self.ring if b.epoch >= oldest]

    def histograms(self, now: float) -> dict[str, Histogram | CategoricalCounts]:
        live = self._live(now)
        out: dict[str, Histogram | CategoricalCounts] = {}
        for f in NUMERIC_FEATURES:
            counts = np.zeros(f.edges.bins, dtype=np.int64)
            for b in live:
                counts += b.counts[f.name]
            out[f.name] = Histogram(f.edges, counts)
        for f in CATEGORICAL_FEATURES:
            counts = np.zeros(len(f.categories) + 1, dtype=np.int64)
            for b in live:
                counts += b.cats[f.name]
            out[f.name] = CategoricalCounts(f.categories, counts)
        return out

    def samples(self, name: str, now: float) -> np.ndarray:
        parts = [b.reservoir[name][:min(b.seen[name], self.reservoir_per_bucket)] for b in self._live(now)]
        return np.concatenate(parts) if parts else np.empty(0)

    def records(self, now: float) -> int:
        return int(sum(b.cats["status_class"].sum() for b in self._live(now)))

    def nbytes(self) -> int:
        return sum(a.nbytes for b in self.ring for d in (b.counts, b.cats, b.reservoir) for a in d.values())


def categorical_counts_of(batch: Batch, rows: np.ndarray) -> dict[str, np.ndarray]:
    """finish_reason counts (unknown reasons in ``other``; null skipped) and status classes."""
    reasons = CATEGORICAL_FEATURES[0]
    index = {c: i for i, c in enumerate(reasons.categories)}
    codes = [index.get(batch.finish_reason[r], len(index)) for r in rows if batch.finish_reason[r] is not None]
    classes = _STATUS_BUCKET[batch.status[rows] // 100]  # 2xx, 4xx, 5xx; 1xx and 3xx in "other"
    return {
        reasons.name: np.bincount(np.array(codes, dtype=np.int64), minlength=len(index) + 1),
        "status_class": np.bincount(classes, minlength=4),
    }


_STATUS_BUCKET = np.array([3, 3, 0, 3, 1, 2])  # status // 100 -> index in ("2xx", "4xx", "5xx", other)


def baseline_from(batches: list[Batch], segment: Segment) -> dict[str, Histogram | CategoricalCounts]:
    """Freeze a reference from stored batches: every record of ``segment`` counts."""
    numeric = {f.name: np.zeros(f.edges.bins, dtype=np.int64) for f in NUMERIC_FEATURES}
    cats = {f.name: np.zeros(len(f.categories) + 1, dtype=np.int64) for f in CATEGORICAL_FEATURES}
    for b in batches:
        rows = segments_of(b).get(segment)
        if rows is None:
            continue
        for f in NUMERIC_FEATURES:
            numeric[f.name] += histogram(b.numeric[f.name][rows], f.edges).counts
        for name, counts in categorical_counts_of(b, rows).items():
            cats[name] += counts
    out: dict[str, Histogram | CategoricalCounts] = {f.name: Histogram(f.edges, numeric[f.name])
                                                      for f in NUMERIC_FEATURES}
    out.update({f.name: CategoricalCounts(f.categories, cats[f.name]) for f in CATEGORICAL_FEATURES})
    return out


def segments_of(batch: Batch) -> dict[Segment, np.ndarray]:
    groups: dict[Segment, list[int]] = {}
    for i, key in enumerate(zip(batch.model, batch.variant)):
        groups.setdefault(key, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in groups.items()}
