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
- A JSON body of the same fields works too.

No weights and no start are asked for: the gateway's records carry the experiment, its
weight epoch and each variant's weight, and the experiment ledgers keep every epoch whole
(``drift.ab.ledger``). The current epoch is judged by default, at the alpha it may spend
(``drift.ab.source``); ``scope=experiment`` judges every epoch so far.
"""

from __future__ import annotations

from copy import copy
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.drift.ab.book import LedgerBook
from inferwatch.drift.ab.cost import priced
from inferwatch.drift.ab.exposition import Watchlist
from inferwatch.drift.ab.verdict import (
    CROSS_FIELD_RULES,
    REQUIRED_FIELDS,
    AbRequest,
    Decision,
    InputError,
    experiment_of,
    judge,
    read,
)
from inferwatch.drift.api import ErrorResponse, optional_not_null
from inferwatch.drift.errors import error_response
from inferwatch.drift.feature_record import TEXT_MAX


def _omittable(f: FieldInfo) -> FieldInfo:
    """``f`` with its constraints, left out when not given."""
    omittable = copy(f)
    omittable.default = None
    return omittable


# A JSON body of the experiment's fields: typed as JSON (strict: a number is a number, not
# a string), each optional since the query string may give it; null is not a value.
AbBody = create_model(  # type: ignore[call-overload]  # fields built from the experiment's at import
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
    unit: Literal["units"]
    observed: dict[str, int]
    expected_share: dict[str, float]
    chi2: float | None = Field(description="null when infinite: units at weight 0")
    p_value: float = Field(description="Pearson's chi-square on the units seen: holds below threshold; a "
                                       "promote needs it at least promote_p")
    p_value_sequential: float = Field(description="always-valid over every look: holds below threshold")
    alarm: bool = Field(description="either test below threshold")
    alarm_sequential: bool
    alarm_fixed: bool
    threshold: float
    promote_p: float


class EpochJson(BaseModel):
    epoch: int
    ordinal: int | None = Field(description="k among the epochs in which both arms took traffic")
    alpha: float = Field(description="what the epoch may spend: alpha / 2^k")
    weights: dict[str, float | None]
    requests: dict[str, int]
    units: dict[str, int]
    first_at: float | None
    last_at: float | None
    decision: Decision
    worse: list[str]


class AbResponse(BaseModel):
    model: str
    experiment: str
    epoch: int
    control: str
    treatment: str
    decision: Decision
    reasons: list[str]
    weights: dict[str, float | None]
    requests: dict[str, int]
    units: dict[str, int]
    units_sampled: float = Field(description="share of units kept in the ledger (1: all)")
    lead_in_epoch: int | None = Field(description="the epoch (every unit on the control) whose per-unit means "
                                                  "adjust the rank tests (CUPED); null: none")
    treatment_share: float
    no_traffic: list[str]
    srm: SrmJson | None
    alpha: float = Field(description="what this epoch may spend of alpha_experiment")
    alpha_experiment: float
    sequential: str
    correction: str
    scope: Literal["epoch", "experiment"]
    epochs: list[EpochJson]
    experiments: list[str] = Field(description="the model's experiments, the one judged first")
    worse: list[str] = Field(description="guardrails worse (with scope=experiment, in any epoch that rolls back)")
    metrics: dict[str, MetricJson]


def verdict(ledgers: LedgerBook, watchlist: Watchlist, model: str, req: AbRequest) -> Response:
    experiment_of(req, req.alpha)
    reading = ledgers.read(lambda book: read(book, model, req))
    _, doc = judge(model, req, priced(reading, model, watchlist.cost))
    watchlist.watch(model, req)
    status = 200 if doc["decision"] in req.pass_on else 412
    return JSONResponse(doc, status_code=status)


def _fields_of_body(doc: object) -> dict[str, Any]:
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
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": AbResponse}, 412: {"model": AbResponse, "description": "decision not in pass_on"},
    **{code: {"model": ErrorResponse} for code in (400, 404, 422)}}


def install(app: FastAPI, ledgers: LedgerBook, watchlist: Watchlist) -> None:
    """Declare the routes (plain functions: FastAPI runs them on its thread pool, so the
    event loop never waits on an analysis)."""

    @app.get("/v1/ab/{model}", responses=RESPONSES, summary="A/B verdict: rollback, hold, continue or promote")
    def ab_get(model: ModelPath, query: Annotated[AbRequest, Query()]) -> Response:
        try:
            return verdict(ledgers, watchlist, model, query)
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
            fields: dict[str, Any] = dict(request.query_params)
            if "pass_on" in fields:
                fields["pass_on"] = request.query_params.getlist("pass_on")
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
            return await run_in_threadpool(verdict, ledgers, watchlist, model, req)
        except InputError as exc:
            return error_response(exc.status, str(exc), "invalid_experiment", field=exc.field)
