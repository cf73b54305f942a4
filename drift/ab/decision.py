"""The A/B verdict: health checks, one test per guardrail metric, Holm across them, and a
decision (rollback, hold, continue, promote) with its reasons.

Pure: arms and the experiment come in as data, so the service, the simulations and the
gateway's future end-to-end test all call the same function.

- Health first. A sample-ratio mismatch (chi-square of assignments against the weights at
  p < 0.001) or an arm without traffic means the comparison itself is broken: ``hold``,
  whatever the metrics say, until a person has looked.
- Every guardrail is judged by its always-valid p-value (``drift.ab.sequential``), and Holm's
  step-down across the guardrails keeps the chance of any false ``worse`` at alpha over all
  looks: each true null's p-value stays above alpha / k0 at every look with probability
  1 - alpha / k0, and Holm rejects a true null only below that.
- ``rollback`` when the treatment is worse on any guardrail; ``hold`` while either arm has
  fewer than ``min_requests``; ``promote`` once both arms have ``promote_requests`` and every
  judged guardrail's confidence sequence rules out harm beyond its margin; else ``continue``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from inferwatch.drift.ab import sequential as seq
from inferwatch.drift.ab import stats
from inferwatch.drift.ab.spec import METRICS, MetricSpec
from inferwatch.drift.calibration import holm

Decision = Literal["rollback", "hold", "continue", "promote"]
DECISIONS: tuple[Decision, ...] = ("rollback", "hold", "continue", "promote")
Status = Literal["ok", "insufficient_data", "not_applicable"]
Verdict = Literal["worse", "better", "non_inferior", "inconclusive", "insufficient_data", "not_applicable"]
MIN_SHIFT_SAMPLE = 20  # values per arm below which no Hodges-Lehmann shift is given
MIN_P95_SAMPLE = 100  # values per arm below which no p95 interval is given (needs n * 0.05 >> 1)
MIN_FEEDBACK = 30  # feedback trials per arm before feedback is judged


@dataclass(frozen=True)
class Arm:
    """One variant's share of the window. Counts are exact; ``counts`` holds each rank
    metric's values counted on the feature's fine grid (every request); ``samples`` is a
    uniform sample of raw values (the window's reservoir), used for effect sizes in the
    metric's unit and for Welch's test."""

    name: str
    requests: int
    errors: int
    finished: int  # requests that report a finish_reason
    truncated: int  # of those, finish_reason == "length"
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    feedback: tuple[int, int] | None = None  # (positive, total) feedback records


@dataclass(frozen=True)
class Experiment:
    control: str
    treatment: str
    weights: tuple[float, float]  # configured shares (control, treatment), summing to 1
    assignments: tuple[int, int] | None = None  # counted by the gateway at routing time
    shared_tokenizer: bool = False  # logprobs are comparable only under one tokenizer
    alpha: float = 0.05  # family-wise false-rollback rate over all looks
    srm_alpha: float = 0.001
    min_requests: int = 100
    promote_requests: int = 1000
    tune_n: float = 500.0  # effective sample size where the sequential tests are sharpest


@dataclass(frozen=True)
class MetricResult:
    spec: MetricSpec
    status: Status
    test: str
    n_control: int
    n_treatment: int
    control: float | None = None  # rate, median or mean of the control arm
    treatment: float | None = None
    effect: float | None = None  # treatment - control in the metric's unit (HL shift for ranks)
    relative: float | None = None  # effect / control
    interval: tuple[float, float] | None = None  # fixed-sample 1 - alpha interval of ``effect``
    relative_interval: tuple[float, float] | None = None
    p_value: float | None = None  # fixed-sample test, for reference
    p_value_sequential: float | None = None  # always-valid: what the decision uses
    sequential_scale: str = ""  # what ``sequential_effect`` measures
    sequential_effect: float | None = None
    confidence_sequence: tuple[float, float] | None = None
    p95: stats.QuantileDifference | None = None
    verdict: Verdict = "insufficient_data"
    note: str = ""


@dataclass(frozen=True)
class SampleRatioCheck:
    source: Literal["assignments", "records"]
    result: stats.SampleRatio
    alarm: bool


@dataclass(frozen=True)
class AbResult:
    experiment: Experiment
    decision: Decision
    reasons: tuple[str, ...]
    requests: tuple[int, int]
    srm: SampleRatioCheck
    no_traffic: tuple[str, ...]
    metrics: dict[str, MetricResult]

    @property
    def worse(self) -> list[str]:
        return [name for name, m in self.metrics.items() if m.verdict == "worse"]

    @property
    def treatment_share(self) -> float:
        total = sum(self.srm.result.observed)
        return self.srm.result.observed[1] / total if total else 0.0


def _proportion(spec: MetricSpec, xc: int, nc: int, xt: int, nt: int, exp: Experiment, minimum: int) -> MetricResult:
    if min(nc, nt) < minimum:
        return MetricResult(spec, "insufficient_data", "two_proportions", nc, nt,
                            note=f"fewer than {minimum} per arm")
    fixed = stats.two_proportions(xc, nc, xt, nt, exp.alpha)
    pooled = (xc + xt) / (nc + nt)
    se_null = math.sqrt(pooled * (1 - pooled) * (1 / nc + 1 / nt))
    z = fixed.difference / se_null if se_null > 0 else 0.0
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(nc, nt)
    # rates shrunk by half an event keep the sequence's width above zero when no arm has an event
    pc, pt = (xc + 0.5) / (nc + 1), (xt + 0.5) / (nt + 1)
    se = math.sqrt(pc * (1 - pc) / nc + pt * (1 - pt) / nt)
    relative_interval = None
    if fixed.relative is not None:
        relative_interval = (fixed.interval[0] / fixed.rate_control, fixed.interval[1] / fixed.rate_control)
    return MetricResult(spec, "ok", fixed.test, nc, nt, fixed.rate_control, fixed.rate_treatment, fixed.difference,
                        fixed.relative, fixed.interval, relative_interval, fixed.p_value,
                        float(seq.always_valid_p(z, v)), "rate difference", fixed.difference,
                        seq.confidence_sequence(fixed.difference, se, v, exp.alpha))


def _rank(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    feature = spec.feature or spec.name
    cc, ct = control.counts.get(feature), treatment.counts.get(feature)
    nc = int(cc.sum()) if cc is not None else 0
    nt = int(ct.sum()) if ct is not None else 0
    if cc is None or ct is None or min(nc, nt) < exp.min_requests:
        return MetricResult(spec, "insufficient_data", "mann_whitney", nc, nt,
                            note=f"fewer than {exp.min_requests} values per arm")
    rank = stats.mann_whitney_counts(cc, ct)
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(nc, nt)
    se = math.sqrt((nc + nt + 1) / (12 * nc * nt))  # of U / (mn) near 1/2
    theta = rank.superiority - 0.5
    sc, st = control.samples.get(feature, np.empty(0)), treatment.samples.get(feature, np.empty(0))
    note = (f"p-values from all {nc:,} / {nt:,} requests counted on the feature's bins; shift and p95 from "
            f"uniform samples of {sc.size:,} / {st.size:,}")
    result = MetricResult(spec, "ok", "mann_whitney", nc, nt, p_value=rank.p_value,
                          p_value_sequential=float(seq.always_valid_p(rank.z, v)),
                          sequential_scale="P(treatment > control) - 1/2", sequential_effect=theta,
                          confidence_sequence=seq.confidence_sequence(theta, se, v, exp.alpha), note=note)
    if min(sc.size, st.size) < MIN_SHIFT_SAMPLE:
        return result
    shift = stats.hodges_lehmann(sc, st, exp.alpha)
    median_c, median_t = float(np.median(sc)), float(np.median(st))
    rel = rel_interval = None
    if median_c > 0:
        rel = shift.estimate / median_c
        rel_interval = (shift.interval[0] / median_c, shift.interval[1] / median_c)
    p95 = stats.quantile_difference(sc, st, 0.95, exp.alpha) if min(sc.size, st.size) >= MIN_P95_SAMPLE else None
    return MetricResult(**{**result.__dict__, "control": median_c, "treatment": median_t, "effect": shift.estimate,
                           "relative": rel, "interval": shift.interval, "relative_interval": rel_interval,
                           "p95": p95})


def _mean(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    feature = spec.feature or spec.name
    sc, st = control.samples.get(feature, np.empty(0)), treatment.samples.get(feature, np.empty(0))
    if not exp.shared_tokenizer:
        return MetricResult(spec, "not_applicable", "welch", sc.size, st.size, verdict="not_applicable",
                            note="the variants do not share a tokenizer (shared_tokenizer=false): per-token "
                                 "logprobs are not comparable")
    if min(sc.size, st.size) < exp.min_requests:
        return MetricResult(spec, "insufficient_data", "welch", sc.size, st.size,
                            note=f"fewer than {exp.min_requests} values per arm")
    w = stats.welch(sc, st, exp.alpha)
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(sc.size, st.size)
    z = w.difference / w.se if w.se > 0 else 0.0
    rel = w.difference / abs(w.mean_control) if w.mean_control else None
    rel_interval = (w.interval[0] / abs(w.mean_control), w.interval[1] / abs(w.mean_control)) if rel is not None else None
    return MetricResult(spec, "ok", "welch", sc.size, st.size, w.mean_control, w.mean_treatment, w.difference, rel,
                        w.interval, rel_interval, w.p_value, float(seq.always_valid_p(z, v)), "difference of means",
                        w.difference, seq.confidence_sequence(w.difference, w.se, v, exp.alpha),
                        note=f"on uniform samples of {sc.size:,} / {st.size:,} values; the variants share a tokenizer")


def evaluate_metric(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """One guardrail, before Holm: its fixed-sample and always-valid results."""
    if spec.name == "error_rate":
        return _proportion(spec, control.errors, control.requests, treatment.errors, treatment.requests, exp,
                           exp.min_requests)
    if spec.name == "truncation_rate":
        return _proportion(spec, control.truncated, control.finished, treatment.truncated, treatment.finished, exp,
                           exp.min_requests)
    if spec.name == "feedback":
        if control.feedback is None or treatment.feedback is None:
            return MetricResult(spec, "not_applicable", "two_proportions", 0, 0, verdict="not_applicable",
                                note="no feedback counts given")
        (xc, nc), (xt, nt) = control.feedback, treatment.feedback
        return _proportion(spec, xc, nc, xt, nt, exp, MIN_FEEDBACK)
    if spec.kind == "rank":
        return _rank(spec, control, treatment, exp)
    return _mean(spec, control, treatment, exp)


def _judge(results: dict[str, MetricResult], alpha: float) -> dict[str, MetricResult]:
    judged = {name: r for name, r in results.items() if r.status == "ok"}
    rejected = holm({name: r.p_value_sequential for name, r in judged.items()}, alpha)  # type: ignore[misc]
    out = {}
    for name, r in results.items():
        if r.status != "ok":
            out[name] = MetricResult(**{**r.__dict__, "verdict": r.status})
            continue
        lo, hi = r.confidence_sequence  # type: ignore[misc]
        worst = hi if r.spec.direction == "higher_is_worse" else -lo
        if rejected[name]:
            verdict: Verdict = "worse" if r.spec.worse(r.sequential_effect) else "better"  # type: ignore[arg-type]
        else:
            verdict = "non_inferior" if worst <= r.spec.margin else "inconclusive"
        out[name] = MetricResult(**{**r.__dict__, "verdict": verdict})
    return out


def _describe(r: MetricResult) -> str:
    effect = ""
    if r.effect is not None:
        effect = f"{r.effect:+.4g}{' ' + r.spec.unit if r.spec.unit else ''}"
        if r.relative is not None:
            effect += f" ({r.relative:+.1%})"
        effect += ", "
    return (f"treatment {r.verdict} on {r.spec.name} ({r.spec.title}): {effect}always-valid p = "
            f"{r.p_value_sequential:.2g} (Holm across guardrails)")


def analyse(exp: Experiment, control: Arm, treatment: Arm) -> AbResult:
    requests = (control.requests, treatment.requests)
    observed, source = (exp.assignments, "assignments") if exp.assignments is not None else (requests, "records")
    srm = SampleRatioCheck(source, stats.sample_ratio(observed, exp.weights), False)  # type: ignore[arg-type]
    srm = SampleRatioCheck(srm.source, srm.result, sum(observed) > 0 and srm.result.p_value < exp.srm_alpha)
    empty = tuple(arm.name for arm, n, a in zip((control, treatment), requests, observed) if n == 0 or a == 0)
    metrics = _judge({spec.name: evaluate_metric(spec, control, treatment, exp) for spec in METRICS}, exp.alpha)
    worse = [m for m in metrics.values() if m.verdict == "worse"]
    reasons: list[str] = []
    if empty:
        reasons += [f"no traffic on {name}" for name in empty]
    if srm.alarm:
        share = srm.result.observed[1] / sum(srm.result.observed)
        reasons.append(f"sample ratio mismatch: treatment has {share:.2%} of {srm.source} against a weight of "
                       f"{srm.result.expected_share[1]:.2%} (chi-square p = {srm.result.p_value:.2g} < "
                       f"{exp.srm_alpha:g}): assignment or logging is broken, no metric can be trusted")
    if reasons:
        decision: Decision = "hold"
    elif worse:
        decision, reasons = "rollback", [_describe(m) for m in worse]
    elif min(requests) < exp.min_requests:
        decision = "hold"
        reasons = [f"too few requests to decide: {requests[0]:,} control / {requests[1]:,} treatment, "
                   f"{exp.min_requests:,} per arm needed"]
    else:
        judged = [m for m in metrics.values() if m.status == "ok"]
        open_ = [m.spec.name for m in judged if m.verdict != "non_inferior"]
        unjudged = [m.spec.name for m in metrics.values() if m.status == "insufficient_data"]
        if min(requests) >= exp.promote_requests and not open_ and metrics["error_rate"].status == "ok":
            decision = "promote"
            reasons = [f"no guardrail worse and {', '.join(m.spec.name for m in judged)} within their margins "
                       f"after {min(requests):,}+ requests per arm"]
        else:
            decision = "continue"
            reasons = ["no guardrail worse"]
            if open_:
                reasons.append(f"not yet shown within margin: {', '.join(open_)}")
            if min(requests) < exp.promote_requests:
                reasons.append(f"promotion needs {exp.promote_requests:,} requests per arm")
        if unjudged:
            reasons.append(f"not judged (too few values): {', '.join(unjudged)}")
    return AbResult(exp, decision, tuple(reasons), requests, srm, empty, metrics)
