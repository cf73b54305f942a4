"""The decision: health checks first, the worse metric named and nothing else, promotion.

Arms here are requests assigned one by one (each its own unit); users with many requests
each are in test_ab_units.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as sps

from inferwatch.drift.ab.decision import Arm, Experiment, analyse, sample_ratio_check
from inferwatch.drift.ab.units import COL, COLUMNS
from tests.support.ab_sim import Effects, arm_at, stream

EXP = Experiment("v1", "v2", shared_tokenizer=True)


def arms(n_control: int, n_treatment: int, effects: Effects = Effects(), seed: int = 0, feedback_every: int = 0,
         weights: tuple[float, float] = (0.5, 0.5)):
    rng = np.random.default_rng(seed)
    a, b = stream(n_control, Effects(), rng), stream(n_treatment, effects, rng)
    return (arm_at("v1", a, n_control, weights[0], feedback_every),
            arm_at("v2", b, n_treatment, weights[1], feedback_every))


def units_only(name: str, n: int, weight: float) -> Arm:
    units = np.zeros((n, len(COLUMNS)))
    units[:, COL["requests"]] = 1
    return Arm(name, units, n, weight)


def test_srm_fires_on_a_skewed_split_of_units_and_holds():
    result = analyse(EXP, units_only("v1", 10_400, 0.5), units_only("v2", 9_600, 0.5))
    assert result.srm.alarm and result.srm.result.observed == (10_400, 9_600)
    assert result.decision == "hold" and "sample ratio mismatch" in result.reasons[0]


def test_srm_against_the_epochs_own_weights():
    control, treatment = arms(9000, 1000, weights=(0.9, 0.1))
    assert not analyse(EXP, control, treatment).srm.alarm
    assert analyse(EXP, replace(control, weight=0.5), replace(treatment, weight=0.5)).srm.alarm


def test_srm_quiet_on_fair_splits():
    rng = np.random.default_rng(9)
    alarms = 0
    for _ in range(300):
        treated = int(rng.binomial(20_000, 0.1))
        control, treatment = units_only("v1", 20_000 - treated, 0.9), units_only("v2", treated, 0.1)
        alarms += sample_ratio_check(EXP, control, treatment).alarm
    assert alarms <= 2  # expected at most 0.3 at p < 0.001


def test_a_small_experiment_that_lost_half_an_arm_is_held_by_the_fixed_horizon_check():
    """150 / 75 units: the always-valid test cannot see it (its boundary stays above about 4.2
    standard errors), Pearson's chi-square on the units seen can (scipy's is the truth)."""
    result = analyse(EXP, units_only("v1", 150, 0.5), units_only("v2", 75, 0.5))
    truth = sps.chisquare([150, 75])
    assert result.srm.p_value_sequential > EXP.srm_alpha and not result.srm.alarm_sequential
    assert result.srm.result.p_value == pytest.approx(truth.pvalue, rel=1e-9) and truth.pvalue < EXP.srm_alpha
    assert result.srm.alarm_fixed and result.decision == "hold"
    assert "chi-square on the units seen" in result.reasons[0]


def test_a_promote_needs_the_split_to_look_right_not_merely_no_alarm():
    """30,000 / 29,500 units: no alarm at p < 0.001, but a chi-square p of 0.04 is not a split
    to promote on; the same arms with the split as weighed promote."""
    control, treatment = arms(30_000, 30_000, seed=3)
    exp = replace(EXP, promote_units=20_000)
    assert analyse(exp, control, treatment).decision == "promote"
    short = replace(treatment, units=treatment.units[:29_500], requests=29_500)
    result = analyse(exp, control, short)
    assert not result.srm.alarm and EXP.srm_alpha < result.srm.result.p_value < EXP.srm_promote_p
    assert result.decision == "continue"
    assert any("promotion needs the split to look right" in r for r in result.reasons), result.reasons


def test_no_traffic_on_an_arm_holds():
    control, _ = arms(500, 500)
    result = analyse(EXP, control, arm_at("v2", stream(0, Effects(), np.random.default_rng(1)), 0, 0.5))
    assert result.decision == "hold" and result.no_traffic == ("v2",)


def test_unknown_or_conflicting_weights_hold():
    control, treatment = arms(500, 500)
    unknown = analyse(EXP, control, replace(treatment, weight=None))
    assert unknown.decision == "hold" and unknown.srm is None and "unknown" in unknown.reasons[0]
    reused = analyse(EXP, control, replace(treatment, weight_conflicts=12))
    assert reused.decision == "hold" and "reused an epoch" in reused.reasons[0]


def test_too_few_units_holds():
    result = analyse(EXP, *arms(20, 20))
    assert result.decision == "hold" and "too few units" in result.reasons[0]


def test_slower_first_token_rolls_back_naming_ttft_and_nothing_else():
    result = analyse(EXP, *arms(3000, 3000, Effects(ttft_factor=1.3)))
    assert result.decision == "rollback"
    assert set(result.worse) == {"ttft", "ttft_per_request"}
    per_request = result.metrics["ttft_per_request"]
    assert per_request.test == "delta_method_log_ratio" and per_request.relative == pytest.approx(0.3, abs=0.06)
    ttft = result.metrics["ttft"]
    assert ttft.effect > 0 and ttft.relative > 0.15 and ttft.interval[0] > 0
    assert ttft.p95 is not None and ttft.p95.interval[0] > 0


def test_more_errors_and_truncations_roll_back():
    result = analyse(EXP, *arms(3000, 3000, Effects(error_rate=0.06, truncation_rate=0.2)))
    assert result.decision == "rollback"
    assert {"error_rate", "truncation_rate"} <= set(result.worse)
    assert result.metrics["error_rate"].test == "delta_method"


def test_a_repeating_canary_with_empty_answers_rolls_back_naming_them_and_nothing_else():
    result = analyse(EXP, *arms(3000, 3000, Effects(repetition_a=4.0, empty_rate=0.03)))
    assert result.decision == "rollback"
    assert set(result.worse) == {"repetition_rate", "empty_rate"}
    assert result.metrics["repetition_rate"].test == "mann_whitney_units"
    empty = result.metrics["empty_rate"]
    assert empty.test == "delta_method" and empty.interval[0] > 0


def test_a_faster_canary_is_better_not_worse():
    result = analyse(EXP, *arms(3000, 3000, Effects(ttft_factor=0.7)))
    assert result.metrics["ttft"].verdict == "better" and result.decision != "rollback"


def test_logprob_only_with_a_shared_tokenizer():
    control, treatment = arms(3000, 3000, Effects(logprob_shift=-0.2))
    shared = analyse(EXP, control, treatment)
    assert shared.metrics["mean_logprob"].verdict == "worse" and shared.metrics["mean_logprob"].test == "welch_units"
    apart = analyse(replace(EXP, shared_tokenizer=False), control, treatment)
    assert apart.metrics["mean_logprob"].status == "not_applicable"
    assert "tokenizer" in apart.metrics["mean_logprob"].note


def test_worse_feedback_rolls_back_and_missing_feedback_is_not_judged():
    result = analyse(EXP, *arms(4000, 4000, Effects(thumbs_up=0.5), feedback_every=4))
    assert result.metrics["feedback"].verdict == "worse"
    assert analyse(EXP, *arms(500, 500)).metrics["feedback"].status == "insufficient_data"


def test_equal_variants_with_enough_traffic_promote():
    result = analyse(replace(EXP, promote_units=20_000), *arms(30_000, 30_000, seed=3))
    assert result.decision == "promote", result.reasons


def test_equal_variants_before_promote_units_continue():
    result = analyse(EXP, *arms(250, 250, seed=4))
    assert result.decision == "continue" and any("promotion needs" in r for r in result.reasons)
