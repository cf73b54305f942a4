"""Drift methods against scipy and analytic truth; directions; degenerate windows."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.spatial.distance import jensenshannon

from inferwatch.drift.binning import (
    OTHER,
    Histogram,
    categorical_counts,
    histogram,
    linear_edges,
    log_edges,
    quantile_edges,
)
from inferwatch.drift.methods import (
    EPSILON,
    METHODS,
    evaluate,
    js_distance,
    kl_divergence,
    ks_binned,
    ks_exact,
    prepare,
    psi,
    wasserstein_binned,
    wasserstein_exact,
)

RNG = np.random.default_rng(7)


def counted(counts, edges):
    return Histogram(edges, np.asarray(counts, dtype=np.int64))


def smoothed(counts):
    """The documented rule: empty bins get EPSILON, then renormalise."""
    p = counts / counts.sum()
    p = np.where(p == 0, EPSILON, p)
    return p / p.sum()


@pytest.fixture
def windows():
    edges = linear_edges(-4, 4, 40)
    return histogram(RNG.normal(0, 1, 50_000), edges), histogram(RNG.normal(0.3, 1.2, 40_000), edges)


def test_kl_equals_scipy_entropy(windows):
    ref, cur = windows
    assert kl_divergence(prepare(ref, cur)) == pytest.approx(
        stats.entropy(smoothed(cur.counts), smoothed(ref.counts)), rel=1e-12)


def test_kl_with_empty_bins_is_finite_and_follows_the_documented_smoothing():
    edges = linear_edges(0, 4, 4)
    ref, cur = np.array([10, 0, 5, 5]), np.array([0, 7, 3, 10])
    value = kl_divergence(prepare(counted(ref, edges), counted(cur, edges)))
    assert math.isfinite(value)
    assert value == pytest.approx(stats.entropy(smoothed(cur), smoothed(ref)), rel=1e-12)


def test_js_equals_scipy(windows):
    ref, cur = windows
    assert js_distance(prepare(ref, cur)) == pytest.approx(
        jensenshannon(ref.counts / ref.total, cur.counts / cur.total, base=2), rel=1e-9)
    edges = linear_edges(0, 2, 2)
    disjoint = js_distance(prepare(counted(np.array([5, 0]), edges), counted(np.array([0, 5]), edges)))
    assert disjoint == pytest.approx(1.0)


def test_psi_is_symmetrised_kl(windows):
    ref, cur = windows
    p, q = smoothed(ref.counts), smoothed(cur.counts)
    assert psi(prepare(ref, cur)) == pytest.approx(stats.entropy(q, p) + stats.entropy(p, q), rel=1e-12)


def test_wasserstein_binned_equals_scipy_on_bin_centers(windows):
    ref, cur = windows
    c = ref.edges.centers
    assert wasserstein_binned(prepare(ref, cur)) == pytest.approx(
        stats.wasserstein_distance(c, c, ref.counts, cur.counts), rel=1e-9)


def test_exact_methods_equal_scipy():
    a, b = RNG.exponential(1.0, 3000), RNG.exponential(1.3, 2000)
    assert wasserstein_exact(a, b) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-9)
    d, p = ks_exact(a, b)
    truth = stats.ks_2samp(a, b, method="asymp")
    assert d == pytest.approx(truth.statistic, abs=1e-12)
    assert p == pytest.approx(truth.pvalue, rel=0.05)  # Stephens' approximation of scipy's kstwo


@pytest.mark.parametrize("n, m", [(200, 300), (2000, 1500), (20000, 30000)])
def test_ks_p_value_tracks_scipy_where_decisions_are_made(n, m):
    rng = np.random.default_rng(n)
    for shift in (0.0, 0.05, 0.1, 0.2):
        a, b = rng.normal(0, 1, n), rng.normal(shift, 1, m)
        _d, p = ks_exact(a, b)
        truth = stats.ks_2samp(a, b, method="asymp").pvalue
        if truth > 1e-6:
            assert p == pytest.approx(truth, rel=0.05), (n, m, shift)
            assert (p < 0.05) == (truth < 0.05) or abs(truth - 0.05) < 0.003


def test_binned_ks_equals_exact_when_every_bin_holds_one_value():
    a, b = RNG.integers(0, 20, 5000).astype(float), RNG.integers(2, 22, 4000).astype(float)
    edges = linear_edges(-0.5, 23.5, 24)
    d_binned, p_binned = ks_binned(prepare(histogram(a, edges), histogram(b, edges)))
    d_exact, p_exact = ks_exact(a, b)
    assert d_binned == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
    assert (d_binned, p_binned) == pytest.approx((d_exact, p_exact))


def test_chi_square_equals_scipy():
    cats = ("stop", "length", "tool_calls")
    ref = categorical_counts(["stop"] * 600 + ["length"] * 300 + ["tool_calls"] * 90 + ["weird"] * 10, cats)
    cur = categorical_counts(["stop"] * 400 + ["length"] * 500 + ["tool_calls"] * 80 + ["weird"] * 20, cats)
    result = evaluate("chi2", ref, cur)
    truth = stats.chi2_contingency(np.vstack([ref.counts, cur.counts]), correction=False)
    assert result.score == pytest.approx(truth.pvalue, rel=1e-9, abs=1e-300)
    assert result.drifted


def test_chi_square_is_two_sample_and_skips_categories_empty_in_both():
    """Both rows are samples: the statistic is symmetric in them, and a category no window
    holds adds no degree of freedom (scipy's contingency test on the non-empty columns)."""
    cats = ("stop", "length", "tool_calls", "abort")
    ref = categorical_counts(["stop"] * 60 + ["length"] * 30, cats)
    cur = categorical_counts(["stop"] * 50 + ["length"] * 45 + ["tool_calls"] * 12, cats)
    forward, backward = evaluate("chi2", ref, cur), evaluate("chi2", cur, ref)
    assert forward.score == pytest.approx(backward.score, rel=1e-12)
    truth = stats.chi2_contingency(np.array([[60, 30, 0], [50, 45, 12]]), correction=False)
    assert forward.score == pytest.approx(truth.pvalue, rel=1e-9)
    same = categorical_counts(["stop"] * 10, cats)
    assert evaluate("chi2", same, same).score == 1.0


@pytest.mark.parametrize("mu", [0.25, 0.5, 1.0])
def test_analytic_normal_shift(mu):
    """N(0,1) vs N(mu,1): W1 = mu and KL = mu^2 / 2, within sampling and binning error."""
    edges = linear_edges(-8, 9, 680)
    ref = histogram(RNG.normal(0, 1, 400_000), edges)
    cur = histogram(RNG.normal(mu, 1, 400_000), edges)
    assert wasserstein_binned(prepare(ref, cur)) == pytest.approx(mu, abs=0.01)
    assert evaluate("wasserstein", ref, cur).score == pytest.approx(mu, rel=0.03)
    # KL needs bins wide enough that the tails are sampled: finer bins leave empty tail bins
    # whose smoothing (1e-4) dominates the true mass (~1e-7) and bias KL low
    coarse = linear_edges(-8, 9, 68)
    ref, cur = histogram(RNG.normal(0, 1, 400_000), coarse), histogram(RNG.normal(mu, 1, 400_000), coarse)
    assert kl_divergence(prepare(ref, cur)) == pytest.approx(mu**2 / 2, rel=0.05, abs=0.004)


def test_every_method_declares_kind_direction_and_threshold():
    for spec in METHODS.values():
        assert spec.kind in ("distance", "p_value")
        assert spec.direction == ("lower_is_drift" if spec.kind == "p_value" else "higher_is_drift")
        assert spec.default_threshold > 0


@pytest.mark.parametrize("method", ["kl", "js", "psi", "wasserstein", "ks"])
def test_shift_is_detected_and_carries_the_threshold_used(method, windows):
    ref, _ = windows
    shifted = histogram(RNG.normal(1.0, 1, 20_000), ref.edges)
    result = evaluate(method, ref, shifted, threshold=0.05 if method == "ks" else 0.08)
    assert result.drifted and result.threshold == (0.05 if method == "ks" else 0.08)
    assert result.direction == METHODS[method].direction and result.status == "ok"


@pytest.mark.parametrize("method", ["kl", "js", "psi", "wasserstein", "ks"])
def test_false_positive_rate_on_samples_from_one_distribution(method):
    edges = log_edges(1, 4096, 24)
    ref = histogram(RNG.lognormal(5, 1, 20_000), edges)
    alarms = sum(evaluate(method, ref, histogram(RNG.lognormal(5, 1, 5_000), edges)).drifted for _ in range(100))
    assert alarms <= (10 if method == "ks" else 0)  # ks: ~5% expected at alpha 0.05


def test_empty_window_is_insufficient_data_not_nan():
    edges = linear_edges(0, 1, 4)
    empty, full = histogram(np.array([]), edges), histogram(np.array([0.1, 0.5]), edges)
    for method in ("kl", "js", "psi", "wasserstein", "ks"):
        for a, b in ((empty, full), (full, empty)):
            r = evaluate(method, a, b)
            assert r.status == "insufficient_data" and r.score is None and not r.drifted


def test_all_equal_values():
    values = np.full(1000, 42.0)
    edges = quantile_edges(values, 10)
    ref, cur = histogram(values, edges), histogram(values, edges)
    assert edges.bins == 1
    for method in ("kl", "js", "psi", "wasserstein"):
        assert evaluate(method, ref, cur).score == pytest.approx(0.0, abs=1e-12)
    assert evaluate("ks", ref, cur).score == pytest.approx(1.0)
    assert ks_exact(values, values) == (0.0, 1.0)


def test_nan_and_inf_are_counted_apart_never_binned():
    h = histogram(np.array([1.0, np.nan, 2.0, np.inf, -np.inf, np.nan]), linear_edges(0, 3, 3))
    assert (h.total, h.nan, h.inf) == (2, 2, 2)
    assert math.isfinite(ks_exact(np.array([1.0, np.nan]), np.array([1.0, 2.0]))[0])


def test_unseen_categories_fall_into_other():
    counts = categorical_counts(["en", "fr", "xx", "yy"], ("en", "fr"))
    assert dict(zip(counts.labels, counts.counts)) == {"en": 1, "fr": 1, OTHER: 2}
    with pytest.raises(ValueError):
        categorical_counts(["a"], ("a", OTHER))


def test_wrong_inputs_are_refused():
    h = histogram(np.array([1.0]), linear_edges(0, 2, 2))
    with pytest.raises(ValueError, match="unknown method"):
        evaluate("hellinger", h, h)
    with pytest.raises(ValueError, match="categorical"):
        evaluate("chi2", h, h)
