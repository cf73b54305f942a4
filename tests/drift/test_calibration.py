"""Calibrated thresholds: the vectorised statistics equal the methods (and so scipy), the
false-alarm rate holds at alpha at every window size over fresh same-distribution pairs,
Holm against its definition, and shifts are still detected.

Simulations: 200 fresh (reference, window) pairs per window size, alpha 0.05, 999
resamples; an alarm count passes when it is at most the 99.9 % quantile of
Binomial(200, 0.05) (= 21, i.e. a rate of 10.5 %). Before calibration the default fixed
thresholds flagged up to 77 % of same-distribution windows at n = 200.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from inferwatch.drift.binning import (
    Edges,
    Histogram,
    histogram,
    log_edges,
    merge,
    merged_bins,
    merged_edges,
    quantile_starts,
)
from inferwatch.drift.calibration import STATISTICS, holm, null_distribution, size_band, statistics
from inferwatch.drift.methods import js_distance, kl_divergence, ks_binned, prepare, psi, w1_normed, wasserstein_normed

ALPHA, SIMS, RESAMPLES = 0.05, 200, 999
BOUND = int(stats.binom.ppf(0.999, SIMS, ALPHA))
EDGES = log_edges(0.001, 64, 64)  # the ttft_s grid


def scored(rng: np.random.Generator, n: int, shift: float = 1.0, seed: int = 0) -> dict[str, float]:
    """p-value per statistic for one fresh pair: reference and window of n gamma(2, 0.1)
    values (the window scaled by ``shift``), binned and calibrated as the service does."""
    ref = histogram(rng.gamma(2.0, 0.1, n), EDGES)
    cur = histogram(rng.gamma(2.0, 0.1 * shift, n), EDGES)
    bins = merged_bins(ref.total)
    starts = quantile_starts(ref.counts, bins)
    edges = merged_edges(EDGES, starts)
    null = null_distribution(ref.counts, EDGES, size_band(n), bins, RESAMPLES, seed)
    return {m: null.p_value(m, v) for m, v in zip(STATISTICS, observed(ref, cur, starts, edges))}


def observed(ref: Histogram, cur: Histogram, starts: np.ndarray, edges: Edges) -> np.ndarray:
    """The statistics as the service scores them: on the merged bins, Wasserstein on the fine grid."""
    out = statistics(merge(ref, starts, edges).counts, merge(cur, starts, edges).counts, edges.centers)[:, 0]
    w1, scale = w1_normed(ref.counts / ref.total, cur.counts / cur.total, ref.edges.centers)
    out[STATISTICS.index("wasserstein")] = w1 / scale
    return out


def test_vectorised_statistics_equal_the_methods():
    rng = np.random.default_rng(3)
    edges = log_edges(1, 4096, 24)
    for _ in range(20):
        ref = histogram(rng.lognormal(5, 1, 3000), edges)
        cur = histogram(rng.lognormal(5.1, 1.1, 800), edges)
        pp = prepare(ref, cur)
        got = statistics(ref.counts, cur.counts, edges.centers)[:, 0]
        want = [kl_divergence(pp), js_distance(pp), psi(pp), wasserstein_normed(pp), ks_binned(pp)[0]]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("n", [50, 500, 5000, 50000])
def test_false_alarm_rate_holds_alpha_at_every_window_size(n):
    rng = np.random.default_rng(n)
    alarms = dict.fromkeys(STATISTICS, 0)
    for i in range(SIMS):
        for m, p in scored(rng, n, seed=i).items():
            alarms[m] += p <= ALPHA
    assert all(count <= BOUND for count in alarms.values()), (n, alarms, BOUND)
    assert sum(alarms.values()) >= 5 * SIMS * ALPHA / 3, alarms  # not silent either (expected 5 x 10)


def test_segment_verdict_holds_alpha_with_holm():
    """Three independent features per segment, each with its min-p feature p-value (499
    resamples: p-values resolve to 1/500, enough for Holm's smallest level 0.05/3); Holm at
    alpha: the segment fires in at most BOUND of 200 same-distribution segments."""
    rng = np.random.default_rng(11)
    fired = 0
    for i in range(SIMS):
        p_values = {}
        for feature in range(3):
            ref = histogram(rng.gamma(2.0, 0.1, 300), EDGES)
            cur = histogram(rng.gamma(2.0, 0.1, 300), EDGES)
            bins = merged_bins(ref.total)
            starts = quantile_starts(ref.counts, bins)
            edges = merged_edges(EDGES, starts)
            null = null_distribution(ref.counts, EDGES, size_band(300), bins, 499, i)
            p_values[str(feature)] = null.feature_p_value(min(
                null.p_value(m, v) for m, v in zip(STATISTICS, observed(ref, cur, starts, edges))))
        fired += any(holm(p_values, ALPHA).values())
    assert fired <= BOUND, fired


def test_a_shift_is_detected_and_power_grows_with_n():
    """A 30 % scale shift of TTFT: found in most windows of 500, in all of 5,000."""
    rng = np.random.default_rng(5)
    found = {n: sum(min(scored(rng, n, shift=1.3, seed=i).values()) <= ALPHA for i in range(40)) for n in (500, 5000)}
    assert found[500] >= 30 and found[5000] == 40, found


def test_threshold_and_p_value_agree():
    rng = np.random.default_rng(8)
    ref = histogram(rng.gamma(2.0, 0.1, 2000), EDGES)
    null = null_distribution(ref.counts, EDGES, 400, merged_bins(2000), 1999, 0)
    for m in STATISTICS:
        t = null.threshold(m, 0.01)
        assert null.p_value(m, t) > 0.01 and null.p_value(m, np.nextafter(t, np.inf)) <= 0.01
        assert null.p_value(m, -1.0) == 1.0 and null.p_value(m, 1e9) == 1 / 2000
    assert null.threshold("kl", 1e-4) == np.inf  # 1999 draws cannot resolve alpha 1e-4


def test_holm_follows_its_definition():
    p = {"a": 0.001, "b": 0.012, "c": 0.02, "d": 0.5}
    # alpha 0.05: 0.001 <= 0.05/4, 0.012 <= 0.05/3, 0.02 <= 0.05/2, 0.5 > 0.05
    assert holm(p, 0.05) == {"a": True, "b": True, "c": True, "d": False}
    # alpha 0.03: 0.001 <= 0.0075, 0.012 > 0.01 stops the procedure
    assert holm(p, 0.03) == {"a": True, "b": False, "c": False, "d": False}
    assert holm({}, 0.05) == {}


def test_size_bands_are_below_n_and_within_a_ninth():
    for n in list(range(1, 200)) + [1000, 4097, 50_000, 10**7]:
        band = size_band(n)
        assert band <= n and band >= n / 2 ** (1 / 8) - 1
