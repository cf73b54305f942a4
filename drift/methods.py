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
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special, stats

from inferwatch.drift.binning import CategoricalCounts, Histogram

EPSILON = 1e-4
Kind = Literal["distance", "p_value"]
Direction = Literal["higher_is_drift", "lower_is_drift"]
# "calibrated": from the baseline's own null distribution at the window's size (distances);
# "alpha": a p-value compared with alpha itself; "fixed": a number an operator chose.
ThresholdSource = Literal["calibrated", "alpha", "fixed"]


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
    status: Literal["ok", "insufficient_data", "calibrating"] = "ok"
    detail: str = ""
    source: ThresholdSource = "fixed"  # where the threshold came from
    p_value: float | None = None  # calibrated: the bootstrap p-value of the score
    calibration_n: int | None = None  # calibrated: the window size the threshold was drawn at


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


@dataclass(frozen=True)
class Prepared:
    """Everything the binned methods need from a (reference, current) pair, computed once.

    Scoring all methods on one pair then costs a few small-array operations each.
    """

    n_ref: int
    n_cur: int
    p_ref: np.ndarray
    p_cur: np.ndarray
    s_ref: np.ndarray  # smoothed
    s_cur: np.ndarray
    log_ratio: np.ndarray  # ln(s_cur / s_ref)
    cdf_gap: np.ndarray  # |F_ref - F_cur| at the upper edge of each bin
    w1: float  # W1 in the feature's unit, on the fine bins
    w_scale: float  # the reference's standard deviation on the fine bins (see w1_normed)


def prepare(reference: Histogram, current: Histogram, fine: tuple[Histogram, Histogram] | None = None) -> Prepared:
    """``fine``: the same two windows on the feature's fine grid, where Wasserstein is
    computed (see ``w1_normed``); without it, on ``reference`` and ``current`` themselves."""
    if not np.array_equal(reference.edges.values, current.edges.values):
        raise ValueError("reference and current must share their bin edges")
    p_ref, p_cur = probabilities(reference.counts, False), probabilities(current.counts, False)
    s_ref, s_cur = probabilities(reference.counts, True), probabilities(current.counts, True)
    f_ref, f_cur = fine or (reference, current)
    if not np.array_equal(f_ref.edges.values, f_cur.edges.values):
        raise ValueError("fine reference and current must share their bin edges")
    w1, scale = w1_normed(probabilities(f_ref.counts, False), probabilities(f_cur.counts, False), f_ref.edges.centers)
    return Prepared(reference.total, current.total, p_ref, p_cur, s_ref, s_cur, np.log(s_cur / s_ref),
                    np.abs(np.cumsum(p_ref) - np.cumsum(p_cur)), float(w1), float(scale))


def w1_normed(p_ref: np.ndarray, p_cur: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W1 between binned distributions (each bin's mass at its center) and the reference's
    standard deviation, for one pair (1-d proportions) or many (rows). The one formula the
    service and the calibration draws share.

    Computed on the fine grid (four bins per doubling), not on the ~20 merged quantile bins:
    the merged outer bins are open-ended, and their centers (TTFT: the geometric middle of
    0.5 s and 64 s) made the standard deviation several times too large and hid any change
    inside the top or bottom 5 %. On the fine grid both are within a few percent of the raw
    values' (the exact endpoint's). A constant reference (std 0) is normalised by its
    mean's magnitude instead, or not at all.
    """
    centers = np.broadcast_to(np.asarray(centers, dtype=float), np.shape(p_ref))
    gap = np.abs(np.cumsum(p_ref, axis=-1) - np.cumsum(p_cur, axis=-1))
    w1 = np.sum(gap[..., :-1] * np.diff(centers, axis=-1), axis=-1)
    mean = np.sum(p_ref * centers, axis=-1)
    std = np.sqrt(np.sum(p_ref * (centers - np.expand_dims(mean, -1)) ** 2, axis=-1))
    return w1, np.where(std > 0, std, np.where(mean != 0, np.abs(mean), 1.0))


def kl_divergence(pp: Prepared) -> float:
    """D_KL(current ‖ reference) in nats: information lost describing today's traffic with
    the reference distribution. Smoothed (see module docstring)."""
    return float(pp.s_cur @ pp.log_ratio)


def js_distance(pp: Prepared) -> float:
    """Jensen-Shannon distance (square root of the divergence), base 2: 0 identical, 1 disjoint."""
    m = (pp.p_ref + pp.p_cur) * 0.5
    nats = special.rel_entr(pp.p_ref, m).sum() + special.rel_entr(pp.p_cur, m).sum()  # 0 log 0 = 0
    return math.sqrt(max(0.0, float(nats) / (2 * math.log(2))))


def psi(pp: Prepared) -> float:
    """Population stability index: sum((cur - ref) * ln(cur / ref)); 0.1 moderate, 0.25 major."""
    return float((pp.s_cur - pp.s_ref) @ pp.log_ratio)


def wasserstein_binned(pp: Prepared) -> float:
    """W1 between the windows with each fine bin's mass at its center (exact for the binned data)."""
    return pp.w1


def wasserstein_normed(pp: Prepared) -> float:
    """W1 divided by the reference's standard deviation, so one threshold fits every feature
    (``w1_normed``): the same quantity as /v1/drift/exact's ``wasserstein``."""
    return pp.w1 / pp.w_scale


def ks_binned(pp: Prepared) -> tuple[float, float]:
    """KS statistic from the binned CDFs and its p-value.

    Binning can only hide differences inside a bin, so this statistic is a lower bound of
    the exact one; it is what fleet-wide drift from Prometheus buckets can compute.
    """
    d = float(pp.cdf_gap.max())
    return d, ks_p_value(d, pp.n_ref, pp.n_cur)


def ks_p_value(d: float, n: int, m: int) -> float:
    """Two-sample KS p-value: the Kolmogorov distribution with Stephens' small-sample
    correction, Q((sqrt(en) + 0.12 + 0.11 / sqrt(en)) * d), en = nm / (n + m).

    Within a few percent of scipy's ``kstwo`` (what ks_2samp's 'asymp' mode uses) but ~1 µs
    instead of up to tens of milliseconds for windows of 10^4+ values.
    """
    en = math.sqrt(n * m / (n + m))
    return float(special.kolmogorov((en + 0.12 + 0.11 / en) * d))


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


MIN_EXPECTED = 5.0  # the textbook validity rule of the chi-square approximation (Cochran)
EXACT_DRAWS = 1999  # Monte-Carlo draws of a sparse table: p-values resolve down to 1/2000


def chi_square(reference: CategoricalCounts, current: CategoricalCounts,
               draws: int = EXACT_DRAWS) -> tuple[float, float]:
    """Pearson chi-square test of homogeneity on the 2 x k table (reference, current).

    Two-sample: the reference proportions are estimated from a sample too, so both rows
    carry sampling error (a one-sample goodness-of-fit test against the reference
    proportions fires about three times as often as its alpha at equal sizes). Categories
    empty in both windows are left out; with fewer than two left there is nothing to test
    (p = 1). Where every cell expects at least ``MIN_EXPECTED`` records the p-value is the
    asymptotic one, equal to scipy's ``chi2_contingency(table, correction=False)``. Where a
    cell expects fewer (a rare status class in a small window) the chi-square distribution
    is not the statistic's: it fired at three to four times alpha. There the p-value is
    Monte-Carlo, conditional on the table's margins (``sparse_p_value``).
    """
    if reference.categories != current.categories:
        raise ValueError("categorical counts must share their categories")
    if current.total == 0 or reference.total == 0:
        raise InsufficientData("empty window")
    table = np.vstack([reference.counts, current.counts]).astype(np.int64)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 0.0, 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    if expected.min() >= MIN_EXPECTED:
        return statistic, float(stats.chi2.sf(statistic, table.shape[1] - 1))
    return statistic, sparse_p_value(table, expected, statistic, draws)


def sparse_p_value(table: np.ndarray, expected: np.ndarray, statistic: float, draws: int) -> float:
    """The share of tables with the same margins whose statistic is at least the observed
    one: under homogeneity the current row given the column totals is multivariate
    hypergeometric, so the draws are exact (the conditional test R's ``chisq.test`` runs
    with ``simulate.p.value``). ``(1 + #{>=}) / (draws + 1)`` is never 0 and holds the
    level; margins fixed means ``expected`` is the same for every draw. Seeded by the table,
    so the same data always gets the same p-value."""
    rng = np.random.default_rng(zlib.crc32(table.tobytes()))
    current = rng.multivariate_hypergeometric(table.sum(axis=0), int(table[1].sum()), size=draws)
    reference = table.sum(axis=0) - current
    simulated = ((reference - expected[0]) ** 2 / expected[0] + (current - expected[1]) ** 2 / expected[1]).sum(axis=1)
    at_least = int(np.count_nonzero(simulated >= statistic * (1 - 1e-9)))  # ties: equal tables, equal statistic
    return (1 + at_least) / (draws + 1)


def _finite(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return v[np.isfinite(v)]


# -- the registry --------------------------------------------------------------------------

METHODS: dict[str, MethodSpec] = {s.name: s for s in (
    MethodSpec("kl", "distance", "higher_is_drift", 0.1, "numeric",
               "Kullback-Leibler divergence D(current‖reference), nats, smoothed"),
    MethodSpec("js", "distance", "higher_is_drift", 0.1, "numeric", "Jensen-Shannon distance, base 2"),
    MethodSpec("psi", "distance", "higher_is_drift", 0.1, "numeric", "population stability index, smoothed"),
    MethodSpec("wasserstein", "distance", "higher_is_drift", 0.1, "numeric",
               "Wasserstein-1 divided by the reference standard deviation"),
    MethodSpec("ks", "p_value", "lower_is_drift", 0.05, "numeric", "Kolmogorov-Smirnov p-value (binned CDFs)"),
    MethodSpec("chi2", "p_value", "lower_is_drift", 0.05, "categorical",
               "Pearson chi-square p-value, two-sample (test of homogeneity)"),
)}

_NUMERIC: dict[str, Callable[[Prepared], float]] = {
    "kl": kl_divergence,
    "js": js_distance,
    "psi": psi,
    "wasserstein": wasserstein_normed,
    "ks": lambda pp: ks_binned(pp)[1],
}


def verdict(spec: MethodSpec, score: float, threshold: float) -> bool:
    return score > threshold if spec.direction == "higher_is_drift" else score < threshold


def evaluate(method: str, reference: Histogram | CategoricalCounts, current: Histogram | CategoricalCounts,
             threshold: float | None = None, prepared: Prepared | None = None) -> DriftResult:
    """Score one method on two windows; an empty window gives ``insufficient_data``, not NaN.

    Pass ``prepared`` (from ``prepare``) when scoring several methods on the same pair.
    """
    spec = METHODS.get(method)
    if spec is None:
        raise ValueError(f"unknown method '{method}'; known: {', '.join(METHODS)}")
    limit = spec.default_threshold if threshold is None else threshold
    try:
        if spec.applies_to == "categorical":
            if not isinstance(reference, CategoricalCounts) or not isinstance(current, CategoricalCounts):
                raise ValueError(f"{method} needs categorical counts")
            score = chi_square(reference, current)[1]
        else:
            if not isinstance(reference, Histogram) or not isinstance(current, Histogram):
                raise ValueError(f"{method} needs numeric histograms")
            score = _NUMERIC[method](prepared or prepare(reference, current))
    except InsufficientData as exc:
        return DriftResult(method, spec.kind, spec.direction, None, limit, False, "insufficient_data", str(exc))
    return DriftResult(method, spec.kind, spec.direction, score, limit, verdict(spec, score, limit))
