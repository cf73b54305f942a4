"""The A/B verdict: health checks, one test per guardrail metric, Holm across them, and a
decision (rollback, hold, continue, promote) with its reasons.

Pure: arms and the experiment come in as data, so the service and the simulations call the
same function. An arm is one variant in one weight epoch; its unit of analysis is the unit
of randomization (the user the gateway assigned, or the request assigned on its own):

- rates per request (errors, truncations, positive ratings) by the delta method over units
  (Deng, Knoblich & Lu 2018), which keeps the request-level quantity an SRE reads on the
  dashboards and gives it the variance that clustering in heavy users implies;
- latencies and answer lengths by each unit's mean, compared by rank across units: under
  the null, with users randomized, these per-unit summaries are exchangeable between arms,
  so the test is valid however unequal the users, and the rank keeps it robust to the
  heavy tails a mean-based delta method would carry into its variance;
- the latencies again as means per request (a ratio of sums over units, its variance by the
  delta method, compared on the log scale): the rank test speaks for the typical user, and
  a regression that only the heaviest users meet (a tenth of the users, near half the
  requests) moves few unit means but many requests.

- Health first. A sample-ratio mismatch (units per arm against the epoch's weights,
  always-valid p < 0.001), an arm without traffic or an epoch with two weights means the
  comparison itself is broken: ``hold``, whatever the metrics say, until a person has looked.
- Every guardrail is judged by its always-valid p-value (``drift.ab.sequential``), and Holm's
  step-down across the guardrails keeps the chance of any false ``worse`` at alpha over all
  looks: each true null's p-value stays above alpha / k0 at every look with probability
  1 - alpha / k0, and Holm rejects a true null only below that.
- ``rollback`` when the treatment is worse on any guardrail; ``hold`` while either arm has
  fewer than ``min_units``; ``promote`` once both arms have ``promote_units`` and every
  judged guardrail's confidence sequence rules out harm beyond its margin; else ``continue``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats as sps

from inferwatch.drift.ab import sequential as seq, stats
from inferwatch.drift.ab.cuped import adjust
from inferwatch.drift.ab.spec import METRICS, Kind, MetricSpec
from inferwatch.drift.ab.units import COL, COLUMNS, FEEDBACK_COUNTS, lead_in_means, unit_means
from inferwatch.drift.calibration import holm

Decision = Literal["rollback", "hold", "continue", "promote"]
DECISIONS: tuple[Decision, ...] = ("rollback", "hold", "continue", "promote")
Status = Literal["ok", "insufficient_data", "not_applicable"]
Verdict = Literal["worse", "better", "non_inferior", "inconclusive", "insufficient_data", "not_applicable"]
MIN_P95_SAMPLE = 100  # units per arm below which no p95 interval is given (needs n * 0.05 >> 1)
SHIFT_SAMPLE = 1000  # units per arm the Hodges-Lehmann shift is computed on (its cost grows with m n)


@dataclass(frozen=True)
class Arm:
    """One variant in one weight epoch: every request and rating counted, and the per-unit
    sums of the units kept (``drift.ab.units``), which every test runs on."""

    name: str
    units: np.ndarray = field(default_factory=lambda: np.zeros((0, len(COLUMNS))))
    requests: int = 0  # every record of the epoch, kept unit or not
    weight: float | None = None  # the variant's weight in the epoch, as its records say
    weight_conflicts: int = 0  # records that said another weight
    feedback: tuple[int, int] = (0, 0)  # every rating: (positive, total)
    sampled: float = 1.0  # share of units kept
    # output tokens per GPU-second, one sample per 5 minutes, paired in time with the other
    # arm's (drift/ab/cost.py); the note says why there are none
    throughput: np.ndarray | None = None
    throughput_note: str = "the drift service reads no Prometheus for the cost guardrail"
    # each unit's sums in the experiment's lead-in (an epoch with every unit on the control),
    # rows aligned with ``units``, zeros for a unit without: the CUPED covariate (drift/ab/cuped.py)
    before: np.ndarray | None = None

    @property
    def unit_count(self) -> int:
        """Units (kept) that sent requests: what the sample-ratio check counts."""
        return int(np.count_nonzero(self.units[:, COL["requests"]] > 0))


@dataclass(frozen=True)
class Experiment:
    control: str
    treatment: str
    shared_tokenizer: bool = False  # logprobs are comparable only under one tokenizer
    alpha: float = 0.05  # false-rollback rate over all looks at this epoch (spent from the experiment's)
    srm_alpha: float = 0.001  # false sample-ratio alarms: over all looks (always-valid), at each look (fixed)
    srm_promote_p: float = 0.1  # a promote needs the split to look right: the fixed-horizon p at least this
    min_units: int = 30
    promote_units: int = 300
    tune_n: float = 500.0  # effective units where the sequential tests are sharpest
    srm_tune_n: float = 10_000.0  # units where the sample-ratio check is sharpest (small skews show late)


@dataclass(frozen=True)
class MetricResult:
    spec: MetricSpec
    status: Status
    test: str
    n_control: int  # units
    n_treatment: int
    control: float | None = None  # rate, median of unit means or mean of unit means of the control arm
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
    """Units per arm against the epoch's weights, two ways.

    The always-valid test on the treatment's share (the binomial z under the normal mixture)
    keeps its false-alarm rate however often it is looked at, but its boundary never falls
    below about 4.2 standard errors at alpha = 0.001, and only near the size it is tuned at:
    blind to a split that lost half of one arm's 150 users. Pearson's chi-square on the units
    seen has the power there (3.29 standard errors) at the price of up to ``srm_alpha`` false
    alarms per look, not per experiment. A false hold costs a wait; a broken split judged
    costs a wrong decision, so either test holds. A promote asks more than no alarm: the
    chi-square must find the split unremarkable (p >= ``srm_promote_p``), so a split that
    lost a tenth of an arm is not promoted for lack of an alarm."""

    result: stats.SampleRatio  # Pearson's chi-square on the units seen (fixed horizon)
    p_value_sequential: float
    alarm_sequential: bool
    alarm_fixed: bool
    looks_right: bool  # fixed-horizon p >= srm_promote_p: what a promote needs

    @property
    def alarm(self) -> bool:
        return self.alarm_sequential or self.alarm_fixed


@dataclass(frozen=True)
class AbResult:
    experiment: Experiment
    decision: Decision
    reasons: tuple[str, ...]
    requests: tuple[int, int]
    units: tuple[int, int]
    srm: SampleRatioCheck | None  # None while an arm's weight is unknown
    no_traffic: tuple[str, ...]
    metrics: dict[str, MetricResult]

    @property
    def worse(self) -> list[str]:
        return [name for name, m in self.metrics.items() if m.verdict == "worse"]

    @property
    def treatment_share(self) -> float:
        total = sum(self.units)
        return self.units[1] / total if total else 0.0


def _proportion(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """A per-request rate over units (errors, truncations, positive ratings): delta method on
    the spec's numerator and denominator columns."""
    assert spec.numerator is not None and spec.denominator is not None  # MetricSpec checks a proportion's
    x, n, minimum = spec.numerator, spec.denominator, spec.min_units or exp.min_units
    cols = [arm.units[arm.units[:, COL[n]] > 0] for arm in (control, treatment)]
    kc, kt = (c.shape[0] for c in cols)
    if min(kc, kt) < minimum:
        return MetricResult(spec, "insufficient_data", "delta_method", kc, kt, note=f"fewer than {minimum} units per arm")
    (xc, nc), (xt, nt) = ((c[:, COL[x]], c[:, COL[n]]) for c in cols)
    d = stats.ratio_difference(xc, nc, xt, nt, exp.alpha)
    z = d.difference / d.se if d.se > 0 else 0.0
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(kc, kt)
    # rates shrunk by half an event keep the sequence's width above zero when no arm has an event
    shrunk = [(float(a.sum()) + 0.5) / (float(b.sum()) + 1) for a, b in ((xc, nc), (xt, nt))]
    floor = math.sqrt(sum(r * (1 - r) / float(b.sum()) for r, b in zip(shrunk, (nc, nt))))
    relative_interval = None
    if d.relative is not None:
        relative_interval = (d.interval[0] / d.rate_control, d.interval[1] / d.rate_control)
    counted = "ratings" if n in FEEDBACK_COUNTS else "requests"
    note = (f"{int(nc.sum()):,} / {int(nt.sum()):,} {counted} from {kc:,} / {kt:,} units; variance by the delta "
            "method over units")
    return MetricResult(spec, "ok", "delta_method", kc, kt, d.rate_control, d.rate_treatment, d.difference,
                        d.relative, d.interval, relative_interval, d.p_value, float(seq.always_valid_p(z, v)),
                        "rate difference", d.difference,
                        seq.confidence_sequence(d.difference, max(d.se, floor), v, exp.alpha), note=note)


def _rank(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """Latency and length: each unit's mean, compared across units by rank; adjusted by each
    unit's lead-in (CUPED) when the experiment had one."""
    feature = spec.feature or spec.name
    mc, mt = unit_means(control.units, feature), unit_means(treatment.units, feature)
    nc, nt = mc.size, mt.size
    if min(nc, nt) < exp.min_units:
        return MetricResult(spec, "insufficient_data", "mann_whitney_units", nc, nt,
                            note=f"fewer than {exp.min_units} units per arm with values")
    p95 = stats.quantile_difference(mc, mt, 0.95, exp.alpha) if min(nc, nt) >= MIN_P95_SAMPLE else None
    raw_median_c, raw_median_t = float(np.median(mc)), float(np.median(mt))
    cuped = ""
    if control.before is not None and treatment.before is not None:
        a = adjust(mc, lead_in_means(control.units, control.before, feature),
                   mt, lead_in_means(treatment.units, treatment.before, feature))
        if a.with_lead_in:
            mc, mt = a.control, a.treatment
            cuped = (f"; CUPED: adjusted by the lead-in means of {a.with_lead_in:,} units (theta {a.theta:.3g}, "
                     f"R^2 {a.r2:.2f})")
    rank = stats.mann_whitney(mc, mt)
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(nc, nt)
    se = math.sqrt((nc + nt + 1) / (12 * nc * nt))  # of U / (mn) near 1/2
    theta = rank.superiority - 0.5
    shift = stats.hodges_lehmann(_sample(mc), _sample(mt), exp.alpha)
    rel = rel_interval = None
    if raw_median_c > 0:
        rel = shift.estimate / raw_median_c
        rel_interval = (shift.interval[0] / raw_median_c, shift.interval[1] / raw_median_c)
    return MetricResult(spec, "ok", "mann_whitney_units", nc, nt, raw_median_c, raw_median_t, shift.estimate, rel,
                        shift.interval, rel_interval, rank.p_value, float(seq.always_valid_p(rank.z, v)),
                        "P(treatment unit > control unit) - 1/2", theta,
                        seq.confidence_sequence(theta, se, v, exp.alpha), p95,
                        note=f"per-unit means of {nc:,} / {nt:,} units, all in the test; the shift from a uniform "
                             f"sample of at most {SHIFT_SAMPLE:,} per arm, its interval including that sampling{cuped}")


def _request_mean(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """A latency's mean per request: sum over units / requests over units in each arm, the
    log of their ratio by the delta method over units (Deng, Knoblich & Lu 2018)."""
    feature = spec.feature or spec.name
    n_col, sum_col = COL[f"{feature}:n"], COL[f"{feature}:sum"]
    cols = [arm.units[arm.units[:, n_col] > 0] for arm in (control, treatment)]
    kc, kt = (c.shape[0] for c in cols)
    if min(kc, kt) < exp.min_units:
        return MetricResult(spec, "insufficient_data", "delta_method_log_ratio", kc, kt,
                            note=f"fewer than {exp.min_units} units per arm with values")
    (rc, vc), (rt, vt) = (stats.ratio_and_variance(c[:, sum_col], c[:, n_col]) for c in cols)
    if rc <= 0 or rt <= 0:
        return MetricResult(spec, "insufficient_data", "delta_method_log_ratio", kc, kt,
                            note="a mean of zero has no log ratio")
    log_ratio = math.log(rt / rc)
    se = math.sqrt(vc / rc**2 + vt / rt**2)
    z = log_ratio / se if se > 0 else 0.0
    half = stats.z_quantile(exp.alpha) * se
    diff_half = stats.z_quantile(exp.alpha) * math.sqrt(vc + vt)
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(kc, kt)
    requests = [int(c[:, n_col].sum()) for c in cols]
    return MetricResult(spec, "ok", "delta_method_log_ratio", kc, kt, rc, rt, rt - rc, math.expm1(log_ratio),
                        (rt - rc - diff_half, rt - rc + diff_half),
                        (math.expm1(log_ratio - half), math.expm1(log_ratio + half)),
                        stats.two_sided_normal_p(z) if se > 0 else 1.0, float(seq.always_valid_p(z, v)),
                        "log(treatment mean / control mean), per request", log_ratio,
                        seq.confidence_sequence(log_ratio, se, v, exp.alpha),
                        note=f"mean over {requests[0]:,} / {requests[1]:,} requests from {kc:,} / {kt:,} units: "
                             "heavy users weigh by their requests; variance by the delta method over units")


def _sample(values: np.ndarray) -> np.ndarray:
    """At most SHIFT_SAMPLE of ``values``, uniformly, the same on every replica and look."""
    if values.size <= SHIFT_SAMPLE:
        return values
    return values[np.random.default_rng(values.size).choice(values.size, SHIFT_SAMPLE, replace=False)]


def _mean(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    feature = spec.feature or spec.name
    mc, mt = unit_means(control.units, feature), unit_means(treatment.units, feature)
    if not exp.shared_tokenizer:
        return MetricResult(spec, "not_applicable", "welch_units", mc.size, mt.size, verdict="not_applicable",
                            note="the variants do not share a tokenizer (shared_tokenizer=false): per-token "
                                 "logprobs are not comparable")
    if min(mc.size, mt.size) < exp.min_units:
        return MetricResult(spec, "insufficient_data", "welch_units", mc.size, mt.size,
                            note=f"fewer than {exp.min_units} units per arm with values")
    w = stats.welch(mc, mt, exp.alpha)
    v = seq.rho2(exp.alpha, exp.tune_n) * seq.effective_n(mc.size, mt.size)
    z = w.difference / w.se if w.se > 0 else 0.0
    rel = w.difference / abs(w.mean_control) if w.mean_control else None
    rel_interval = (w.interval[0] / abs(w.mean_control), w.interval[1] / abs(w.mean_control)) if rel is not None else None
    return MetricResult(spec, "ok", "welch_units", mc.size, mt.size, w.mean_control, w.mean_treatment, w.difference,
                        rel, w.interval, rel_interval, w.p_value, float(seq.always_valid_p(z, v)),
                        "difference of means", w.difference, seq.confidence_sequence(w.difference, w.se, v, exp.alpha),
                        note=f"per-unit means of {mc.size:,} / {mt.size:,} units; the variants share a tokenizer")


MIN_COST_SAMPLES = 6  # 5-minute samples per arm: half an hour
EQUAL_LOAD = 0.8  # the smaller weight over the larger, at least, for throughputs to compare


def _cost(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """Output tokens per GPU-second, paired in time: the mean log ratio of the treatment's to
    the control's, a t-test on it. A GPU's throughput grows with its batch, so the arms are
    compared only at equal shares of traffic: a canary at 5 % on GPUs of its own batches less
    and is slower per GPU for its load, not for its build."""
    c, t = control.throughput, treatment.throughput
    if c is None or t is None:
        return MetricResult(spec, "not_applicable", "paired_log_ratio", 0, 0, note=control.throughput_note)
    if control.weight is None or treatment.weight is None or min(control.weight, treatment.weight) < EQUAL_LOAD * max(
            control.weight, treatment.weight):
        return MetricResult(spec, "not_applicable", "paired_log_ratio", c.size, t.size,
                            note="judged at equal weights only: a variant's throughput per GPU grows with its "
                                 f"share of traffic (weights {control.weight} / {treatment.weight})")
    both = (c > 0) & (t > 0) & np.isfinite(c) & np.isfinite(t)
    d = np.log(t[both]) - np.log(c[both])
    n = d.size
    if n < MIN_COST_SAMPLES:
        return MetricResult(spec, "insufficient_data", "paired_log_ratio", n, n,
                            note=f"{n} paired 5-minute samples; at least {MIN_COST_SAMPLES} are needed")
    mean = float(d.mean())
    se = max(float(d.std(ddof=1)) / math.sqrt(n), 1e-9)
    half = float(sps.t.ppf(1 - exp.alpha / 2, n - 1)) * se
    z = mean / se
    v = seq.rho2(exp.alpha, exp.tune_n) * n
    median_c, median_t = float(np.median(c[both])), float(np.median(t[both]))
    return MetricResult(spec, "ok", "paired_log_ratio", n, n, median_c, median_t, mean, math.expm1(mean),
                        (mean - half, mean + half), (math.expm1(mean - half), math.expm1(mean + half)),
                        float(2 * sps.t.sf(abs(z), n - 1)), float(seq.always_valid_p(z, v)),
                        "mean log(treatment / control)", mean, seq.confidence_sequence(mean, se, v, exp.alpha),
                        note=f"{n} paired 5-minute samples of output tokens per GPU-second; effect and interval "
                             "on the log scale, relative as a ratio - 1")


Evaluator = Callable[[MetricSpec, Arm, Arm, Experiment], MetricResult]
# How each kind is computed, and the name its results carry (MetricResult.method)
BY_KIND: dict[Kind, tuple[Evaluator, str]] = {
    "proportion": (_proportion, "delta_method"),
    "rank": (_rank, "mann_whitney_units"),
    "request_mean": (_request_mean, "delta_method_log_ratio"),
    "mean": (_mean, "welch_units"),
    "throughput": (_cost, "paired_log_ratio"),
}


def evaluate_metric(spec: MetricSpec, control: Arm, treatment: Arm, exp: Experiment) -> MetricResult:
    """One guardrail, before Holm: its fixed-sample and always-valid results, by its kind."""
    evaluate, _ = BY_KIND[spec.kind]
    return evaluate(spec, control, treatment, exp)


def sample_ratio_check(exp: Experiment, control: Arm, treatment: Arm) -> SampleRatioCheck | None:
    """None while a weight is unknown. An arm with units at weight 0 is a mismatch outright
    (its chi-square is infinite, its p-value 0)."""
    if control.weight is None or treatment.weight is None:
        return None
    observed = (control.unit_count, treatment.unit_count)
    weights = (control.weight, treatment.weight)
    if sum(weights) <= 0:
        return None
    starved = [n for n, w in zip(observed, weights) if w == 0]
    if starved:
        shares = tuple(w / sum(weights) for w in weights)
        broken = bool(any(starved))
        fixed = stats.SampleRatio(observed, shares, math.inf if broken else 0.0, 0.0 if broken else 1.0)
        return SampleRatioCheck(fixed, fixed.p_value, broken, broken, not broken)
    fixed = stats.sample_ratio(observed, weights)
    total, share = sum(observed), fixed.expected_share[1]
    if total == 0:
        return SampleRatioCheck(fixed, 1.0, False, False, True)
    z = (observed[1] - total * share) / math.sqrt(total * share * (1 - share))
    p = float(seq.always_valid_p(z, seq.rho2(exp.srm_alpha, exp.srm_tune_n) * total))
    return SampleRatioCheck(fixed, p, p < exp.srm_alpha, fixed.p_value < exp.srm_alpha,
                            fixed.p_value >= exp.srm_promote_p)


def _judge(results: dict[str, MetricResult], alpha: float) -> dict[str, MetricResult]:
    judged = {name: r for name, r in results.items() if r.status == "ok"}
    rejected = holm({name: r.p_value_sequential for name, r in judged.items()}, alpha)  # type: ignore[misc]  # ok: set
    out = {}
    for name, r in results.items():
        if r.status != "ok":
            out[name] = MetricResult(**{**r.__dict__, "verdict": r.status})
            continue
        lo, hi = r.confidence_sequence  # type: ignore[misc]  # an ok result carries one
        worst = hi if r.spec.direction == "higher_is_worse" else -lo
        if rejected[name]:
            verdict: Verdict = "worse" if r.spec.worse(r.sequential_effect) else "better"  # type: ignore[arg-type]  # ok: set
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


def _health(exp: Experiment, control: Arm, treatment: Arm, srm: SampleRatioCheck | None,
            empty: tuple[str, ...]) -> list[str]:
    """Why no metric can be trusted yet, if anything says so."""
    reasons = [f"no traffic on {name}" for name in empty]
    for arm in (control, treatment):
        if arm.weight_conflicts:
            reasons.append(f"{arm.weight_conflicts:,} records of {arm.name} gave another weight than {arm.weight:g} "
                           "in this epoch: the gateway reused an epoch (its weights state was lost?); set the "
                           "weights again to start a new epoch")
    if srm is None and not empty:
        reasons.append("the weights of this epoch are unknown: its records carry none, or weight 0 for both variants")
    elif srm is not None and srm.alarm and srm.result.p_value == 0.0 and math.isinf(srm.result.statistic):
        starved = [a.name for a in (control, treatment) if a.weight == 0]
        reasons.append(f"sample ratio mismatch: {', '.join(starved)} has weight 0 in this epoch but units: assignment "
                       "or logging is broken, no metric can be trusted")
    elif srm is not None and srm.alarm:
        share = srm.result.observed[1] / sum(srm.result.observed)
        which = (f"always-valid p = {srm.p_value_sequential:.2g}" if srm.alarm_sequential
                 else f"chi-square on the units seen p = {srm.result.p_value:.2g}")
        reasons.append(f"sample ratio mismatch: treatment has {share:.2%} of the units against a weight share of "
                       f"{srm.result.expected_share[1]:.2%} ({which} < {exp.srm_alpha:g}): assignment or "
                       "logging is broken, no metric can be trusted")
    return reasons


def analyse(exp: Experiment, control: Arm, treatment: Arm) -> AbResult:
    requests = (control.requests, treatment.requests)
    units = (control.unit_count, treatment.unit_count)
    srm = sample_ratio_check(exp, control, treatment)
    empty = tuple(arm.name for arm in (control, treatment) if arm.requests == 0)
    metrics = _judge({spec.name: evaluate_metric(spec, control, treatment, exp) for spec in METRICS}, exp.alpha)
    worse = [m for m in metrics.values() if m.verdict == "worse"]
    reasons = _health(exp, control, treatment, srm, empty)
    if reasons:
        decision: Decision = "hold"
    elif worse:
        decision, reasons = "rollback", [_describe(m) for m in worse]
    elif min(units) < exp.min_units:
        decision = "hold"
        reasons = [f"too few units to decide: {units[0]:,} control / {units[1]:,} treatment, "
                   f"{exp.min_units:,} per arm needed"]
    else:
        judged = [m for m in metrics.values() if m.status == "ok"]
        open_ = [m.spec.name for m in judged if m.verdict != "non_inferior"]
        unjudged = [m.spec.name for m in metrics.values() if m.status == "insufficient_data"]
        split_doubtful = srm is not None and not srm.looks_right
        if min(units) >= exp.promote_units and not open_ and metrics["error_rate"].status == "ok" \
                and not split_doubtful:
            decision = "promote"
            reasons = [f"no guardrail worse and {', '.join(m.spec.name for m in judged)} within their margins "
                       f"after {min(units):,}+ units per arm"]
        else:
            decision = "continue"
            reasons = ["no guardrail worse"]
            if open_:
                reasons.append(f"not yet shown within margin: {', '.join(open_)}")
            if min(units) < exp.promote_units:
                reasons.append(f"promotion needs {exp.promote_units:,} units per arm")
            if split_doubtful:
                reasons.append(f"promotion needs the split to look right: the chi-square of units per arm has p = "
                               f"{srm.result.p_value:.2g}, under {exp.srm_promote_p:g}")  # type: ignore[union-attr]  # doubtful: checked
        if unjudged:
            reasons.append(f"not judged (too few values): {', '.join(unjudged)}")
    return AbResult(exp, decision, tuple(reasons), requests, units, srm, empty, metrics)
