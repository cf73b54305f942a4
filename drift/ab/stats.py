"""Fixed-sample tests and effect sizes for comparing a treatment arm with a control arm.

Every function is pure and takes the treatment minus the control, so a positive effect
means "the treatment has more of it". These p-values hold for one look at a fixed sample;
the decision uses the always-valid versions in ``drift.ab.sequential``, and these are
reported beside them because they are what a person checks a result against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy.stats import hypergeom

FISHER_BELOW = 5.0  # smallest expected cell under which the z-test gives way to Fisher's exact test


def z_quantile(alpha: float) -> float:
    """The two-sided normal critical value for level alpha."""
    return float(special.ndtri(1 - alpha / 2))


def two_sided_normal_p(z: float) -> float:
    return float(2 * special.ndtr(-abs(z)))


@dataclass(frozen=True)
class Proportions:
    rate_control: float
    rate_treatment: float
    difference: float  # treatment - control
    relative: float | None  # difference / control rate; None when the control rate is 0
    interval: tuple[float, float]  # Newcombe's hybrid score interval for the difference
    p_value: float
    test: str  # "fisher_exact" or "two_proportion_z"


def wilson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Wilson's score interval for a binomial rate: keeps its coverage near 0 and 1, where
    the Wald interval collapses to a point (error rates live there)."""
    if trials == 0:
        return 0.0, 1.0
    z = z_quantile(alpha)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_exact_p(x_control: int, n_control: int, x_treatment: int, n_treatment: int) -> float:
    """Two-sided Fisher exact test of the 2x2 table: conditional on both margins the
    treatment's count is hypergeometric; the p-value sums every table at most as likely as
    the one observed (with scipy's relative tolerance, so float noise does not drop ties)."""
    total, events = n_control + n_treatment, x_control + x_treatment
    low, high = max(0, n_treatment - (total - events)), min(events, n_treatment)
    support = np.arange(low, high + 1)
    pmf = hypergeom.pmf(support, total, events, n_treatment)
    observed = hypergeom.pmf(x_treatment, total, events, n_treatment)
    return float(min(1.0, pmf[pmf <= observed * (1 + 1e-7)].sum()))


def two_proportions(x_control: int, n_control: int, x_treatment: int, n_treatment: int,
                    alpha: float) -> Proportions:
    """Compare two rates (errors, truncations, thumbs up). Fisher's exact test while any
    expected cell is under five, where the z-test's normal approximation is poor; the pooled
    two-proportion z-test above (equal to the uncorrected chi-square on the 2x2 table)."""
    pc, pt = x_control / n_control, x_treatment / n_treatment
    diff = pt - pc
    total, events = n_control + n_treatment, x_control + x_treatment
    expected = min(n * k / total for n in (n_control, n_treatment) for k in (events, total - events))
    if expected < FISHER_BELOW:
        p, test = fisher_exact_p(x_control, n_control, x_treatment, n_treatment), "fisher_exact"
    else:
        pooled = events / total
        z = diff / math.sqrt(pooled * (1 - pooled) * (1 / n_control + 1 / n_treatment))
        p, test = two_sided_normal_p(z), "two_proportion_z"
    lc, uc = wilson(x_control, n_control, alpha)
    lt, ut = wilson(x_treatment, n_treatment, alpha)
    interval = (diff - math.hypot(pt - lt, uc - pc), diff + math.hypot(ut - pt, pc - lc))
    return Proportions(pc, pt, diff, diff / pc if pc > 0 else None, interval, p, test)


@dataclass(frozen=True)
class RankTest:
    u: float  # Mann-Whitney U of the treatment: pairs where it is larger, ties counted half
    z: float  # standardised U, tie-corrected
    p_value: float  # two-sided, normal approximation without continuity correction
    superiority: float  # U / (m n): P(treatment > control) + P(tie) / 2
    n_control: int
    n_treatment: int


def mann_whitney_counts(control: np.ndarray, treatment: np.ndarray) -> RankTest:
    """Mann-Whitney U from counts on a shared ordered grid (bins, or distinct values).

    Values in one bin are ties, so on binned data this is the exact U of the binned values
    and needs O(bins) work whatever the number of requests: that is what lets the verdict
    use every request of the window (exact counts) instead of a sample. Equals scipy's
    ``mannwhitneyu(treatment, control, use_continuity=False, method="asymptotic")``."""
    c = np.asarray(control, dtype=np.float64)
    t = np.asarray(treatment, dtype=np.float64)
    m, n = float(c.sum()), float(t.sum())
    below = np.cumsum(c) - c
    u = float(np.dot(t, below + 0.5 * c))
    total = m + n
    ties = c + t
    tie_term = float(np.dot(ties, ties * ties - 1)) / (total * (total - 1)) if total > 1 else 0.0
    var = m * n / 12 * ((total + 1) - tie_term)
    z = (u - m * n / 2) / math.sqrt(var) if var > 0 else 0.0
    return RankTest(u, z, two_sided_normal_p(z), u / (m * n) if m * n else 0.5, int(m), int(n))


def mann_whitney(control: np.ndarray, treatment: np.ndarray) -> RankTest:
    """Mann-Whitney U on raw values: the counts of both arms on their pooled distinct values."""
    values, inverse = np.unique(np.concatenate([control, treatment]), return_inverse=True)
    c = np.bincount(inverse[:len(control)], minlength=values.size)
    t = np.bincount(inverse[len(control):], minlength=values.size)
    return mann_whitney_counts(c, t)


def _kth_differences(control: np.ndarray, treatment: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """The k-th smallest (1-based) of the m*n pairwise differences treatment - control, for
    each k, without forming them: count(d) = #{t_j - c_i <= d} is one searchsorted, so
    bisection on d finds each order statistic in O(m log n) per step; the answer is then
    snapped to the largest actual difference at or under the bracket's top."""
    c, t = np.sort(control), np.sort(treatment)
    lo = np.full(ks.size, t[0] - c[-1] - 1.0)
    hi = np.full(ks.size, t[-1] - c[0])
    for _ in range(64):
        mid = (lo + hi) / 2
        counts = np.searchsorted(t, (c[None, :] + mid[:, None]).ravel(), side="right").reshape(ks.size, -1).sum(1)
        ok = counts >= ks
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
        if np.all(hi - lo <= 1e-12 * np.maximum(1.0, np.abs(hi))):
            break
    j = np.searchsorted(t, c[None, :] + hi[:, None], side="right") - 1
    diffs = np.where(j >= 0, t[np.clip(j, 0, None)] - c[None, :], -np.inf)
    return diffs.max(axis=1)


@dataclass(frozen=True)
class Shift:
    estimate: float  # Hodges-Lehmann: median of all pairwise differences treatment - control
    interval: tuple[float, float]  # Moses' distribution-free interval


def hodges_lehmann(control: np.ndarray, treatment: np.ndarray, alpha: float) -> Shift:
    """The Hodges-Lehmann shift with Moses' confidence interval (Hollander & Wolfe,
    Nonparametric Statistical Methods, ch. 4): the interval's ends are the C-th smallest and
    C-th largest pairwise differences, C = mn/2 - z sqrt(mn(m+n+1)/12) rounded down. The
    shift estimates what Mann-Whitney tests, in the metric's own unit."""
    m, n = len(control), len(treatment)
    mn = m * n
    z = z_quantile(alpha)
    cut = max(1, math.floor(mn / 2 - z * math.sqrt(mn * (m + n + 1) / 12)))
    ks = np.array([(mn + 1) // 2, mn // 2 + 1, cut, mn - cut + 1])
    low_mid, high_mid, lower, upper = _kth_differences(np.asarray(control, float), np.asarray(treatment, float), ks)
    return Shift(float((low_mid + high_mid) / 2), (float(lower), float(upper)))


@dataclass(frozen=True)
class QuantileDifference:
    q: float
    control: float
    treatment: float
    difference: float
    interval: tuple[float, float]


def quantile_se(sorted_values: np.ndarray, q: float, alpha: float) -> float:
    """Standard error of a sample quantile from two order statistics (McKean & Schrader 1984,
    generalised from the median): the distribution-free binomial interval for the q-th
    quantile spans ranks nq -/+ z sqrt(nq(1-q)); its width over 2z is the standard error.
    No density estimate and no resampling."""
    n = sorted_values.size
    z = z_quantile(alpha)
    spread = z * math.sqrt(n * q * (1 - q))
    low = min(max(int(round(n * q - spread)), 1), n)
    high = min(max(int(round(n * q + spread)), 1), n)
    return float(sorted_values[high - 1] - sorted_values[low - 1]) / (2 * z)


def quantile_difference(control: np.ndarray, treatment: np.ndarray, q: float, alpha: float) -> QuantileDifference:
    """Difference of the q-th quantiles with an order-statistic interval (Price & Bonett 2002,
    'Distribution-free confidence intervals for difference and ratio of medians', applied to
    the q-th quantile): estimate +/- z sqrt(se_c^2 + se_t^2). Needs n(1-q) well above 1 in
    each arm; callers only use it with at least 100 values per arm."""
    c, t = np.sort(np.asarray(control, float)), np.sort(np.asarray(treatment, float))
    qc, qt = float(np.quantile(c, q)), float(np.quantile(t, q))
    half = z_quantile(alpha) * math.hypot(quantile_se(c, q, alpha), quantile_se(t, q, alpha))
    diff = qt - qc
    return QuantileDifference(q, qc, qt, diff, (diff - half, diff + half))


@dataclass(frozen=True)
class MeanDifference:
    mean_control: float
    mean_treatment: float
    difference: float
    se: float
    df: float
    interval: tuple[float, float]
    p_value: float


def welch(control: np.ndarray, treatment: np.ndarray, alpha: float) -> MeanDifference:
    """Welch's t-test and interval for a difference of means with unequal variances
    (Welch-Satterthwaite degrees of freedom): mean token logprob differs in spread between
    models, so the pooled-variance t-test would be wrong."""
    c, t = np.asarray(control, float), np.asarray(treatment, float)
    vc, vt = c.var(ddof=1) / c.size, t.var(ddof=1) / t.size
    se = math.sqrt(vc + vt)
    diff = float(t.mean() - c.mean())
    if se == 0:
        return MeanDifference(float(c.mean()), float(t.mean()), diff, 0.0, math.inf, (diff, diff),
                              1.0 if diff == 0 else 0.0)
    df = (vc + vt) ** 2 / (vc * vc / (c.size - 1) + vt * vt / (t.size - 1))
    tstat = diff / se
    half = float(special.stdtrit(df, 1 - alpha / 2)) * se
    p = float(2 * special.stdtr(df, -abs(tstat)))
    return MeanDifference(float(c.mean()), float(t.mean()), diff, se, float(df), (diff - half, diff + half), p)


@dataclass(frozen=True)
class SampleRatio:
    observed: tuple[int, ...]
    expected_share: tuple[float, ...]
    statistic: float
    p_value: float


def sample_ratio(observed: tuple[int, ...], weights: tuple[float, ...]) -> SampleRatio:
    """Pearson's chi-square of assignment counts against the configured weights (the
    sample-ratio-mismatch check: Fabijan et al., 'Diagnosing Sample Ratio Mismatch in Online
    Controlled Experiments', KDD 2019). A mismatch means assignment or logging is broken and
    no metric comparison can be trusted."""
    counts = np.asarray(observed, dtype=float)
    share = np.asarray(weights, dtype=float) / float(np.sum(weights))
    expected = counts.sum() * share
    stat = float(np.sum((counts - expected) ** 2 / expected)) if counts.sum() > 0 else 0.0
    p = float(special.chdtrc(counts.size - 1, stat))
    return SampleRatio(tuple(int(x) for x in observed), tuple(float(s) for s in share), stat, p)
