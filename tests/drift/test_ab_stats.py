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


@pytest.mark.parametrize("table", [(0, 40, 3, 35), (1, 12, 5, 9), (2, 200, 9, 180), (7, 7, 0, 9), (0, 50, 0, 60)])
def test_fisher_exact_equals_scipy(table):
    xc, nc, xt, nt = table
    ours = stats.fisher_exact_p(xc, nc, xt, nt)
    ref = sps.fisher_exact([[xc, nc - xc], [xt, nt - xt]]).pvalue
    assert ours == pytest.approx(ref, rel=1e-9)


def test_small_counts_use_fisher_and_large_counts_the_z_test_equal_to_chi_square():
    small = stats.two_proportions(1, 60, 6, 50, 0.05)
    assert small.test == "fisher_exact"
    assert small.p_value == pytest.approx(sps.fisher_exact([[1, 59], [6, 44]]).pvalue, rel=1e-9)
    large = stats.two_proportions(40, 2000, 70, 2100, 0.05)
    assert large.test == "two_proportion_z"
    chi2 = sps.chi2_contingency([[40, 1960], [70, 2030]], correction=False)
    assert large.p_value == pytest.approx(chi2.pvalue, rel=1e-9)
    assert large.difference == pytest.approx(70 / 2100 - 40 / 2000)
    assert large.relative == pytest.approx((70 / 2100 - 40 / 2000) / (40 / 2000))


def test_wilson_interval_equals_scipy_binomtest():
    for x, n in ((0, 50), (3, 50), (49, 50), (500, 1000)):
        ref = sps.binomtest(x, n).proportion_ci(0.95, method="wilson")
        assert stats.wilson(x, n, 0.05) == pytest.approx((ref.low, ref.high), rel=1e-9, abs=1e-12)


def test_newcombe_interval_covers_the_true_difference():
    """Coverage of the rate-difference interval at small rates (where Wald fails): 2000 sims."""
    rng = np.random.default_rng(3)
    pc, pt, n, sims = 0.01, 0.02, 400, 2000
    xc, xt = rng.binomial(n, pc, sims), rng.binomial(n, pt, sims)
    hits = sum(lo <= pt - pc <= hi for lo, hi in (stats.two_proportions(a, n, b, n, 0.05).interval
                                                  for a, b in zip(xc, xt)))
    assert abs(hits / sims - 0.95) < 3 * math.sqrt(0.95 * 0.05 / sims) + 0.01


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
