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

from dataclasses import dataclass

import numpy as np

OTHER = "other"


@dataclass(frozen=True)
class Edges:
    """Bin boundaries ``e0 < e1 < ... < ek`` for k bins; ``log_spaced`` puts bin centers at
    geometric means."""

    values: np.ndarray
    log_spaced: bool = False

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
    return Edges(np.geomspace(low, high, bins + 1), log_spaced=True)


def linear_edges(low: float, high: float, bins: int) -> Edges:
    if not low < high or bins < 1:
        raise ValueError("linear edges need low < high and at least one bin")
    return Edges(np.linspace(low, high, bins + 1))


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

    def __add__(self, other: "Histogram") -> "Histogram":
        if not np.array_equal(self.edges.values, other.edges.values):
            raise ValueError("cannot add histograms with different edges")
        return Histogram(self.edges, self.counts + other.counts, self.nan + other.nan, self.inf + other.inf)


def bin_indices(values: np.ndarray, edges: Edges) -> np.ndarray:
    """Bin index per finite value, with Prometheus ``le`` semantics: bin i holds
    (e_i, e_{i+1}], so a value equal to an edge lands in the bin that edge closes, exactly as
    in a Prometheus histogram bucket. The outer bins are open-ended."""
    return np.clip(np.searchsorted(edges.values, values, side="left") - 1, 0, edges.bins - 1)


def histogram(values: np.ndarray, edges: Edges) -> Histogram:
    v = np.asarray(values, dtype=float)
    finite = np.isfinite(v)
    n_finite = int(finite.sum())
    nan = int(np.isnan(v).sum())
    inf = v.size - n_finite - nan
    if n_finite != v.size:
        v = v[finite]
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
