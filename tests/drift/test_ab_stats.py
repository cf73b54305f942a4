"""A/B statistics against scipy, brute force and known truths (coverage by simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from inferwatch.drift.ab import stats


@pytest.mark.parametrize("seed", range(4))
def test_mann_whitney_on_raw_values_equals_scipy(seed):
    rng = np.random.default_rng(seed)
    c = rng.lognormal(0, 1, 300)
    t = rng.lognormal(0.1 * seed, 1, 250)
    t[:20] = c[:20]  # ties across arms
    ours = stats.mann_whitney(c, t)
    ref = sps.mannwhitneyu(t, c, use_continuity=False, method="asymptotic")
    assert ours.u == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


def test_mann_whitney_on_bin_counts_equals_scipy_on_the_binned_values():
    """The bins are ties: U from counts is exactly scipy's U of the bin indices."""
    rng = np.random.default_rng(7)
    edges = np.geomspace(0.01, 100, 40)
    c = np.digitize(rng.lognormal(0, 1, 5000), edges)
    t = np.digitize(rng.lognormal(0.05, 1, 4000), edges)
    ours = stats.mann_whitney_counts(np.bincount(c, minlength=41), np.bincount(t, minlength=41))
    ref = sps.mannwhitneyu(t, c, use_continuity=False, method="asymptotic")
    assert ours.u == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert ours.superiority == pytest.approx(ref.statistic / (5000 * 4000))


def test_delta_method_is_the_binomial_variance_with_one_request_per_unit():
    x = (np.arange(400) < 30).astype(float)
    r, var = stats.ratio_and_variance(x, np.ones(400))
    assert r == pytest.approx(30 / 400)
    assert var == pytest.approx(r * (1 - r) / 400 * 400 / 399)


def _clustered(rng: np.random.Generator, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Units with log-normal request counts and their own error propensity."""
    n = np.maximum(1, rng.lognormal(1.0, 1.2, units).round())
    return rng.binomial(n.astype(int), rng.beta(0.5, 20, units)).astype(float), n


def test_delta_method_variance_matches_the_spread_of_the_ratio_over_repeated_samples():
    """The truth is the ratio's own variance over 4,000 samples of 300 units; the binomial
    variance over requests, which ignores the clustering, is about half of it."""
    rng = np.random.default_rng(5)
    draws = [_clustered(rng, 300) for _ in range(4000)]
    ratios = np.array([x.sum() / n.sum() for x, n in draws])
    delta = np.array([stats.ratio_and_variance(x, n)[1] for x, n in draws])
    assert delta.mean() == pytest.approx(ratios.var(), rel=0.1)
    binomial = np.array([r * (1 - r) / n.sum() for r, (_, n) in zip(ratios, draws)])
    assert ratios.var() > 1.5 * binomial.mean()


def test_ratio_difference_interval_covers_at_its_level():
    rng = np.random.default_rng(6)
    sims, hits = 2000, 0
    truth = None
    for _ in range(sims):
        (xc, nc), (xt, nt) = _clustered(rng, 400), _clustered(rng, 400)
        d = stats.ratio_difference(xc, nc, xt, nt, 0.05)
        hits += d.interval[0] <= 0 <= d.interval[1]
        truth = d
    assert truth is not None and abs(hits / sims - 0.95) < 3 * math.sqrt(0.95 * 0.05 / sims) + 0.01


def test_welch_equals_scipy_ttest_and_its_interval():
    rng = np.random.default_rng(1)
    c, t = rng.normal(-1.0, 0.3, 400), rng.normal(-1.05, 0.6, 300)
    ours = stats.welch(c, t, 0.05)
    ref = sps.ttest_ind(t, c, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert ours.df == pytest.approx(ref.df, rel=1e-12)
    assert ours.interval == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_sample_ratio_equals_scipy_chisquare():
    ours = stats.sample_ratio((9100, 900), (0.9, 0.1))
    ref = sps.chisquare([9100, 900], f_exp=[9000, 1000])
    assert ours.statistic == pytest.approx(ref.statistic)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_hodges_lehmann_and_moses_interval_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    c, t = rng.exponential(1.0, 60), rng.exponential(1.3, 45)
    diffs = np.sort((t[None, :] - c[:, None]).ravel())
    ours = stats.hodges_lehmann(c, t, 0.05)
    assert ours.estimate == pytest.approx(np.median(diffs), rel=1e-9)
    mn = diffs.size
    cut = math.floor(mn / 2 - 1.959963984540054 * math.sqrt(mn * (60 + 45 + 1) / 12))
    assert ours.interval == pytest.approx((diffs[cut - 1], diffs[mn - cut]), rel=1e-9)


def test_moses_interval_covers_a_known_shift():
    rng = np.random.default_rng(11)
    sims, hits = 400, 0
    for _ in range(sims):
        c, t = rng.standard_t(3, 80), rng.standard_t(3, 70) + 0.4
        lo, hi = stats.hodges_lehmann(c, t, 0.05).interval
        hits += lo <= 0.4 <= hi
    assert abs(hits / sims - 0.95) < 3 * math.sqrt(0.95 * 0.05 / sims) + 0.01


def test_p95_difference_interval_covers_the_analytic_difference():
    """Lognormal arms: the true p95 difference is known in closed form. 1000 sims of 2000."""
    rng = np.random.default_rng(5)
    z95 = sps.norm.ppf(0.95)
    truth = math.exp(0.2 + 0.5 * z95) - math.exp(0.5 * z95)
    sims, hits = 1000, 0
    for _ in range(sims):
        c, t = rng.lognormal(0, 0.5, 2000), rng.lognormal(0.2, 0.5, 2000)
        r = stats.quantile_difference(c, t, 0.95, 0.05)
        hits += r.interval[0] <= truth <= r.interval[1]
    assert abs(hits / sims - 0.95) < 3 * math.sqrt(0.95 * 0.05 / sims) + 0.01
