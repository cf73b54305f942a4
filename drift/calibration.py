"""Thresholds derived from the baseline itself, so one false-alarm rate holds at every
window size.

A fixed threshold (PSI 0.1, say) means a different false-alarm rate at every window size:
two samples of 200 records from one distribution differ by more than two samples of
200,000 do. Here the threshold for a (baseline feature, window size n) pair is the
(1 - alpha) quantile of the statistic under "no drift", estimated by a parametric
bootstrap on the baseline's bins that carries the baseline's own sampling error (see
``null_distribution``): the baseline is itself a sample, and treating its proportions as
exact is what made one-sample tests fire at three times their alpha. The draws are scored
with the same formulas as the service.

The same draws give every method a p-value, ``(1 + #{null >= observed}) / (B + 1)``, and
the null distribution of the smallest p-value over a feature's methods, so "this feature
drifted" (any of its methods) has a p-value too (a min-p test, Westfall and Young's
single-step form). Across features, Holm's step-down procedure keeps the per-segment
false-alarm rate at alpha under any dependence between features.

Window sizes are grouped in bands (eight per doubling) and calibrated at the band's lower
end: a window a little larger than the size it was calibrated for has a slightly tighter
null, so the rate can only fall below alpha (by a few percent of it), never rise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from inferwatch.drift.binning import Edges
from inferwatch.drift.methods import EPSILON, w1_normed

# The statistics computed per draw, in this order; "ks" is the KS distance D (its p-value
# comes from the draws, not from the Kolmogorov distribution, which binning makes conservative).
STATISTICS = ("kl", "js", "psi", "wasserstein", "ks")
RESAMPLES = 1999  # alpha * (B + 1) is a whole number for alpha = 0.05, 0.01, 0.005, 0.001
BANDS_PER_DOUBLING = 8


def size_band(n: int) -> int:
    """The lower end of n's size band: calibration at this size serves every window in the band."""
    if n < 2 * BANDS_PER_DOUBLING:
        return n
    step = math.floor(math.log2(n) * BANDS_PER_DOUBLING)
    return max(2 * BANDS_PER_DOUBLING, min(n, math.ceil(2 ** (step / BANDS_PER_DOUBLING))))


def next_band(band: int) -> int:
    """The size band above ``band``: where a growing window goes next, so it can be
    calibrated before the window gets there."""
    n = band + 1
    if band >= 2 * BANDS_PER_DOUBLING:  # start near the next step; the loop settles rounding
        n = max(n, math.ceil(2 ** ((math.floor(math.log2(band) * BANDS_PER_DOUBLING) + 1) / BANDS_PER_DOUBLING)) - 1)
    while size_band(n) <= band:
        n += 1
    return size_band(n)


def _smoothed(p: np.ndarray) -> np.ndarray:
    s = np.where(p == 0, EPSILON, p)
    return s / s.sum(axis=-1, keepdims=True)


def statistics(ref: np.ndarray, cur: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Every statistic for many (reference, current) count pairs at once.

    ``ref`` and ``cur``: (draws, bins) counts; ``centers``: (bins,) or (draws, bins).
    Returns (len(STATISTICS), draws). Each row is
    the formula of the matching function in ``drift.methods`` (kl_divergence, js_distance,
    psi, wasserstein_normed, the D of ks_binned), vectorised; the tests hold them equal.
    """
    ref, cur = np.atleast_2d(ref).astype(float), np.atleast_2d(cur).astype(float)
    p_ref = ref / ref.sum(axis=1, keepdims=True)
    p_cur = cur / cur.sum(axis=1, keepdims=True)
    s_ref, s_cur = _smoothed(p_ref), _smoothed(p_cur)
    log_ratio = np.log(s_cur / s_ref)
    kl = np.sum(s_cur * log_ratio, axis=1)
    psi = np.sum((s_cur - s_ref) * log_ratio, axis=1)
    m = (p_ref + p_cur) * 0.5
    js_nats = special.rel_entr(p_ref, m).sum(axis=1) + special.rel_entr(p_cur, m).sum(axis=1)
    js = np.sqrt(np.maximum(0.0, js_nats / (2 * math.log(2))))
    gap = np.abs(np.cumsum(p_ref, axis=1) - np.cumsum(p_cur, axis=1))
    w1, scale = w1_normed(p_ref, p_cur, centers)
    return np.vstack([kl, js, psi, w1 / scale, gap.max(axis=1)])


@dataclass(frozen=True)
class NullDistribution:
    """What "no drift" looks like for one baseline feature at one window size."""

    n_ref: int
    n_cur: int  # the window size the draws were made at (a size band's lower end)
    sorted_stats: np.ndarray  # (len(STATISTICS), B), each row ascending
    sorted_min_p: np.ndarray  # (B,) ascending: per draw, the smallest p-value over the methods

    @property
    def resamples(self) -> int:
        return self.sorted_stats.shape[1]

    def p_value(self, method: str, observed: float) -> float:
        """(1 + #{null >= observed}) / (B + 1): never 0, exact in level for exchangeable draws."""
        row = self.sorted_stats[STATISTICS.index(method)]
        above = row.size - int(np.searchsorted(row, observed, side="left"))
        return (1 + above) / (row.size + 1)

    def threshold(self, method: str, alpha: float) -> float:
        """The score above which ``p_value <= alpha``; +inf when B draws cannot resolve alpha."""
        row = self.sorted_stats[STATISTICS.index(method)]
        k = math.floor(alpha * (row.size + 1) + 1e-9) - 1  # how many draws may lie at or above
        return float(row[row.size - 1 - k]) if k >= 0 else math.inf

    def feature_p_value(self, smallest_p: float) -> float:
        """p-value of "some method flags this feature", from the null of the smallest p-value."""
        at_or_below = int(np.searchsorted(self.sorted_min_p, smallest_p, side="right"))
        return (1 + at_or_below) / (self.sorted_min_p.size + 1)


def null_distribution(fine_counts: np.ndarray, edges: Edges, n_cur: int, bins: int | None,
                      resamples: int = RESAMPLES, seed: int = 0) -> NullDistribution:
    """The statistics between a baseline and a window of ``n_cur`` records when nothing
    drifted, by simulating the whole procedure from the baseline's fine-grid proportions:
    draw a baseline of its size and a window of ``n_cur``, cut the baseline's bins at its
    own quantiles (``bins`` of them, as ``quantile_starts`` does; None keeps ``edges``),
    count both on those bins and score them.

    Wasserstein is scored on the fine grid (``w1_normed``), everything else on the cut bins.
    Both samples are redrawn because both carry sampling error; the bin cutting is redrawn
    because it depends on the baseline: a baseline counted on its own quantiles is nearly
    uniform, and a null that ignored this overstated its noise (KL, JS and PSI fired at
    half of alpha).
    """
    counts = np.asarray(fine_counts, dtype=np.int64)
    n_ref = int(counts.sum())
    if n_ref <= 0 or n_cur <= 0:
        raise ValueError("calibration needs a non-empty baseline and window size")
    rng = np.random.default_rng(seed)
    p = counts / n_ref
    ref = rng.multinomial(n_ref, p, size=resamples)
    cur = rng.multinomial(n_cur, p, size=resamples)
    w1, scale = w1_normed(ref / n_ref, cur / n_cur, edges.centers)  # on the fine grid, as the service scores it
    if bins is None or bins >= counts.size:
        centers = edges.centers
    else:
        cum_ref = np.concatenate([np.zeros((resamples, 1), dtype=np.int64), np.cumsum(ref, axis=1)], axis=1)
        cum_cur = np.concatenate([np.zeros((resamples, 1), dtype=np.int64), np.cumsum(cur, axis=1)], axis=1)
        targets = n_ref * np.arange(1, bins) / bins
        cuts = (cum_ref[:, 1:, None] < targets).sum(axis=1) + 1  # searchsorted(left) + 1, per draw
        bounds = np.concatenate([np.zeros((resamples, 1), dtype=np.int64), np.minimum(cuts, counts.size),
                                 np.full((resamples, 1), counts.size)], axis=1)
        ref = np.diff(np.take_along_axis(cum_ref, bounds, axis=1), axis=1)  # repeated cuts: empty bins, no effect
        cur = np.diff(np.take_along_axis(cum_cur, bounds, axis=1), axis=1)
        at = edges.values[bounds]
        centers = np.sqrt(at[:, :-1] * at[:, 1:]) if edges.log_spaced else (at[:, :-1] + at[:, 1:]) / 2
    stats = statistics(ref, cur, centers)
    stats[STATISTICS.index("wasserstein")] = w1 / scale
    sorted_stats = np.sort(stats, axis=1)
    # per draw and method: its own p-value among the draws (itself included, as the "1 +")
    above = resamples - np.stack([np.searchsorted(row, s, side="left") for row, s in zip(sorted_stats, stats)])
    min_p = (above.min(axis=0)) / (resamples + 1)
    return NullDistribution(n_ref, int(n_cur), sorted_stats, np.sort(min_p))


def holm(p_values: dict[str, float], alpha: float) -> dict[str, bool]:
    """Holm's step-down: reject the i-th smallest p-value (0-based) while it is at most
    alpha / (m - i). Holds the family-wise error rate at alpha whatever the dependence."""
    ordered = sorted(p_values.items(), key=lambda kv: kv[1])
    m = len(ordered)
    out = {name: False for name in p_values}
    for i, (name, p) in enumerate(ordered):
        if p > alpha / (m - i):
            break
        out[name] = True
    return out
