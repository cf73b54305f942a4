"""Binned distributions: the one representation every drift method works on.

Numeric features are counted into bins with explicit edges, upper edge inclusive like a
Prometheus bucket. The first and last bins are open-ended (everything up to the second
edge, everything above the last-but-one edge),
so a value outside the reference range is still counted instead of dropped. NaN and
infinities are never binned: they are counted apart, so a feature that starts producing
NaN is visible instead of silently shrinking the window.

Categorical features are counted per known category plus one ``other`` bucket, so the set
of series stays bounded whatever values appear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OTHER = "other"


@dataclass(frozen=True)
class Edges:
    """Bin boundaries ``e0 < e1 < ... < ek`` for k bins; ``log_spaced`` puts bin centers at
    geometric means."""

    values: np.ndarray
    log_spaced: bool = False
    uniform: bool = False  # equal steps (in log space when log_spaced): arithmetic binning applies

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=float)
        if v.ndim != 1 or len(v) < 2:
            raise ValueError("edges need at least two values")
        if not np.all(np.isfinite(v)) or not np.all(np.diff(v) > 0):
            raise ValueError("edges must be finite and strictly increasing")
        object.__setattr__(self, "values", v)

    @property
    def bins(self) -> int:
        return len(self.values) - 1

    @property
    def centers(self) -> np.ndarray:
        v = self.values
        return np.sqrt(v[:-1] * v[1:]) if self.log_spaced else (v[:-1] + v[1:]) / 2


def log_edges(low: float, high: float, bins: int) -> Edges:
    """Log-spaced edges for positive, heavy-tailed features (token counts, latencies)."""
    if not 0 < low < high:
        raise ValueError("log edges need 0 < low < high")
    if bins < 1:
        raise ValueError("need at least one bin")
    return Edges(np.geomspace(low, high, bins + 1), log_spaced=True, uniform=True)


def linear_edges(low: float, high: float, bins: int) -> Edges:
    if not low < high or bins < 1:
        raise ValueError("linear edges need low < high and at least one bin")
    return Edges(np.linspace(low, high, bins + 1), uniform=True)


def quantile_edges(reference: np.ndarray, bins: int) -> Edges:
    """Edges at the reference's quantiles, so each bin holds about the same reference mass.

    Repeated quantiles (a feature with few distinct values) are merged, so the result may
    have fewer bins than asked for.
    """
    ref = np.asarray(reference, dtype=float)
    ref = ref[np.isfinite(ref)]
    if ref.size < 2:
        raise ValueError("quantile edges need at least two finite reference values")
    edges = np.unique(np.quantile(ref, np.linspace(0, 1, bins + 1)))
    if edges.size < 2:  # all reference values equal: one bin around the value
        v = edges[0]
        width = abs(v) * 1e-9 or 1e-9
        edges = np.array([v - width, v + width])
    return Edges(edges)


@dataclass(frozen=True)
class Histogram:
    """Counts per bin for one window, plus the values that could not be binned."""

    edges: Edges
    counts: np.ndarray  # int64, len == edges.bins
    nan: int = 0
    inf: int = 0

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def __add__(self, other: Histogram) -> Histogram:
        if not np.array_equal(self.edges.values, other.edges.values):
            raise ValueError("cannot add histograms with different edges")
        return Histogram(self.edges, self.counts + other.counts, self.nan + other.nan, self.inf + other.inf)


CHUNK = 1 << 15  # values per step of the arithmetic path: scratch buffers stay in L2 cache


def bin_indices(values: np.ndarray, edges: Edges) -> np.ndarray:
    """Bin index per finite value, with Prometheus ``le`` semantics: bin i holds
    (e_i, e_{i+1}], so a value equal to an edge lands in the bin that edge closes, exactly as
    in a Prometheus histogram bucket. The outer bins are open-ended.

    Log- and linearly spaced edges take an arithmetic path (index from the value's position
    in bin units, in cache-sized chunks: several times faster than a binary search over a
    million values); the few values that float rounding puts within 1e-9 bins of an edge
    are re-binned by search, so the result is identical to the search everywhere.
    """
    values = np.asarray(values, dtype=float)
    if not edges.uniform:
        return np.searchsorted(edges.values[1:-1], values, side="left")
    out = np.empty(values.size, dtype=np.int64)
    binner = _ArithmeticBinner(edges, values.size)
    for start in range(0, values.size, CHUNK):
        chunk = values[start:start + CHUNK]
        out[start:start + chunk.size] = binner.indices(chunk)
    return out


class _ArithmeticBinner:
    """Index = ceil(position in bin units) - 1, on reusable scratch buffers."""

    def __init__(self, edges: Edges, size: int = CHUNK) -> None:
        e = edges.values
        self.edges = edges
        self.inner = e[1:-1]
        self.first = e[0]
        self.log = edges.log_spaced
        low, high = (math.log(e[0]), math.log(e[-1])) if self.log else (e[0], e[-1])
        self.offset, self.scale = low, edges.bins / (high - low)
        size = max(1, min(size, CHUNK))  # small batches: small buffers
        self.pos = np.empty(size)
        self.gap = np.empty(size)
        self.near = np.empty(size, dtype=bool)
        self.idx = np.empty(size, dtype=np.int64)

    def indices(self, chunk: np.ndarray) -> np.ndarray:
        n = chunk.size
        pos, gap, near, idx = self.pos[:n], self.gap[:n], self.near[:n], self.idx[:n]
        np.maximum(chunk, self.first, out=pos)  # at or below the first edge: bin 0 anyway
        if self.log:
            np.log(pos, out=pos)
        pos -= self.offset
        pos *= self.scale
        np.rint(pos, out=gap)
        gap -= pos
        np.abs(gap, out=gap)
        np.less(gap, 1e-9, out=near)
        np.ceil(pos, out=pos)
        pos -= 1
        np.clip(pos, 0, self.edges.bins - 1, out=pos)
        idx[:] = pos
        if near.any():
            fix = np.flatnonzero(near)
            idx[fix] = np.searchsorted(self.inner, chunk[fix], side="left")
        return idx


def histogram(values: np.ndarray, edges: Edges) -> Histogram:
    v = np.asarray(values, dtype=float)
    nan = inf = 0
    if not math.isfinite(float(v.sum())):  # one cheap pass; only then look for NaN/inf
        finite = np.isfinite(v)
        nan = int(np.isnan(v).sum())
        inf = v.size - int(finite.sum()) - nan
        v = v[finite]
    if edges.uniform:  # count chunk by chunk: no million-entry index array is ever built
        counts = np.zeros(edges.bins, dtype=np.int64)
        binner = _ArithmeticBinner(edges, v.size)
        for start in range(0, v.size, CHUNK):
            counts += np.bincount(binner.indices(v[start:start + CHUNK]), minlength=edges.bins)
    else:
        counts = np.bincount(bin_indices(v, edges), minlength=edges.bins).astype(np.int64)
    return Histogram(edges, counts, nan, inf)


@dataclass(frozen=True)
class CategoricalCounts:
    categories: tuple[str, ...]  # known categories; the last bucket is OTHER
    counts: np.ndarray  # len == len(categories) + 1

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def labels(self) -> tuple[str, ...]:
        return self.categories + (OTHER,)


def categorical_counts(values: list[str] | np.ndarray, categories: tuple[str, ...]) -> CategoricalCounts:
    """Counts per known category; anything unseen goes to ``other``."""
    if OTHER in categories:
        raise ValueError(f"'{OTHER}' is reserved for unseen categories")
    index = {c: i for i, c in enumerate(categories)}
    other = len(categories)
    codes = np.fromiter((index.get(v, other) for v in values), dtype=np.int64, count=len(values))
    return CategoricalCounts(tuple(categories), np.bincount(codes, minlength=other + 1).astype(np.int64))


def merged_bins(total: int, most: int = 20) -> int:
    """How many bins a reference of ``total`` values is cut into: about ten values per bin
    at least, at most ``most``."""
    return min(most, max(2, total // 10))


def quantile_starts(counts: np.ndarray, bins: int) -> np.ndarray:
    """Where to merge fine bins into about ``bins`` bins of equal mass: the index of the
    first fine bin of each merged bin (for ``np.add.reduceat``).

    Cuts fall where the cumulative mass crosses j / bins, so every merged bin holds
    reference mass (a trailing bin that would be empty is folded into its neighbour: a
    window's values just beyond a small reference's largest are sampling noise the
    calibration could not see): resolution goes where the reference has data. Only a
    reference whose mass sits in a single fine bin gets empty bins on either side, since
    one bin could not show anything.
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total <= 0 or bins <= 1:
        return np.zeros(1, dtype=np.int64)
    cum = np.cumsum(counts)
    cuts = np.searchsorted(cum, total * np.arange(1, bins) / bins, side="left") + 1
    cuts = np.unique(cuts[(cuts > 0) & (cuts < counts.size)])
    if cuts.size and cum[cuts[-1] - 1] == total:  # nothing after the last cut
        cuts = cuts[:-1]
    if cuts.size == 0:  # all reference mass in one fine bin: values on either side get bins of their own
        held = np.flatnonzero(counts)
        cuts = np.array([c for c in (held[0], held[-1] + 1) if 0 < c < counts.size], dtype=np.int64)
    return np.concatenate([[0], cuts]).astype(np.int64)


def merged_edges(edges: Edges, starts: np.ndarray) -> Edges:
    """The edges of the bins that ``starts`` merges ``edges``' bins into."""
    idx = np.concatenate([np.asarray(starts, dtype=np.int64), [edges.bins]])
    return Edges(edges.values[idx], log_spaced=edges.log_spaced)


def merge(h: Histogram, starts: np.ndarray, edges: Edges) -> Histogram:
    """``h`` counted on the merged bins (``edges`` from ``merged_edges``)."""
    return Histogram(edges, np.add.reduceat(h.counts, starts).astype(np.int64), h.nan, h.inf)
