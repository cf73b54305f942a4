"""Binning: edges, open outer bins, the log fast path against a plain search."""

import numpy as np
import pytest

from drift.binning import Edges, bin_indices, histogram, linear_edges, log_edges, quantile_edges


def reference_indices(values, edges):
    return np.clip(np.searchsorted(edges.values, values, side="right") - 1, 0, edges.bins - 1)


def test_log_fast_path_equals_search_including_values_on_edges():
    edges = log_edges(1, 65536, 32)
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.lognormal(5, 3, 200_000), edges.values, np.nextafter(edges.values, 0),
                             [0.0, 1e-9, 1e12]])
    np.testing.assert_array_equal(bin_indices(values, edges), reference_indices(values, edges))


def test_outer_bins_are_open_ended():
    h = histogram(np.array([-100.0, 0.0, 0.5, 1.0, 100.0]), linear_edges(0, 1, 2))
    assert list(h.counts) == [2, 3]


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
