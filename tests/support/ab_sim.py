"""Simulated A/B traffic assigned request by request (requests without a unit key): a stream
of requests per arm, turned into the arm the verdict reads at any prefix of the stream (a
look), each request a unit of its own. And what theory predicts for it, which the tests and
bench/ab_analysis.py compare the simulation with. Users with many requests each are in
tests/support/ab_simulation.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from inferwatch.drift.ab import sequential as seq
from inferwatch.drift.ab.decision import Arm, Experiment
from inferwatch.drift.ab.units import COL, UNIT_FEATURES, record_values


@dataclass(frozen=True)
class Effects:
    """What the treatment changes: multiplicative latency factor, rates, length factor."""

    error_rate: float = 0.02
    truncation_rate: float = 0.10
    ttft_factor: float = 1.0
    tpot_factor: float = 1.0
    length_factor: float = 1.0
    logprob_shift: float = 0.0
    thumbs_up: float = 0.7
    repetition_a: float = 1.0  # repetition ~ Beta(a, 60): mean a / (a + 60)
    empty_rate: float = 0.002


@dataclass(frozen=True)
class Stream:
    """One arm's requests in arrival order."""

    error: np.ndarray
    truncated: np.ndarray
    values: dict[str, np.ndarray]
    thumbs: np.ndarray
    units: np.ndarray  # each request's row of per-unit sums: a look at n requests is the first n rows


def stream(n: int, effects: Effects, rng: np.random.Generator) -> Stream:
    error = rng.random(n) < effects.error_rate
    completion = np.maximum(1, np.round(rng.lognormal(4.0, 0.7, n) * effects.length_factor))
    ttft = rng.lognormal(np.log(0.2), 0.5, n) * effects.ttft_factor
    tpot = rng.lognormal(np.log(0.02), 0.3, n) * effects.tpot_factor
    values = {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": ttft + tpot * completion, "completion_tokens": completion,
              "mean_logprob": rng.normal(-1.2 + effects.logprob_shift, 0.4, n)}
    more = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])  # leaves rng's own draws as they were
    values["repetition"] = more.beta(effects.repetition_a, 60.0, n)
    empty = more.random(n) < effects.empty_rate
    for name in values:  # a failed request has no latency or length record
        values[name] = np.where(error, np.nan, values[name])
    truncated = ~error & (rng.random(n) < effects.truncation_rate)
    reasons = np.where(error, None, np.where(truncated, "length", "stop")).tolist()
    units = record_values(np.where(error, 500, 200), reasons, {f: values[f] for f in UNIT_FEATURES},
                          np.where(error, None, np.where(empty, "empty", "text")).tolist())
    return Stream(error, truncated, values, rng.random(n) < effects.thumbs_up, units)


def arm_at(name: str, s: Stream, n: int, weight: float = 0.5, feedback_every: int = 0) -> Arm:
    """The arm after its first ``n`` requests, each its own unit."""
    units = s.units[:n].copy()
    feedback = (0, 0)
    if feedback_every:
        rated = np.arange(0, n, feedback_every)
        units[rated, COL["feedback_total"]] = 1
        units[rated, COL["feedback_positive"]] = s.thumbs[rated]
        feedback = (int(s.thumbs[rated].sum()), int(rated.size))
    return Arm(name, units, n, weight, 0, feedback)


def theta_lognormal(log_shift: float, sigma: float = 0.5) -> float:
    """P(T > C) - 1/2 for lognormal arms ``log_shift`` apart: what Mann-Whitney estimates."""
    return float(special.ndtr(log_shift / (sigma * math.sqrt(2)))) - 0.5


def power_proportion(pc: float, pt: float, n: int, exp: Experiment) -> float:
    """P(always-valid p <= alpha at a look with n per arm) for error rates pc -> pt, a request
    per unit: the delta-method z is about normal with mean delta / se and unit variance."""
    se = math.sqrt((pc * (1 - pc) + pt * (1 - pt)) / n)
    b = seq.boundary(seq.rho2(exp.alpha, exp.tune_n) * n / 2, exp.alpha)
    return float(special.ndtr((pt - pc) / se - b))
