"""Always-valid p-values: analytic values, and by simulation that checking at every look keeps
false rollbacks at or under alpha (where a fixed-sample test checked as often does not), and
that known effects are found about as often as theory predicts.

Tolerances: a simulated rate r over S independent experiments has standard error
sqrt(r (1 - r) / S); bounds allow three of them (a 0.13% chance of a false failure each)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from inferwatch.drift.ab import sequential as seq
from inferwatch.drift.ab.decision import Arm, Experiment, analyse, evaluate_metric
from inferwatch.drift.ab.spec import BY_NAME
from inferwatch.drift.ab.units import COL, COLUMNS
from tests.support.ab_sim import Effects, arm_at, power_proportion, stream, theta_lognormal

ALPHA = 0.05
EXP = Experiment("a", "b", alpha=ALPHA)


def allowance(rate: float, sims: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / sims)


def test_always_valid_p_closed_form_and_boundary():
    assert seq.always_valid_p(3.0, 4.0) == pytest.approx(math.sqrt(5) * math.exp(-9 * 4 / 10))
    assert seq.always_valid_p(0.0, 4.0) == 1.0
    assert seq.always_valid_p(50.0, 0.0) == 1.0  # no data, no evidence
    for v in (0.1, 1.0, 10.0, 1e4):
        b = seq.boundary(v, ALPHA)
        assert seq.always_valid_p(b, v) == pytest.approx(ALPHA, rel=1e-9)
        assert b > special.ndtri(1 - ALPHA / 2)  # wider than a fixed-sample interval, always
    lo, hi = seq.confidence_sequence(1.0, 0.5, 10.0, ALPHA)
    assert (hi - lo) / 2 == pytest.approx(seq.boundary(10.0, ALPHA) * 0.5)


def test_the_boundary_is_tightest_where_it_is_tuned():
    """In standard errors the boundary is lowest near the tuned effective sample size."""
    r = seq.rho2(ALPHA, 500)
    at = {n: seq.boundary(r * n, ALPHA) for n in (100, 500, 2500)}
    assert at[500] < min(at[100], at[2500])


def _arm(name: str, n: int, errors: int = 0, ttft: np.ndarray | None = None) -> Arm:
    """``n`` requests, each its own unit: ``errors`` of them 5xx, and their ``ttft``."""
    units = np.zeros((n, len(COLUMNS)))
    units[:, COL["requests"]] = 1
    units[:errors, COL["errors"]] = 1
    if ttft is not None:
        units[:, COL["ttft_s:n"]], units[:, COL["ttft_s:sum"]] = 1, ttft[:n]
    return Arm(name, units, n, 0.5)


LOOKS = np.arange(100, 2001, 100)  # requests per arm at each of 20 looks


def test_aa_error_rate_checked_20_times_keeps_false_alarms_under_alpha():
    """2,000 A/A experiments, 20 looks each (100..2,000 requests per arm, 2% errors): the
    always-valid p-value ever at or under alpha in at most alpha of them; the fixed-sample
    p-value, looked at as often, in far more (so this test can tell the two apart)."""
    rng = np.random.default_rng(0)
    sims = 2000
    xc = rng.binomial(100, 0.02, (sims, LOOKS.size)).cumsum(1)
    xt = rng.binomial(100, 0.02, (sims, LOOKS.size)).cumsum(1)
    spec = BY_NAME["error_rate"]
    seq_alarm = fixed_alarm = 0
    for i in range(sims):
        results = [evaluate_metric(spec, _arm("a", n, int(xc[i, k])), _arm("b", n, int(xt[i, k])), EXP)
                   for k, n in enumerate(LOOKS)]
        seq_alarm += any(r.p_value_sequential <= ALPHA for r in results)
        fixed_alarm += any(r.p_value <= ALPHA for r in results)
    assert seq_alarm / sims <= ALPHA + allowance(ALPHA, sims)
    assert fixed_alarm / sims > 2 * ALPHA


RANK_LOOKS = np.arange(50, 501, 50)


def test_aa_ttft_rank_test_checked_10_times_keeps_false_alarms_under_alpha():
    """400 A/A experiments of Mann-Whitney on TTFT, 10 looks each (50..500 per arm)."""
    rng = np.random.default_rng(1)
    sims = 400
    spec = BY_NAME["ttft"]
    seq_alarm = fixed_alarm = 0
    for _ in range(sims):
        c, t = rng.lognormal(math.log(0.2), 0.5, RANK_LOOKS[-1]), rng.lognormal(math.log(0.2), 0.5, RANK_LOOKS[-1])
        results = [evaluate_metric(spec, _arm("a", n, 0, c), _arm("b", n, 0, t), EXP) for n in RANK_LOOKS]
        seq_alarm += any(r.p_value_sequential <= ALPHA for r in results)
        fixed_alarm += any(r.p_value <= ALPHA for r in results)
    assert seq_alarm / sims <= ALPHA + allowance(ALPHA, sims)
    assert fixed_alarm / sims > 2 * ALPHA


def test_aa_full_decision_checked_at_4_looks_rarely_rolls_back():
    """120 A/A experiments through the whole verdict (8 guardrails incl. logprob and feedback,
    Holm, health checks), a random 50/50 split looked at every 1,000 requests up to 4,000: a
    false rollback in at most alpha of them, and the SRM check quiet."""
    rng = np.random.default_rng(2)
    sims, looks = 120, np.arange(1000, 4001, 1000)
    exp = Experiment("a", "b", shared_tokenizer=True, alpha=ALPHA)
    rollbacks = srm = 0
    for _ in range(sims):
        to_b = rng.random(looks[-1]) < 0.5
        a, b = stream(looks[-1], Effects(), rng), stream(looks[-1], Effects(), rng)
        rolled = False
        for total in looks:
            nb = int(to_b[:total].sum())
            result = analyse(exp, arm_at("a", a, total - nb, 0.5, 5), arm_at("b", b, nb, 0.5, 5))
            rolled |= result.decision == "rollback"
            srm += result.srm.alarm
        rollbacks += rolled
    assert rollbacks / sims <= ALPHA + allowance(ALPHA, sims)
    assert srm <= 2


@pytest.mark.parametrize("pt", [0.03, 0.04])
def test_error_rate_power_matches_theory(pt):
    """Errors 2% -> pt at 2,000 requests per arm, 1,000 simulated experiments."""
    rng = np.random.default_rng(3)
    sims, n = 1000, 2000
    xc, xt = rng.binomial(n, 0.02, sims), rng.binomial(n, pt, sims)
    spec = BY_NAME["error_rate"]
    hits = sum(evaluate_metric(spec, _arm("a", n, int(a)), _arm("b", n, int(b)), EXP).p_value_sequential <= ALPHA
               for a, b in zip(xc, xt))
    predicted = power_proportion(0.02, pt, n, EXP)
    assert abs(hits / sims - predicted) <= allowance(predicted, sims) + 0.03


@pytest.mark.parametrize("log_shift", [0.06, 0.1])
def test_ttft_power_matches_theory(log_shift):
    """TTFT 6% / 10% slower (lognormal, sigma 0.5) at 1,000 per arm, 300 experiments. Theory:
    the superiority P(T > C) - 1/2 of the two lognormals against U's null standard error."""
    rng = np.random.default_rng(4)
    sims, n = 300, 1000
    se = math.sqrt((2 * n + 1) / (12 * n * n))
    predicted = float(special.ndtr(theta_lognormal(log_shift) / se
                                   - seq.boundary(seq.rho2(ALPHA, EXP.tune_n) * n / 2, ALPHA)))
    spec = BY_NAME["ttft"]
    hits = 0
    for _ in range(sims):
        c, t = rng.lognormal(math.log(0.2), 0.5, n), rng.lognormal(math.log(0.2) + log_shift, 0.5, n)
        hits += evaluate_metric(spec, _arm("a", n, 0, c), _arm("b", n, 0, t), EXP).p_value_sequential <= ALPHA
    assert abs(hits / sims - predicted) <= allowance(predicted, sims) + 0.03
