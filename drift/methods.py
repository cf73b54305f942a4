"""Drift methods: each declared once (name, kind, direction, default threshold), each a pure
function of a reference and a current window.

One direction convention for everything: ``direction`` says whether a *higher* or a
*lower* score means drift, and ``drifted`` is computed from it and the threshold, so a
caller never has to know that p-values run the other way.

Smoothing of empty bins (KL, PSI): a bin with zero probability in either window gets
probability ``EPSILON`` before both distributions are renormalised. Without it one empty
bin makes KL and PSI infinite; with it, a bin that appears only in the current window
contributes a large but finite term. This is the convention Evidently and most PSI
write-ups use (1e-4); it is applied identically to both windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
from scipy import stats

from drift.binning import CategoricalCounts, Histogram

EPSILON = 1e-4
Kind = Literal["distance", "p_value"]
Direction = Literal["higher_is_drift", "lower_is_drift"]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: Kind
    direction: Direction
    default_threshold: float
    applies_to: Literal["numeric", "categorical"]
    description: str


@dataclass(frozen=True)
class DriftResult:
    method: str
    kind: Kind
    direction: Direction
    score: float | None  # None when there is not enough data to say anything
    threshold: float
    drifted: bool
    status: Literal["ok", "insufficient_data"] = "ok"
    detail: str = ""


class InsufficientData(ValueError):
    """A window is empty (or has fewer values than the method needs)."""


def probabilities(counts: np.ndarray, smooth: bool) -> np.ndarray:
    total = counts.sum()
    if total <= 0:
        raise InsufficientData("empty window")
    p = counts / total
    if smooth:
        p = np.where(p == 0, EPSILON, p)
        p = p / p.sum()
    return p


def _pair(reference: np.ndarray, current: np.ndarray, smooth: bool) -> tuple[np.ndarray, np.ndarray]:
    return probabilities(reference, smooth), probabilities(current, smooth)


def kl_divergence(reference: np.ndarray, current: np.ndarray) -> float:
    """D_KL(current ‖ reference) in nats: information lost describing today's traffic with
    the reference distribution."""
    p_ref, p_cur = _pair(reference, current, smooth=True)
    return float(np.sum(p_cur * np.log(p_cur / p_ref)))


def js_distance(reference: np.ndarray, current: np.ndarray) -> float:
    """Jensen-Shannon distance (square root of the divergence), base 2: 0 identical, 1 disjoint."""
    p_ref, p_cur = _pair(reference, current, smooth=False)
    m = (p_ref + p_cur) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p_ref > 0, p_ref * np.log2(p_ref / m), 0.0)
        b = np.where(p_cur > 0, p_cur * np.log2(p_cur / m), 0.0)
    return float(math.sqrt(max(0.0, (a.sum() + b.sum()) / 2)))


def psi(reference: np.ndarray, current: np.ndarray) -> float:
    """Population stability index: sum((cur - ref) * ln(cur / ref)); 0.1 moderate, 0.25 major."""
    p_ref, p_cur = _pair(reference, current, smooth=True)
    return float(np.sum((p_cur - p_ref) * np.log(p_cur / p_ref)))


def wasserstein_binned(reference: Histogram, current: Histogram) -> float:
    """W1 between the windows with each bin's mass at its center (exact for the binned data)."""
    centers = reference.edges.centers
    p_ref, p_cur = _pair(reference.counts, current.counts, smooth=False)
    cdf_gap = np.abs(np.cumsum(p_ref) - np.cumsum(p_cur))[:-1]
    return float(np.sum(cdf_gap * np.diff(centers)))


def wasserstein_normed(reference: Histogram, current: Histogram) -> float:
    """W1 divided by the reference's standard deviation, so one threshold fits every feature.

    A constant reference (std 0) is normalised by its mean's magnitude instead, or not at all.
    """
    centers = reference.edges.centers
    p_ref = probabilities(reference.counts, smooth=False)
    mean = float(np.sum(p_ref * centers))
    std = math.sqrt(float(np.sum(p_ref * (centers - mean) ** 2)))
    scale = std if std > 0 else (abs(mean) or 1.0)
    return wasserstein_binned(reference, current) / scale


def ks_binned(reference: Histogram, current: Histogram) -> tuple[float, float]:
    """KS statistic from the binned CDFs and its asymptotic p-value.

    Binning can only hide differences inside a bin, so this statistic is a lower bound of
    the exact one; it is what fleet-wide drift from Prometheus buckets can compute.
    """
    n, m = reference.total, current.total
    if n == 0 or m == 0:
        raise InsufficientData("empty window")
    d = float(np.max(np.abs(np.cumsum(reference.counts) / n - np.cumsum(current.counts) / m)))
    return d, ks_p_value(d, n, m)


def ks_p_value(d: float, n: int, m: int) -> float:
    """Asymptotic two-sample KS p-value (Kolmogorov distribution, as scipy's 'asymp')."""
    en = n * m / (n + m)
    return float(stats.kstwo.sf(d, np.round(en)))


def ks_exact(reference: np.ndarray, current: np.ndarray) -> tuple[float, float]:
    """Two-sample KS on raw samples (audits; the reservoir's values)."""
    a, b = np.sort(_finite(reference)), np.sort(_finite(current))
    if a.size == 0 or b.size == 0:
        raise InsufficientData("empty window")
    grid = np.concatenate([a, b])
    d = float(np.max(np.abs(np.searchsorted(a, grid, side="right") / a.size
                            - np.searchsorted(b, grid, side="right") / b.size)))
    return d, ks_p_value(d, a.size, b.size)


def wasserstein_exact(reference: np.ndarray, current: np.ndarray) -> float:
    """W1 on raw samples: the area between the two empirical CDFs."""
    a, b = np.sort(_finite(reference)), np.sort(_finite(current))
    if a.size == 0 or b.size == 0:
        raise InsufficientData("empty window")
    grid = np.sort(np.concatenate([a, b]))
    widths = np.diff(grid)
    fa = np.searchsorted(a, grid[:-1], side="right") / a.size
    fb = np.searchsorted(b, grid[:-1], side="right") / b.size
    return float(np.sum(np.abs(fa - fb) * widths))


def chi_square(reference: CategoricalCounts, current: CategoricalCounts) -> tuple[float, float]:
    """Pearson chi-square of the current counts against the reference proportions.

    Expected counts use smoothed reference proportions, so a category never seen in the
    reference (which lands in ``other``) yields a large statistic instead of a division
    by zero.
    """
    if reference.categories != current.categories:
        raise ValueError("categorical counts must share their categories")
    n = current.total
    expected = probabilities(reference.counts, smooth=True) * n
    if n == 0:
        raise InsufficientData("empty window")
    statistic = float(np.sum((current.counts - expected) ** 2 / expected))
    return statistic, float(stats.chi2.sf(statistic, len(expected) - 1))


def _finite(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return v[np.isfinite(v)]


# -- the registry --------------------------------------------------------------------------
NumericFn = Callable[[Histogram, Histogram], float]

METHODS: dict[str, MethodSpec] = {s.name: s for s in (
    MethodSpec("kl", "distance", "higher_is_drift", 0.1, "numeric",
               "Kullback-Leibler divergence D(current‖reference), nats, smoothed"),
    MethodSpec("js", "distance", "higher_is_drift", 0.1, "numeric", "Jensen-Shannon distance, base 2"),
    MethodSpec("psi", "distance", "higher_is_drift", 0.1, "numeric", "population stability index, smoothed"),
    MethodSpec("wasserstein", "distance", "higher_is_drift", 0.1, "numeric",
               "Wasserstein-1 divided by the reference standard deviation"),
    MethodSpec("ks", "p_value", "lower_is_drift", 0.05, "numeric", "Kolmogorov-Smirnov p-value (binned CDFs)"),
    MethodSpec("chi2", "p_value", "lower_is_drift", 0.05, "categorical", "Pearson chi-square p-value"),
)}

_NUMERIC: dict[str, NumericFn] = {
    "kl": lambda r, c: kl_divergence(r.counts, c.counts),
    "js": lambda r, c: js_distance(r.counts, c.counts),
    "psi": lambda r, c: psi(r.counts, c.counts),
    "wasserstein": wasserstein_normed,
    "ks": lambda r, c: ks_binned(r, c)[1],
}


def verdict(spec: MethodSpec, score: float, threshold: float) -> bool:
    return score > threshold if spec.direction == "higher_is_drift" else score < threshold


def evaluate(method: str, reference: Histogram | CategoricalCounts, current: Histogram | CategoricalCounts,
             threshold: float | None = None) -> DriftResult:
    """Score one method on two windows; an empty window gives ``insufficient_data``, not NaN."""
    spec = METHODS.get(method)
    if spec is None:
        raise ValueError(f"unknown method '{method}'; known: {', '.join(METHODS)}")
    limit = spec.default_threshold if threshold is None else threshold
    try:
        if spec.applies_to == "categorical":
            if not isinstance(reference, CategoricalCounts):
                raise ValueError(f"{method} needs categorical counts")
            score = chi_square(reference, current)[1]  # type: ignore[arg-type]
        else:
            if not isinstance(reference, Histogram):
                raise ValueError(f"{method} needs a numeric histogram")
            score = _NUMERIC[method](reference, current)  # type: ignore[arg-type]
    except InsufficientData as exc:
        return DriftResult(method, spec.kind, spec.direction, None, limit, False, "insufficient_data", str(exc))
    return DriftResult(method, spec.kind, spec.direction, score, limit, verdict(spec, score, limit))
