"""The categorical test holds alpha at every window size, rare categories included.

The asymptotic Pearson p-value is wrong when expected cells are small: with a status mix of
99 % / 0.3 % / 0.7 % and a window of 50 records, the 0.3 % category expects 0.15 records, and
the chi-square distribution fired 4.2 % of same-distribution windows at alpha 1 % (2.2 % at
200; 3.3 % and 1.3 % with a 97 / 1 / 2 % mix).
Where a cell expects fewer than 5 records the p-value is Monte-Carlo conditional on the
table's margins instead; where every cell expects 5 or more it is scipy's asymptotic test.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from inferwatch.drift.binning import CategoricalCounts
from inferwatch.drift.methods import chi_square

ALPHA, SIMS, REFERENCE = 0.01, 5000, 2000
MIX = np.array([0.99, 0.003, 0.007])  # 2xx, 4xx, 5xx: a healthy service's status classes
BOUND = int(stats.binom.ppf(0.999, SIMS, ALPHA))  # 73 of 5,000: a rate of 1.46 %
CATS = ("2xx", "4xx")  # the third bucket is "other"


def _counts(counts: np.ndarray) -> CategoricalCounts:
    return CategoricalCounts(CATS, np.asarray(counts, dtype=np.int64))


@pytest.mark.parametrize("n", [50, 200])
def test_false_alarm_rate_holds_alpha_with_a_rare_category(n: int) -> None:
    rng = np.random.default_rng(n)
    alarms = 0
    for _ in range(SIMS):
        p = chi_square(_counts(rng.multinomial(REFERENCE, MIX)), _counts(rng.multinomial(n, MIX)))[1]
        alarms += p <= ALPHA
    assert alarms <= BOUND, f"{alarms / SIMS:.2%} of same-distribution windows flagged at alpha {ALPHA:.0%}"


def test_equals_scipy_where_the_asymptotic_test_is_valid() -> None:
    ref, cur = _counts([600, 300, 100]), _counts([400, 500, 100])
    truth = stats.chi2_contingency(np.vstack([ref.counts, cur.counts]), correction=False)
    statistic, p = chi_square(ref, cur)
    assert statistic == pytest.approx(truth.statistic, rel=1e-12)
    assert p == pytest.approx(truth.pvalue, rel=1e-9, abs=1e-300)


def test_sparse_tables_get_a_monte_carlo_p_value_that_still_detects_a_shift() -> None:
    """Same statistic as scipy, a p-value resolved by the draws (never 0), reproducible, and
    a jump of the rare class from 1 % to 10 % of 50 requests is found."""
    ref, cur = _counts([1940, 20, 40]), _counts([44, 5, 1])
    statistic, p = chi_square(ref, cur)
    table = np.vstack([ref.counts, cur.counts])
    assert statistic == pytest.approx(stats.chi2_contingency(table, correction=False).statistic, rel=1e-12)
    assert 0 < p <= ALPHA
    assert chi_square(ref, cur) == (statistic, p)
    assert chi_square(ref, _counts([48, 1, 1]))[1] > 0.2
