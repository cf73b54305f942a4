"""GET/POST /v1/ab/{model}: the A/B verdict as JSON, shaped for rollout controllers.

- Argo Rollouts' ``web`` metric provider: GET with the experiment in the query string,
  ``jsonPath: "{$.decision}"``, ``successCondition: result == "continue" || result == "promote"``,
  ``failureCondition: result == "rollback"`` (``hold`` is inconclusive). Always 200 with a
  verdict, a variant without records included (``hold``, no traffic): Argo counts a non-2xx
  answer as a measurement error, not as a failure. Only a model with no records at all is a
  404 (``field: model``), which Argo counts against ``consecutiveErrorLimit``.
- Flagger webhooks judge by status code alone and POST their own payload
  (``name``, ``namespace``, ``phase``, ``checksum``, ``metadata``). The experiment comes from
  the query string or the webhook's ``metadata`` (strings); ``pass_on`` lists the decisions
  that answer 200, the others answer 412 with the same body. A ``rollout`` webhook with
  ``pass_on=continue,promote,hold`` fails the canary's check on ``rollback`` only; a
  ``rollback`` webhook (Flagger rolls back on its 2xx) takes ``pass_on=rollback``; a
  ``confirm-promotion`` webhook with ``pass_on=promote`` holds promotion until it is earned.
- A JSON body of the same fields works too (assignment and feedback counts fit better there).

Assignment counts (``control_assignments``, ``treatment_assignments``) come from the
gateway's routing-time counter; without them the sample-ratio check counts records.
"""

from __future__ import annotations

import math
from copy import copy
from dataclasses import replace
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.drift.ab.decision import DECISIONS, AbResult, Experiment, MetricResult, analyse
from inferwatch.drift.ab.exposition import Watchlist
from inferwatch.drift.ab.source import read_arms
from inferwatch.drift.api import ErrorResponse, json_int, optional_not_null
from inferwatch.drift.errors import error_response
from inferwatch.drift.feedback import FeedbackLog
from inferwatch.drift.feature_record import TEXT_MAX, UNIX_S
from inferwatch.drift.state import DriftState

Decision = Literal["rollback", "hold", "continue", "promote"]
# printable ASCII without spaces: "\S" is read differently by JSON Schema (ECMA), Python and the
# Rust regex pydantic validates with (U+0085 is a space to Rust only), so a schema-valid name
# could be refused; the gateway's variant names (serving/split.py) fit this class
Variant = Field(min_length=1, max_length=TEXT_MAX, pattern=r"^[!-~]+$")
COUNT_MAX = 10**15
Count = json_int(ge=0, le=COUNT_MAX)


CROSS_FIELD_RULES = (
    "control and treatment differ",
    "control_weight + treatment_weight = 1 (the configured split)",
    "control_assignments and treatment_assignments: both or neither",
    "the four *_feedback_* counts: all or none, and each arm's positive at most its total",
    "promote_requests at least min_requests",
)
REQUIRED_FIELDS = ("control", "treatment", "control_weight", "treatment_weight")


class AbRequest(BaseModel):
    """The experiment to judge: two variants of the model, the configured split, and what the
    gateway counted."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "description": "The experiment to judge: two variants of the model, the configured split, and what the "
                       f"gateway counted. Across fields: {'; '.join(CROSS_FIELD_RULES)}."})

    control: str = Variant
    treatment: str = Variant
    control_weight: float = Field(gt=0, lt=1, allow_inf_nan=False)
    treatment_weight: float = Field(gt=0, lt=1, allow_inf_nan=False)
    control_assignments: Count | None = Field(None, description="gateway routing count")
    treatment_assignments: Count | None = Field(None, description="gateway routing count")
    control_feedback_positive: Count | None = None
    control_feedback_total: Count | None = None
    treatment_feedback_positive: Count | None = None
    treatment_feedback_total: Count | None = None
    shared_tokenizer: bool = Field(False, description="compare mean token logprob only when true")
    since: float | None = Field(None, ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False,
                                description="experiment or ramp-step start, unix seconds (rounded up to the next "
                                "window bucket: no earlier record counts)")
    alpha: float = Field(0.05, gt=0, le=0.2, allow_inf_nan=False, description="false-rollback rate over all looks")
    min_requests: json_int(ge=10, le=COUNT_MAX) = 100  # type: ignore[valid-type]
    promote_requests: json_int(ge=10, le=COUNT_MAX) = 1000  # type: ignore[valid-type]
    pass_on: list[Decision] = Field(list(DECISIONS), description="decisions answered 200; others 412 (Flagger)")


def _omittable(f: FieldInfo) -> FieldInfo:
    """``f`` with its constraints, left out when not given."""
    omittable = copy(f)
    omittable.default = None
    return omittable


# A JSON body of the experiment's fields: typed as JSON (strict: a number is a number, not
# a string), each optional since the query string may give it; null is not a value.
AbBody = create_model(
    "AbBody", __config__=ConfigDict(extra="forbid", strict=True,
                                    json_schema_extra=lambda schema, _: optional_not_null(schema)),
    **{name: (f.annotation, _omittable(f)) for name, f in AbRequest.model_fields.items()})


class FlaggerWebhook(BaseModel):
    """Flagger's webhook payload (its own fields besides these are taken and ignored): the
    experiment's fields come from ``metadata``, as strings as Flagger sends them (``pass_on``
    comma-separated), or as typed values."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    namespace: str
    phase: str
    metadata: dict[str, Any] | None = Field(None, json_schema_extra=lambda schema: _metadata_schema(schema))


def _metadata_schema(schema: dict[str, Any]) -> None:
    """AbBody's fields, each also as text."""
    fields = {name: {"anyOf": [{"type": "string"}, field]}
              for name, field in AbBody.model_json_schema()["properties"].items()}
    schema.clear()
    schema["anyOf"] = [{"type": "object", "additionalProperties": False, "properties": fields}, {"type": "null"}]


class Interval(BaseModel):
    low: float
    high: float


class MetricJson(BaseModel):
    title: str
    test: str
    direction: Literal["higher_is_worse", "lower_is_worse"]
    unit: str
    status: Literal["ok", "insufficient_data", "not_applicable"]
    verdict: Literal["worse", "better", "non_inferior", "inconclusive", "insufficient_data", "not_applicable"]
    n: dict[str, int]
    control: float | None
    treatment: float | None
    effect: float | None = Field(description="treatment - control in the unit (Hodges-Lehmann shift for ranks)")
    relative: float | None
    interval: Interval | None
    relative_interval: Interval | None
    p_value: float | None = Field(description="fixed-sample test, for reference")
    p_value_sequential: float | None = Field(description="always-valid: what the decision uses (Holm)")
    sequential_scale: str
    sequential_effect: float | None
    confidence_sequence: Interval | None
    margin: float
    p95: dict[str, float | Interval] | None
    note: str


class SrmJson(BaseModel):
    source: Literal["assignments", "records"]
    observed: dict[str, int]
    expected_share: dict[str, float]
    chi2: float
    p_value: float
    alarm: bool
    threshold: float


class AbResponse(BaseModel):
    model: str
    control: str
    treatment: str
    decision: Decision
    reasons: list[str]
    requests: dict[str, int]
    treatment_share: float
    no_traffic: list[str]
    srm: SrmJson
    alpha: float
    sequential: str
    correction: str
    since: float | None
    worse: list[str]
    metrics: dict[str, MetricJson]


def _interval(pair: tuple[float, float] | None) -> dict | None:
    return None if pair is None else {"low": _finite(pair[0]), "high": _finite(pair[1])}


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def metric_json(r: MetricResult) -> dict:
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


def result_json(model: str, result: AbResult, since: float | None) -> dict:
    exp = result.experiment
    arms = (exp.control, exp.treatment)
    srm = result.srm
    return {"model": model, "control": exp.control, "treatment": exp.treatment, "decision": result.decision,
            "reasons": list(result.reasons), "requests": dict(zip(("control", "treatment"), result.requests)),
            "treatment_share": result.treatment_share, "no_traffic": list(result.no_traffic),
            "srm": {"source": srm.source, "observed": dict(zip(arms, srm.result.observed)),
                    "expected_share": dict(zip(arms, srm.result.expected_share)), "chi2": srm.result.statistic,
                    "p_value": srm.result.p_value, "alarm": srm.alarm, "threshold": exp.srm_alpha},
            "alpha": exp.alpha,
            "sequential": f"normal-mixture always-valid p-values (mSPRT), tuned at {exp.tune_n:g} effective requests",
            "correction": "holm", "since": since, "worse": result.worse,
            "metrics": {name: metric_json(r) for name, r in result.metrics.items()}}


class InputError(ValueError):
    def __init__(self, message: str, field: str, status: int = 422) -> None:
        super().__init__(message)
        self.field, self.status = field, status


def _pair(req: AbRequest, name: str) -> tuple[int, int] | None:
    a, b = getattr(req, f"control_{name}"), getattr(req, f"treatment_{name}")
    if (a is None) != (b is None):
        raise InputError(f"give both control_{name} and treatment_{name}, or neither",
                         f"{'treatment' if b is None else 'control'}_{name}")
    return None if a is None else (a, b)


def experiment_of(req: AbRequest) -> tuple[Experiment, tuple[int, int] | None, tuple[int, int] | None]:
    """The experiment, and the per-arm feedback (positive, total), after the rules that span fields."""
    if req.control == req.treatment:
        raise InputError("control and treatment must be different variants", "treatment")
    if abs(req.control_weight + req.treatment_weight - 1) > 1e-6:
        raise InputError(f"control_weight + treatment_weight must be 1 (the configured split), got "
                         f"{req.control_weight + req.treatment_weight:g}", "treatment_weight")
    assignments = _pair(req, "assignments")
    positive, total = _pair(req, "feedback_positive"), _pair(req, "feedback_total")
    if (positive is None) != (total is None):
        raise InputError("feedback needs both *_feedback_positive and *_feedback_total", "control_feedback_total")
    feedback = None
    if positive is not None and total is not None:
        for arm, p, t in zip(("control", "treatment"), positive, total):
            if p > t:
                raise InputError(f"{arm}_feedback_positive ({p}) exceeds {arm}_feedback_total ({t})",
                                 f"{arm}_feedback_positive")
        feedback = (positive[0], total[0]), (positive[1], total[1])
    if req.promote_requests < req.min_requests:
        raise InputError("promote_requests must be at least min_requests", "promote_requests")
    exp = Experiment(req.control, req.treatment, (req.control_weight, req.treatment_weight), assignments,
                     req.shared_tokenizer, req.alpha, min_requests=req.min_requests,
                     promote_requests=req.promote_requests)
    return exp, (feedback[0] if feedback else None), (feedback[1] if feedback else None)  # type: ignore[return-value]


def verdict(state: DriftState, watchlist: Watchlist, model: str, req: AbRequest,
            feedback: FeedbackLog | None = None) -> Response:
    """Feedback counts not given in the request come from the ratings the gateway forwarded,
    when both arms have some."""
    exp, fb_control, fb_treatment = experiment_of(req)
    if fb_control is None and feedback is not None:
        counts = [feedback.counts(model, v, req.since) for v in (exp.control, exp.treatment)]
        if all(total for _, total in counts):
            fb_control, fb_treatment = counts
    arms = read_arms(state, model, exp.control, exp.treatment, req.since, (fb_control, fb_treatment))
    if arms is None:
        models = sorted({m for m, _ in state.segments()})
        raise InputError(f"no records of model '{model}' in the current window (models seen: "
                         f"{', '.join(models[:20]) or 'none'})", "model", 404)
    result = analyse(exp, *arms)
    if result.no_traffic:
        known = sorted(v for m, v in state.segments() if m == model)
        result = replace(result, reasons=(*result.reasons, f"variants with records: {', '.join(known)}"))
    watchlist.watch(model, exp, req.since)
    status = 200 if result.decision in req.pass_on else 412
    return JSONResponse(result_json(model, result, req.since), status_code=status)


def _fields_of_body(doc: object) -> dict:
    """Our fields, from a JSON object of them or from a Flagger webhook's ``metadata``; a
    plain body's values must have their JSON types."""
    if not isinstance(doc, dict):
        raise InputError("body must be a JSON object", "body")
    if {"name", "namespace", "phase"} <= doc.keys():
        metadata = FlaggerWebhook.model_validate(doc).metadata or {}
        return {k: ([p.strip() for p in v.split(",")] if k == "pass_on" and isinstance(v, str) else v)
                for k, v in metadata.items()}
    AbBody.model_validate(doc)
    return doc


def _validation_error(exc: ValidationError, status: int) -> Response:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "request"
    return error_response(status, f"'{where}': {first.get('msg', 'invalid')}", "invalid_experiment", field=where)


ModelPath = Annotated[str, Path(min_length=1, max_length=TEXT_MAX)]
POST_DESCRIPTION = (
    "The experiment's fields come from the query string (as for GET), then the JSON body or a Flagger webhook's "
    f"metadata, a later source overriding an earlier one; {', '.join(REQUIRED_FIELDS)} must come from one of them. "
    f"Across fields: {'; '.join(CROSS_FIELD_RULES)}.")
RESPONSES: dict = {200: {"model": AbResponse}, 412: {"model": AbResponse, "description": "decision not in pass_on"},
                   **{code: {"model": ErrorResponse} for code in (400, 404, 422)}}


def install(app: FastAPI, state: DriftState, watchlist: Watchlist, feedback: FeedbackLog | None = None) -> None:
    """Declare the routes (plain functions: FastAPI runs them on its thread pool, so the
    event loop never waits on an analysis)."""

    @app.get("/v1/ab/{model}", responses=RESPONSES, summary="A/B verdict: rollback, hold, continue or promote")
    def ab_get(model: ModelPath, query: Annotated[AbRequest, Query()]) -> Response:
        try:
            return verdict(state, watchlist, model, query, feedback)
        except InputError as exc:
            return error_response(400 if exc.status == 422 else exc.status, str(exc), "invalid_experiment",
                                  field=exc.field)

    @app.post("/v1/ab/{model}", responses=RESPONSES, summary="A/B verdict for a JSON body or a Flagger webhook",
              description=POST_DESCRIPTION, openapi_extra={"requestBody": {"required": False, "content": {
                  "application/json": {"schema": {"anyOf": [AbBody.model_json_schema(),
                                                            FlaggerWebhook.model_json_schema()]}}}}})
    async def ab_post(model: ModelPath, request: Request) -> Response:
        raw = await request.body()
        try:
            fields = dict(request.query_params)
            if "pass_on" in fields:
                fields["pass_on"] = request.query_params.getlist("pass_on")  # type: ignore[assignment]
            if raw.strip():
                try:
                    doc = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise InputError(f"body is not valid JSON: {exc}", "body") from None
                fields.update(_fields_of_body(doc))
            req = AbRequest.model_validate(fields)
        except InputError as exc:
            return error_response(exc.status, str(exc), "invalid_experiment", field=exc.field)
        except ValidationError as exc:
            return _validation_error(exc, 422)
        try:
            return await run_in_threadpool(verdict, state, watchlist, model, req, feedback)
        except InputError as exc:
            return error_response(exc.status, str(exc), "invalid_experiment", field=exc.field)
