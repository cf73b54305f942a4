"""Simulated A/B traffic: a stream of requests assigned to two arms, turned into the arms the
verdict reads, at any prefix of the stream (a look), the way the drift window holds them:
exact counts on each feature's bins, and a bottom-R uniform sample of raw values. And what
theory predicts for it, which the tests and bench/ab_analysis.py compare the simulation with."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from inferwatch.drift.ab import sequential as seq
from inferwatch.drift.ab.decision import Arm, Experiment
from inferwatch.drift.binning import histogram
from inferwatch.drift.schema import FEATURES

RANK_FEATURES = ("ttft_s", "tpot_s", "e2e_s", "completion_tokens")


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


@dataclass(frozen=True)
class Stream:
    """One arm's requests in arrival order."""

    error: np.ndarray
    truncated: np.ndarray
    values: dict[str, np.ndarray]
    keys: np.ndarray  # random reservoir keys: the sample at a look is the R smallest so far
    thumbs: np.ndarray


def stream(n: int, effects: Effects, rng: np.random.Generator) -> Stream:
    error = rng.random(n) < effects.error_rate
    completion = np.maximum(1, np.round(rng.lognormal(4.0, 0.7, n) * effects.length_factor))
    ttft = rng.lognormal(np.log(0.2), 0.5, n) * effects.ttft_factor
    tpot = rng.lognormal(np.log(0.02), 0.3, n) * effects.tpot_factor
    values = {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": ttft + tpot * completion, "completion_tokens": completion,
              "mean_logprob": rng.normal(-1.2 + effects.logprob_shift, 0.4, n)}
    for name in values:  # a failed request has no latency or length record
        values[name] = np.where(error, np.nan, values[name])
    return Stream(error, ~error & (rng.random(n) < effects.truncation_rate), values, rng.random(n),
                  rng.random(n) < effects.thumbs_up)


def arm_at(name: str, s: Stream, n: int, reservoir: int, feedback_every: int = 0) -> Arm:
    """The arm after its first ``n`` requests."""
    counts, samples = {}, {}
    keep = np.argsort(s.keys[:n])[:reservoir]
    for feature, values in s.values.items():
        head = values[:n]
        if feature in RANK_FEATURES:
            counts[feature] = histogram(head, FEATURES[feature].edges).counts  # type: ignore[attr-defined]
        picked = head[keep]
        samples[feature] = picked[np.isfinite(picked)]
    ok = int(n - s.error[:n].sum())
    feedback = None
    if feedback_every:
        thumbs = s.thumbs[:n:feedback_every]
        feedback = (int(thumbs.sum()), int(thumbs.size))
    return Arm(name, n, int(s.error[:n].sum()), ok, int(s.truncated[:n].sum()), counts, samples, feedback)


def ttft_bin_probabilities(log_shift: float) -> np.ndarray:
    """Each TTFT bin's probability under ``stream``'s TTFT law (lognormal, median 0.2 s times
    e^log_shift, sigma 0.5); what falls outside the edges counts in the outer bins."""
    edges = FEATURES["ttft_s"].edges.values  # type: ignore[attr-defined]
    cdf = special.ndtr((np.log(edges) - (math.log(0.2) + log_shift)) / 0.5)
    p = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    return p[1:-1] + np.r_[p[0], np.zeros(p.size - 3)] + np.r_[np.zeros(p.size - 3), p[-1]]


def power_proportion(pc: float, pt: float, n: int, exp: Experiment) -> float:
    """P(always-valid p <= alpha at a look with n per arm) for error rates pc -> pt: the pooled
    z is about normal with mean delta / se0 and standard deviation se1 / se0."""
    pooled = (pc + pt) / 2
    se0 = math.sqrt(pooled * (1 - pooled) * 2 / n)
    se1 = math.sqrt((pc * (1 - pc) + pt * (1 - pt)) / n)
    b = seq.boundary(seq.rho2(exp.alpha, exp.tune_n) * n / 2, exp.alpha)
    return float(special.ndtr(((pt - pc) - b * se0) / se1))
