"""The A/B question and its answer, without HTTP: which experiment, epoch and arms a request
asks about (read from the ledgers under the drift state's lock), the analysis of each epoch
at the alpha it may spend, and the JSON that goes back (to a controller, the report and the
gauges alike).

No weights and no start are asked for: the gateway's records carry the experiment, its
weight epoch and each variant's weight, and the experiment ledgers keep every epoch whole
(``drift.ab.ledger``). The current epoch is judged by default, at the alpha it may spend
(``drift.ab.source``); ``scope=experiment`` judges every epoch so far and answers rollback
if any epoch does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwatch.drift.ab.decision import DECISIONS, AbResult, Experiment, MetricResult, analyse
from inferwatch.drift.ab.ledger import Ledgers
from inferwatch.drift.ab.source import EpochArms, read_epoch
from inferwatch.drift.feature_record import EPOCH, TEXT_MAX
from inferwatch.drift.json_int import json_int

Decision = Literal["rollback", "hold", "continue", "promote"]
# printable ASCII without spaces: "\S" is read differently by JSON Schema (ECMA), Python and the
# Rust regex pydantic validates with (U+0085 is a space to Rust only), so a schema-valid name
# could be refused; the gateway's variant names (serving/split.py) fit this class
Variant = Field(min_length=1, max_length=TEXT_MAX, pattern=r"^[!-~]+$")
COUNT_MAX = 10**15


CROSS_FIELD_RULES = (
    "control and treatment differ",
    "epoch only with scope=epoch",
    "promote_units at least min_units",
)
REQUIRED_FIELDS = ("control", "treatment")


class AbRequest(BaseModel):
    """The experiment to judge: two variants of the model, and which epoch."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "description": "The experiment to judge: two variants of the model, and which epoch. Across fields: "
                       f"{'; '.join(CROSS_FIELD_RULES)}."})

    control: str = Variant
    treatment: str = Variant
    experiment: str | None = Field(None, min_length=1, max_length=TEXT_MAX,
                                   description="the experiment's name; default: the model's latest")
    epoch: json_int(ge=0, le=EPOCH[1]) | None = Field(  # type: ignore[valid-type]  # an Annotated int
        None, description="the weight epoch to judge; default: the latest")
    scope: Literal["epoch", "experiment"] = Field(
        "epoch", description="epoch: one epoch; experiment: every epoch so far, rollback if any says so")
    shared_tokenizer: bool = Field(False, description="compare mean token logprob only when true")
    alpha: float = Field(0.05, gt=0, le=0.2, allow_inf_nan=False,
                         description="false-rollback rate over the experiment's life, all epochs and looks")
    min_units: json_int(ge=10, le=COUNT_MAX) = 30  # type: ignore[valid-type]  # an Annotated int
    promote_units: json_int(ge=10, le=COUNT_MAX) = 300  # type: ignore[valid-type]  # an Annotated int
    pass_on: list[Decision] = Field(list(DECISIONS), description="decisions answered 200; others 412 (Flagger)")


def _interval(pair: tuple[float, float] | None) -> dict[str, Any] | None:
    return None if pair is None else {"low": _finite(pair[0]), "high": _finite(pair[1])}


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def metric_json(r: MetricResult) -> dict[str, Any]:
    p95 = None
    if r.p95 is not None:
        p95 = {"q": r.p95.q, "control": r.p95.control, "treatment": r.p95.treatment, "difference": r.p95.difference,
               "interval": _interval(r.p95.interval)}
    return {"title": r.spec.title, "test": r.test, "direction": r.spec.direction, "unit": r.spec.unit,
            "status": r.status, "verdict": r.verdict, "n": {"control": r.n_control, "treatment": r.n_treatment},
            "control": r.control, "treatment": r.treatment, "effect": r.effect, "relative": r.relative,
            "interval": _interval(r.interval), "relative_interval": _interval(r.relative_interval),
            "p_value": r.p_value, "p_value_sequential": r.p_value_sequential, "sequential_scale": r.sequential_scale,
            "sequential_effect": r.sequential_effect, "confidence_sequence": _interval(r.confidence_sequence),
            "margin": r.spec.margin, "p95": p95, "note": r.note}


def _arms(pair: tuple[object, object]) -> dict[str, Any]:
    return dict(zip(("control", "treatment"), pair))


def _epoch_json(view: EpochArms, result: AbResult) -> dict[str, Any]:
    return {"epoch": view.epoch, "ordinal": view.ordinal, "alpha": view.alpha,
            "weights": _arms((view.control.weight, view.treatment.weight)), "requests": _arms(result.requests),
            "units": _arms(result.units), "first_at": view.first_at, "last_at": view.last_at,
            "decision": result.decision, "worse": result.worse}


def result_json(model: str, experiment: str, view: EpochArms, result: AbResult, alpha: float,
                scope: str, epochs: list[dict[str, Any]]) -> dict[str, Any]:
    exp = result.experiment
    srm = None
    if result.srm is not None:
        srm = {"unit": "units", "observed": dict(zip((exp.control, exp.treatment), result.srm.result.observed)),
               "expected_share": dict(zip((exp.control, exp.treatment), result.srm.result.expected_share)),
               "chi2": _finite(result.srm.result.statistic), "p_value": result.srm.result.p_value,
               "p_value_sequential": result.srm.p_value_sequential, "alarm": result.srm.alarm,
               "alarm_sequential": result.srm.alarm_sequential, "alarm_fixed": result.srm.alarm_fixed,
               "threshold": exp.srm_alpha, "promote_p": exp.srm_promote_p}
    return {"model": model, "experiment": experiment, "epoch": view.epoch, "control": exp.control,
            "treatment": exp.treatment, "decision": result.decision, "reasons": list(result.reasons),
            "weights": _arms((view.control.weight, view.treatment.weight)), "requests": _arms(result.requests),
            "units": _arms(result.units), "units_sampled": view.control.sampled, "lead_in_epoch": view.lead_in,
            "treatment_share": result.treatment_share, "no_traffic": list(result.no_traffic), "srm": srm,
            "alpha": exp.alpha, "alpha_experiment": alpha,
            "sequential": f"normal-mixture always-valid p-values (mSPRT), tuned at {exp.tune_n:g} effective units",
            "correction": "holm across guardrails; alpha / 2^k for the k-th epoch", "scope": scope, "epochs": epochs,
            "worse": result.worse, "metrics": {name: metric_json(r) for name, r in result.metrics.items()}}


class InputError(ValueError):
    def __init__(self, message: str, field: str, status: int = 422) -> None:
        super().__init__(message)
        self.field, self.status = field, status


def experiment_of(req: AbRequest, alpha: float) -> Experiment:
    """The analysis settings for one epoch, after the rules that span fields."""
    if req.control == req.treatment:
        raise InputError("control and treatment must be different variants", "treatment")
    if req.epoch is not None and req.scope == "experiment":
        raise InputError("epoch names one epoch; scope=experiment judges them all: give one or the other", "epoch")
    if req.promote_units < req.min_units:
        raise InputError("promote_units must be at least min_units", "promote_units")
    return Experiment(req.control, req.treatment, req.shared_tokenizer, alpha, min_units=req.min_units,
                      promote_units=req.promote_units)


@dataclass(frozen=True)
class Reading:
    experiment: str
    current: int
    views: dict[int, EpochArms]  # the epochs judged, by number
    others: tuple[str, ...] = ()  # the model's other experiments, latest first


def read(ledgers: Ledgers, model: str, req: AbRequest) -> Reading:
    """What the verdict needs, copied out under the drift state's lock (the analysis runs
    after, without it)."""
    found = ledgers.of_model(model)
    if req.experiment is not None:
        found = [ledger for ledger in found if ledger.experiment == req.experiment]
    if not found:
        if req.experiment is not None and ledgers.of_model(model):
            names = ", ".join(ledger.experiment for ledger in ledgers.of_model(model))
            raise InputError(f"model '{model}' has no experiment '{req.experiment}' (experiments: {names})",
                             "experiment", 404)
        known = sorted({m for m, _ in ledgers.ledgers})
        full = (f"; {ledgers.overflow:,} records of experiments beyond the {ledgers.max_experiments} kept "
                "(INFERWATCH_DRIFT_AB_EXPERIMENTS) were not judged" if ledgers.overflow else "")
        raise InputError(f"no experiment records of model '{model}' (models with experiments: "
                         f"{', '.join(known[:20]) or 'none'}; records need the gateway's experiment, epoch and "
                         f"weight{full})", "model", 404)
    ledger = found[0]
    epochs = ledger.recorded_epochs()
    if req.epoch is not None and req.epoch not in epochs:
        raise InputError(f"experiment '{ledger.experiment}' of model '{model}' has no epoch {req.epoch} with records "
                         f"(epochs: {', '.join(map(str, epochs))})", "epoch", 404)
    current = req.epoch if req.epoch is not None else epochs[-1]
    shown = epochs if req.scope == "experiment" else [current]
    others = tuple(x.experiment for x in ledgers.of_model(model) if x is not ledger)
    return Reading(ledger.experiment, current,
                   {e: read_epoch(ledger, e, req.control, req.treatment, req.alpha) for e in shown}, others)


def judge(model: str, req: AbRequest, reading: Reading) -> tuple[AbResult, dict[str, Any]]:
    """The verdict's JSON: the current epoch's, or with ``scope=experiment`` a rollback if
    any epoch's is one (each epoch judged at the alpha it may spend), naming every worse
    guardrail with its epoch."""
    results = {e: analyse(experiment_of(req, v.alpha), v.control, v.treatment) for e, v in reading.views.items()}
    current = reading.current
    result = results[current]
    reasons = list(result.reasons)
    if result.no_traffic:
        reasons.append(f"variants with records in epoch {current}: {', '.join(reading.views[current].variants)}")
    earlier = [e for e, r in results.items() if e != current and r.decision == "rollback"]
    worse = list(result.worse)
    if earlier:
        reasons = ([f"epoch {e}: {r}" for e in earlier for r in results[e].reasons]
                   + [f"epoch {current} (current, {result.decision}): {r}" for r in reasons])
        worse = sorted({*worse, *(w for e in earlier for w in results[e].worse)})
        result = replace(result, decision="rollback")
    if reading.others and req.experiment is None:
        reasons.append(f"other experiments of model '{model}': {', '.join(reading.others)}; this judges "
                       f"'{reading.experiment}', the one with the latest record: pass experiment= to choose")
    result = replace(result, reasons=tuple(reasons))
    epochs = [_epoch_json(reading.views[e], results[e]) for e in sorted(results)]
    doc = result_json(model, reading.experiment, reading.views[current], result, req.alpha, req.scope, epochs)
    doc["worse"], doc["experiments"] = worse, [reading.experiment, *reading.others]
    return result, doc


