"""Sliding windows kept as time-bucketed histograms, per (model, variant) segment.

A window of length W is split into B time buckets of W/B seconds. Adding a record
increments one bin of one bucket; reading the window sums the live buckets, so the window
covers between W - W/B and W seconds of history. A bucket exists only once a record lands
in it and is dropped when it slides out, so a segment costs what it holds: one quiet
bucket is a few kilobytes, a busy window at most B of them, whatever the traffic.

Raw values for exact tests are sampled per *window*, not per bucket: every value gets a
random key, and the window's sample is the R values with the smallest keys among its live
buckets (a bottom-R sample, uniform over the window). A burst in one bucket is therefore
tested on R values, not R/B. Each bucket keeps only the values that could still be among
the R smallest after older buckets slide out: walking from the newest bucket back, a value
whose key is beyond the R-th smallest of its own and all newer buckets can never be
chosen again. That keeps about R * ln(B) values per feature for steady traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from inferwatch.drift.binning import CategoricalCounts, Histogram, histogram
from inferwatch.drift.schema import CATEGORICAL_FEATURES, NUMERIC_FEATURES, Batch

Segment = tuple[str, str]  # (model, variant)

# one flat count array per bucket: numeric bins, then categorical counts
_SLICES: dict[str, slice] = {}
_at = 0
for _f in NUMERIC_FEATURES:
    _SLICES[_f.name] = slice(_at, _at + _f.edges.bins)
    _at += _f.edges.bins
for _c in CATEGORICAL_FEATURES:
    _SLICES[_c.name] = slice(_at, _at + len(_c.categories) + 1)
    _at += len(_c.categories) + 1
WIDTH = _at
_EMPTY = np.empty(0)


@dataclass
class _Bucket:
    epoch: int  # floor(t / width)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(WIDTH, dtype=np.int64))
    keys: dict[str, np.ndarray] = field(default_factory=dict)  # feature -> random keys of kept values
    values: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class SegmentWindow:
    window_s: float
    buckets: int
    reservoir: int  # raw values per numeric feature per window
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __post_init__(self) -> None:
        self.width = self.window_s / self.buckets
        self.live: dict[int, _Bucket] = {}  # epoch -> bucket, only those holding data
        self.version = 0  # bumped on every change: result caches key on it

    def oldest(self, now: float) -> int:
        return math.floor(now / self.width) - self.buckets + 1

    def expire(self, now: float) -> None:
        oldest = self.oldest(now)
        for epoch in [e for e in self.live if e < oldest]:
            del self.live[epoch]
            self.version += 1

    def add(self, batch: Batch, rows: np.ndarray, now: float) -> int:
        """Count ``rows`` of ``batch``; returns how many fell inside the window."""
        self.expire(now)
        epochs = np.floor(batch.finished_at[rows] / self.width).astype(np.int64)
        oldest = self.oldest(now)
        added, opened = 0, False
        for epoch in np.unique(epochs):
            if epoch < oldest:
                continue
            bucket = self.live.get(int(epoch))
            if bucket is None:
                bucket = self.live[int(epoch)] = _Bucket(int(epoch))
                opened = True
            sel = rows[epochs == epoch]
            added += sel.size
            for f in NUMERIC_FEATURES:
                values = batch.numeric[f.name][sel]
                bucket.counts[_SLICES[f.name]] += histogram(values, f.edges).counts
                self._sample(bucket, f.name, values[np.isfinite(values)])
            for name, counts in categorical_counts_of(batch, sel).items():
                bucket.counts[_SLICES[name]] += counts
        if added:
            self.version += 1
        if opened:  # a new bucket is when older ones can lose most; each bucket alone stays <= R
            self._prune()
        return added

    def _sample(self, bucket: _Bucket, name: str, values: np.ndarray) -> None:
        if values.size == 0:
            return
        keys = np.concatenate([bucket.keys.get(name, _EMPTY), self.rng.random(values.size)])
        vals = np.concatenate([bucket.values.get(name, _EMPTY), values])
        if keys.size > self.reservoir:
            keep = np.argpartition(keys, self.reservoir - 1)[:self.reservoir] if self.reservoir else keys[:0]
            keys, vals = keys[keep], vals[keep]
        bucket.keys[name], bucket.values[name] = keys, vals

    def _prune(self) -> None:
        """Drop values that can no longer be among the window's R smallest keys (see module doc)."""
        r = self.reservoir
        for f in NUMERIC_FEATURES:
            smallest = _EMPTY
            for epoch in sorted(self.live, reverse=True):
                bucket = self.live[epoch]
                keys = bucket.keys.get(f.name)
                if keys is None:
                    continue
                if smallest.size >= r and keys.size:
                    bound = smallest[r - 1] if r else -1.0
                    keep = keys <= bound
                    if not keep.all():
                        bucket.keys[f.name], bucket.values[f.name] = keys[keep], bucket.values[f.name][keep]
                        keys = bucket.keys[f.name]
                smallest = np.sort(np.concatenate([smallest, keys]))[:r]

    def _current(self, now: float) -> list[_Bucket]:
        oldest = self.oldest(now)
        return [b for e, b in self.live.items() if e >= oldest]

    def counts(self, now: float) -> np.ndarray:
        total = np.zeros(WIDTH, dtype=np.int64)
        for b in self._current(now):
            total += b.counts
        return total

    def histograms(self, now: float) -> dict[str, Histogram | CategoricalCounts]:
        return split_counts(self.counts(now))

    def samples(self, name: str, now: float) -> np.ndarray:
        """A uniform sample of at most R of the window's finite values of ``name``."""
        live = [b for b in self._current(now) if name in b.keys]
        if not live:
            return np.empty(0)
        keys = np.concatenate([b.keys[name] for b in live])
        values = np.concatenate([b.values[name] for b in live])
        if keys.size > self.reservoir:
            values = values[np.argpartition(keys, self.reservoir - 1)[:self.reservoir]]
        return values

    def records(self, now: float) -> int:
        return int(sum(b.counts[_SLICES["status_class"]].sum() for b in self._current(now)))

    def nbytes(self) -> int:
        return sum(b.counts.nbytes + sum(a.nbytes for d in (b.keys, b.values) for a in d.values())
                   for b in self.live.values())


def split_counts(flat: np.ndarray) -> dict[str, Histogram | CategoricalCounts]:
    """A flat count array (one bucket's layout) as one histogram per feature."""
    out: dict[str, Histogram | CategoricalCounts] = {}
    for f in NUMERIC_FEATURES:
        out[f.name] = Histogram(f.edges, flat[_SLICES[f.name]].copy())
    for c in CATEGORICAL_FEATURES:
        out[c.name] = CategoricalCounts(c.categories, flat[_SLICES[c.name]].copy())
    return out


def categorical_counts_of(batch: Batch, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Counts per category (unknown values in ``other``; null skipped); status classes from
    the status."""
    out = {}
    for c in CATEGORICAL_FEATURES:
        if c.name == "status_class":
            out[c.name] = np.bincount(_STATUS_BUCKET[batch.status[rows] // 100], minlength=4)  # 1xx, 3xx: other
            continue
        column = batch.finish_reason if c.name == "finish_reason" else batch.categorical[c.name]
        index = _INDEX[c.name]
        codes = [index.get(column[r], len(index)) for r in rows if column[r] is not None]
        out[c.name] = np.bincount(np.array(codes, dtype=np.int64), minlength=len(index) + 1)
    return out


_INDEX = {c.name: {v: i for i, v in enumerate(c.categories)} for c in CATEGORICAL_FEATURES}


_STATUS_BUCKET = np.array([3, 3, 0, 3, 1, 2])  # status // 100 -> index in ("2xx", "4xx", "5xx", other)


def baseline_from(batches: list[Batch], segment: Segment) -> dict[str, Histogram | CategoricalCounts]:
    """Freeze a reference from stored batches: every record of ``segment`` counts."""
    flat = np.zeros(WIDTH, dtype=np.int64)
    for b in batches:
        rows = segments_of(b).get(segment)
        if rows is None:
            continue
        for f in NUMERIC_FEATURES:
            flat[_SLICES[f.name]] += histogram(b.numeric[f.name][rows], f.edges).counts
        for name, counts in categorical_counts_of(b, rows).items():
            flat[_SLICES[name]] += counts
    return split_counts(flat)


def segments_of(batch: Batch) -> dict[Segment, np.ndarray]:
    groups: dict[Segment, list[int]] = {}
    for i, key in enumerate(zip(batch.model, batch.variant)):
        groups.setdefault(key, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in groups.items()}
