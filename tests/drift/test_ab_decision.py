"""The decision: health checks first, the worse metric named and nothing else, promotion."""

from __future__ import annotations

import numpy as np

from inferwatch.drift.ab.decision import Experiment, analyse
from tests.support.ab_sim import Effects, arm_at, stream

EXP = Experiment("v1", "v2", (0.5, 0.5), shared_tokenizer=True)


def arms(n_control: int, n_treatment: int, effects: Effects = Effects(), seed: int = 0, reservoir: int = 500,
         feedback_every: int = 0):
    rng = np.random.default_rng(seed)
    a, b = stream(n_control, Effects(), rng), stream(n_treatment, effects, rng)
    return arm_at("v1", a, n_control, reservoir, feedback_every), arm_at("v2", b, n_treatment, reservoir, feedback_every)


def test_srm_fires_on_a_skewed_split_and_holds():
    result = analyse(Experiment("v1", "v2", (0.5, 0.5), assignments=(10_400, 9_600)), *arms(3000, 3000))
    assert result.srm.alarm and result.srm.source == "assignments"
    assert result.decision == "hold" and "sample ratio mismatch" in result.reasons[0]


def test_srm_quiet_on_a_fair_split_at_the_same_size():
    rng = np.random.default_rng(9)
    control, treatment = arms(300, 300)
    alarms = 0
    for _ in range(200):
        treated = int(rng.binomial(20_000, 0.1))
        r = analyse(Experiment("v1", "v2", (0.9, 0.1), assignments=(20_000 - treated, treated)), control, treatment)
        alarms += r.srm.alarm
    assert alarms <= 2  # expected 0.2 at p < 0.001


def test_srm_falls_back_to_record_counts():
    result = analyse(Experiment("v1", "v2", (0.9, 0.1)), *arms(1000, 1000))
    assert result.srm.source == "records" and result.srm.alarm  # 50/50 records against a 90/10 split


def test_no_traffic_on_an_arm_holds():
    control, treatment = arms(500, 500)
    result = analyse(Experiment("v1", "v2", (0.5, 0.5), assignments=(500, 0)), control, treatment)
    assert result.decision == "hold" and result.no_traffic == ("v2",)


def test_too_few_requests_holds():
    result = analyse(EXP, *arms(60, 60))
    assert result.decision == "hold" and "too few requests" in result.reasons[0]


def test_slower_first_token_rolls_back_naming_ttft_and_nothing_else():
    result = analyse(EXP, *arms(3000, 3000, Effects(ttft_factor=1.3)))
    assert result.decision == "rollback"
    assert result.worse == ["ttft"]
    ttft = result.metrics["ttft"]
    assert ttft.effect > 0 and ttft.relative > 0.15 and ttft.interval[0] > 0
    assert ttft.p95 is not None and ttft.p95.interval[0] > 0


def test_more_errors_and_truncations_roll_back():
    result = analyse(EXP, *arms(3000, 3000, Effects(error_rate=0.06, truncation_rate=0.2)))
    assert result.decision == "rollback"
    assert {"error_rate", "truncation_rate"} <= set(result.worse)
    assert result.metrics["error_rate"].test == "two_proportion_z"


def test_a_faster_canary_is_better_not_worse():
    result = analyse(EXP, *arms(3000, 3000, Effects(ttft_factor=0.7)))
    assert result.metrics["ttft"].verdict == "better" and result.decision != "rollback"


def test_logprob_only_with_a_shared_tokenizer():
    control, treatment = arms(3000, 3000, Effects(logprob_shift=-0.2))
    shared = analyse(EXP, control, treatment)
    assert shared.metrics["mean_logprob"].verdict == "worse" and shared.metrics["mean_logprob"].test == "welch"
    apart = analyse(Experiment("v1", "v2", (0.5, 0.5), shared_tokenizer=False), control, treatment)
    assert apart.metrics["mean_logprob"].status == "not_applicable"
    assert "tokenizer" in apart.metrics["mean_logprob"].note


def test_worse_feedback_rolls_back_and_missing_feedback_is_not_judged():
    result = analyse(EXP, *arms(4000, 4000, Effects(thumbs_up=0.5), feedback_every=4))
    assert result.metrics["feedback"].verdict == "worse"
    assert analyse(EXP, *arms(500, 500)).metrics["feedback"].status == "not_applicable"


def test_equal_variants_with_enough_traffic_promote():
    result = analyse(Experiment("v1", "v2", (0.5, 0.5), promote_requests=20_000), *arms(30_000, 30_000, seed=3))
    assert result.decision == "promote", result.reasons


def test_equal_variants_before_promote_requests_continue():
    result = analyse(EXP, *arms(600, 600, seed=4))
    assert result.decision == "continue" and any("promotion needs" in r for r in result.reasons)
