"""Binning: edges, open outer bins, the log fast path against a plain search."""

import numpy as np
import pytest

from inferwatch.drift.binning import Edges, bin_indices, histogram, linear_edges, log_edges, quantile_edges


def search(values, edges):
    return np.searchsorted(edges.values[1:-1], values, side="left")


@pytest.mark.parametrize("edges", [log_edges(1, 65536, 32), log_edges(0.001, 60, 30), linear_edges(-4, 4, 40)])
def test_arithmetic_binning_equals_search_everywhere(edges):
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.lognormal(3, 3, 200_000), rng.normal(0, 3, 100_000),
                             rng.integers(0, 70000, 100_000).astype(float), edges.values,
                             np.nextafter(edges.values, 0), np.nextafter(edges.values, np.inf), [0.0, -5.0, 1e300]])
    np.testing.assert_array_equal(bin_indices(values, edges), search(values, edges))


def test_values_on_edges_follow_prometheus_le_semantics():
    """A value equal to an edge is counted in the bin that edge closes, as in le buckets."""
    edges = log_edges(1, 1024, 10)  # 1, 2, 4, ..., 1024: token counts land exactly on edges
    values = np.array([1.0, 2.0, 2.5, 4.0, 1024.0])
    assert list(bin_indices(values, edges)) == [0, 0, 1, 1, 9]
    le = edges.values[1:]
    for v, i in zip(values, bin_indices(values, edges)):
        assert v <= le[i] and (i == 0 or v > le[i - 1])


def test_outer_bins_are_open_ended():
    h = histogram(np.array([-100.0, 0.0, 0.5, 1.0, 100.0]), linear_edges(0, 1, 2))
    assert list(h.counts) == [3, 2]


def test_quantile_edges_balance_reference_mass():
    ref = np.random.default_rng(2).exponential(1.0, 100_000)
    h = histogram(ref, quantile_edges(ref, 10))
    assert h.counts.min() >= 9_900 and h.counts.max() <= 10_100


@pytest.mark.parametrize("bad", [[1.0], [1.0, 1.0], [2.0, 1.0], [0.0, np.inf]])
def test_invalid_edges_are_refused(bad):
    with pytest.raises(ValueError):
        Edges(np.array(bad))


def test_histograms_add_only_with_equal_edges():
    a = histogram(np.array([0.1]), linear_edges(0, 1, 2))
    assert list((a + a).counts) == [2, 0]
    with pytest.raises(ValueError):
        a + histogram(np.array([0.1]), linear_edges(0, 1, 3))
