"""The drift service: ingest feature records, keep windows, serve drift as JSON, Prometheus
metrics and an HTML report. Thin HTTP over ``DriftState``."""

from __future__ import annotations

import hmac
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import orjson
from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from inferwatch import __version__
from inferwatch.common.secret_files import SecretFileSettings
from inferwatch.drift import api, metrics as drift_metrics, report
from inferwatch.drift.ab import http as ab_http, report as ab_report
from inferwatch.drift.ab.cost import PrometheusCost
from inferwatch.drift.ab.exposition import AbCollector, Watchlist
from inferwatch.drift.errors import CatchAll, error_response as _error, http_error
from inferwatch.drift.feature_record import TEXT_MAX, UNIX_S
from inferwatch.drift.feedback import FeedbackBatch
from inferwatch.drift.methods import DriftResult
from inferwatch.drift.prometheus_source import METRIC_NAME, SELECTOR, PrometheusSource, SourceError
from inferwatch.drift.schema import FEATURES, NUMERIC_FEATURES, UNITS, BatchError
from inferwatch.drift.state import Baseline, DriftState, SegmentLimit, WindowConfig, headline, smallest_alpha
from inferwatch.drift.store import Store
from inferwatch.drift.verdicts import SegmentVerdict, analysis_edges, feature_status
from inferwatch.drift.windows import Segment


class DriftSettings(SecretFileSettings):
    """INFERWATCH_DRIFT_* or flags; the token may come from a file, INFERWATCH_DRIFT_TOKEN_FILE."""

    SECRETS: ClassVar[tuple[str, ...]] = ("token",)
    model_config = SettingsConfigDict(env_prefix="INFERWATCH_DRIFT_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    db_path: str = Field(".run/drift.sqlite3", description="SQLite file; ':memory:' keeps nothing")
    window_s: float = Field(3600.0, gt=0, description="length of the current window")
    buckets: int = Field(60, ge=1, le=3600, description="time buckets per window")
    reservoir: int = Field(2000, ge=0, description="raw values kept per numeric feature per window")
    retention_s: float = Field(7 * 86400.0, gt=0, description="how long acknowledged batches are kept")
    token: SecretStr | None = Field(None, description="bearer token required by write endpoints")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    prometheus_url: str = Field("http://127.0.0.1:9090", description="for fleet-wide drift from buckets and the "
                                "A/B cost guardrail")
    ab_cost: bool = Field(True, description="judge the A/B cost guardrail from the cost rules' series in "
                          "Prometheus (drift/ab/cost.py); off: the guardrail is not_applicable")
    ab_cost_step_s: float = Field(300.0, ge=1, le=3600, description="seconds between the cost guardrail's paired "
                                  "samples: the cost rules' rate window (5m)")
    alpha: float = Field(0.01, gt=0, le=0.5, description="false-alarm rate per evaluation, per method and segment")
    min_samples: int = Field(50, ge=2, description="fewer values in a window: insufficient_data")
    max_segments: int = Field(1000, ge=1, description="(model, variant) pairs kept; records of more count as 'other'")
    resamples: int = Field(1999, ge=99, le=100_000, description="bootstrap draws per calibration")
    calibration_cache: int = Field(8192, ge=64, description="null distributions kept, about 48 KB each; keep at "
                                                            "least 6 per segment with a baseline, or they are "
                                                            "calibrated again and again")
    metric_methods: Literal["headline", "all"] = Field(
        "headline", description="per-method score, detected and threshold series: 'headline' keeps each feature's "
                                "headline method (wasserstein, chi2) and every method of a drifted feature; 'all' "
                                "keeps every method of every feature (5x the series)")
    calibration_queue: int = Field(4096, ge=1, description="calibrations waiting for the background worker; "
                                                           "more are asked for again at the next evaluation")
    ab_experiments: int = Field(32, ge=1, description="A/B experiment ledgers kept; records of more are not judged")
    ab_units: int = Field(100_000, ge=1000, description="unit rows per experiment ledger (about 150 bytes each); "
                                                        "past it a uniform sample of units is kept")
    ab_checkpoint_s: float = Field(30.0, gt=0, description="how often changed experiment ledgers are written "
                                                           "(a restart replays what came after)")

    @model_validator(mode="after")
    def _alpha_resolvable(self) -> DriftSettings:
        if self.alpha < smallest_alpha(self.resamples):
            raise ValueError(f"alpha {self.alpha:g} is below what {self.resamples} resamples can resolve "
                             f"(1/{self.resamples + 1}): raise resamples or alpha")
        return self


def result_json(r: DriftResult) -> dict[str, Any]:
    return {"method": r.method, "kind": r.kind, "direction": r.direction, "score": r.score,
            "threshold": None if math.isnan(r.threshold) else r.threshold,
            "threshold_source": r.source, "calibration_n": r.calibration_n, "p_value": r.p_value,
            "drifted": r.drifted, "status": r.status}


def features_json(verdict: SegmentVerdict) -> dict[str, Any]:
    return {name: {"status": f.status, "reference_n": f.n_ref, "current_n": f.n_cur, "p_value": f.p_value,
                   "drifted": f.drifted, "methods": {m: result_json(r) for m, r in f.methods.items()}}
            for name, f in verdict.features.items()}


def segment_json(state: DriftState, segment: Segment, feature: str | None = None) -> dict[str, Any]:
    verdict = state.verdict(segment)
    baseline = state.baselines.get(segment)
    features = features_json(verdict) if verdict else {}
    if feature is not None:
        features = {k: v for k, v in features.items() if k == feature}
    return {"model": segment[0], "variant": segment[1],
            "status": verdict.status if verdict else "no_baseline", "alpha": state.alpha,
            "window_records": state.window_records(segment), "baseline_records": baseline.records if baseline else 0,
            "drifted_features": verdict.drifted_features if verdict else [],
            "drifting_since": state.drifting_since(segment), "features": features}


class DriftCollector(Collector):
    """Scores computed at scrape time from the windows (cached until a window, baseline or
    threshold changes; never calibrated here: a missing threshold shows as ``calibrating``).
    Series exist only for live segments: idle ones expire with theirs."""

    PER_SEGMENT = (drift_metrics.SCORE, drift_metrics.DETECTED, drift_metrics.THRESHOLD, drift_metrics.FEATURE_DETECTED,
                   drift_metrics.FEATURE_P_VALUE, drift_metrics.SEGMENT_DETECTED, drift_metrics.SEGMENT_STATUS,
                   drift_metrics.FEATURE_STATUS, drift_metrics.WINDOW_RECORDS, drift_metrics.BASELINE_RECORDS)

    def __init__(self, state: DriftState, methods: Literal["headline", "all"] = "headline") -> None:
        self.state = state
        self.methods = methods

    def collect(self) -> Iterator[Metric]:
        g = {m: GaugeMetricFamily(m.name, m.doc, labels=list(m.labels)) for m in self.PER_SEGMENT}
        for segment in self.state.segments():
            seg = list(segment)
            if segment in self.state.windows:
                g[drift_metrics.WINDOW_RECORDS].add_metric(seg, self.state.window_records(segment))
            baseline = self.state.baselines.get(segment)
            if baseline is not None:
                g[drift_metrics.BASELINE_RECORDS].add_metric(seg, baseline.records)
            verdict = self.state.verdict(segment)
            if verdict is None:
                continue
            g[drift_metrics.SEGMENT_STATUS].add_metric([*seg, verdict.status], 1.0)
            decided = verdict.status in ("drift", "no_drift")
            if decided:
                g[drift_metrics.SEGMENT_DETECTED].add_metric(seg, 1.0 if verdict.status == "drift" else 0.0)
            for feature, f in verdict.features.items():
                g[drift_metrics.FEATURE_STATUS].add_metric([*seg, feature, feature_status(verdict, feature)], 1.0)
                if f.status != "ok":
                    continue
                g[drift_metrics.FEATURE_P_VALUE].add_metric([*seg, feature], f.p_value)  # type: ignore[arg-type]  # set when ok
                if decided:
                    g[drift_metrics.FEATURE_DETECTED].add_metric([*seg, feature], 1.0 if f.drifted else 0.0)
                for r in f.methods.values():
                    if self.methods == "headline" and not f.drifted and r.method != headline(feature):
                        continue  # bounded: one method per quiet feature (about 8 series, not 40, per segment)
                    key = [*seg, feature, r.method]
                    g[drift_metrics.SCORE].add_metric(key, r.score)  # type: ignore[arg-type]  # set when ok
                    g[drift_metrics.DETECTED].add_metric(key, 1.0 if r.drifted else 0.0)
                    g[drift_metrics.THRESHOLD].add_metric([*key, r.source], r.threshold)
        yield from g.values()
        calibrator = self.state.calibrator
        for metric, value in ((drift_metrics.ALPHA, self.state.alpha),
                              (drift_metrics.SEGMENTS, len(self.state.segments())),
                              (drift_metrics.WINDOW_BYTES, self.state.memory_bytes()),
                              (drift_metrics.CALIBRATIONS_PENDING, calibrator.pending)):
            yield GaugeMetricFamily(metric.name, metric.doc, value=value)
        for metric, value in ((drift_metrics.OVERFLOW, self.state.overflow),
                              (drift_metrics.EXPIRED, self.state.expired),
                              (drift_metrics.CALIBRATIONS, calibrator.calibrated),
                              (drift_metrics.CALIBRATIONS_REFUSED, calibrator.refused),
                              (drift_metrics.CALIBRATION_FAILURES, calibrator.failed)):
            yield CounterMetricFamily(metric.name, metric.doc, value=value)


def _checkpoint_loop(state: DriftState, every_s: float, stop: threading.Event) -> None:
    """Write changed experiment ledgers every ``every_s``; a failed write is tried again at
    the next (the ledgers stay marked changed) and never stops the service."""
    while not stop.wait(every_s):
        try:
            state.checkpoint_ledgers()
        except Exception:
            logging.getLogger(__name__).exception("experiment ledger checkpoint failed")


def _responses(model: type | None = None, *errors: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {code: {"model": api.ErrorResponse} for code in errors}
    if model is not None:
        out[200] = {"model": model}
    return out


def create_app(settings: DriftSettings, registry: CollectorRegistry | None = None,
               state: DriftState | None = None) -> FastAPI:
    registry = registry or CollectorRegistry()
    store = state.store if state else Store(settings.db_path)
    state = state or DriftState(store, WindowConfig(
        settings.window_s, settings.buckets, settings.reservoir, settings.retention_s, alpha=settings.alpha,
        min_samples=settings.min_samples, max_segments=settings.max_segments, resamples=settings.resamples,
        calibration_cache=settings.calibration_cache, calibration_queue=settings.calibration_queue,
        ab_experiments=settings.ab_experiments, ab_units=settings.ab_units))
    registry.register(DriftCollector(state, settings.metric_methods))
    watchlist = Watchlist(PrometheusCost(settings.prometheus_url, settings.ab_cost_step_s)
                          if settings.ab_cost else None)
    registry.register(AbCollector(state, watchlist))
    ingested, rejected, internal_errors = (Counter(m.name, m.doc, m.labels, registry=registry) for m in (
        drift_metrics.INGESTED, drift_metrics.REJECTED, drift_metrics.INTERNAL_ERRORS))
    token = settings.token.get_secret_value().encode() if settings.token else None
    source = PrometheusSource(settings.prometheus_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.restore()
        stop = threading.Event()
        checkpoints = threading.Thread(target=_checkpoint_loop, args=(state, settings.ab_checkpoint_s, stop),
                                       daemon=True, name="ledger-checkpoint")
        checkpoints.start()
        yield
        stop.set()
        checkpoints.join(timeout=30)
        state.checkpoint_ledgers()
        store.close()

    request_schemas: dict[str, dict[str, Any]] = {}  # of the hand-parsed bodies, published with the app's document
    thresholds_request = api.thresholds_request(smallest_alpha(state.config.resamples))

    def body(model: type[BaseModel]) -> dict[str, Any]:
        return _body(model, request_schemas)

    app = FastAPI(title="inferwatch drift", version=__version__, lifespan=lifespan,
                  description="Drift of LLM request features against baselines, with calibrated thresholds.")
    app.state.drift = state

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(CatchAll, errors=internal_errors)

    @app.exception_handler(RequestValidationError)
    async def invalid_query(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return _error(400, f"'{where}': {first.get('msg', 'invalid')}", "invalid_query", field=where)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token)

    async def read_body(request: Request) -> bytes | Response:
        if not authorized(request):
            rejected.labels("unauthorized").inc()
            return _error(401, "Missing or invalid token: send 'Authorization: Bearer <token>'.", "invalid_token")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            rejected.labels("too_large").inc()
            return _error(413, f"Body is {declared} bytes; the limit is {settings.max_body_bytes}.", "body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body_bytes:
                rejected.labels("too_large").inc()
                return _error(413, f"Body exceeds {settings.max_body_bytes} bytes.", "body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_object(request: Request, empty: bool = False) -> dict[str, Any] | Response:
        """An authorised, size-checked JSON object body (``empty``: ``{}`` too), or the error
        response to send."""
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _error(422, f"body is not valid JSON: {exc}", "invalid_json", field="body")
        if not isinstance(doc, dict) or not (doc or empty):
            return _error(422, "body must be a non-empty JSON object", "invalid_body", field="body")
        return doc

    def invalid_body(exc: ValidationError, code: str) -> Response:
        """A 422 naming the first wrong field by its path in the body (``records.0.at``)."""
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        return _error(422, f"'{where}': {first.get('msg', 'invalid')}", code, field=where)

    @app.post("/v1/ingest", responses=_responses(api.IngestResponse, 401, 413, 422),
              openapi_extra=body(api.IngestRequest), summary="Feature records from the gateway")
    async def ingest(request: Request) -> Response:
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 255:
            return _error(422, "the Idempotency-Key header must be 1 to 255 characters", "invalid_idempotency_key",
                          field="idempotency-key")
        try:
            counts = await run_in_threadpool(state.ingest, body, key)  # off the loop: /health answers
        except BatchError as exc:
            rejected.labels("invalid").inc()
            return _error(422, str(exc), "invalid_batch", record=exc.record, field=exc.field)
        if counts is None:
            rejected.labels("duplicate").inc()
            return JSONResponse({"accepted": 0, "in_window": 0, "duplicate": True})
        ingested.inc(counts[0])
        return JSONResponse({"accepted": counts[0], "in_window": counts[1]})

    @app.post("/v1/feedback", responses=_responses(api.FeedbackResponse, 401, 413, 422),
              openapi_extra=body(FeedbackBatch), summary="User ratings joined to their variant, from the gateway")
    async def feedback_post(request: Request) -> Response:
        doc = await read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            batch = FeedbackBatch.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_feedback")
        kept, duplicates = await run_in_threadpool(state.rate, batch)
        return JSONResponse({"accepted": kept, "duplicates": duplicates})

    @app.post("/v1/baselines", status_code=201, responses={201: {"model": api.BaselineInfo},
                                                           **_responses(None, 401, 409, 413, 422)},
              openapi_extra=body(api.BaselineRequest), summary="Freeze or upload a baseline")
    async def baselines_post(request: Request) -> Response:
        doc = await read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            req = api.BaselineRequest.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_baseline")
        model, variant = req.model, req.variant
        # each may be left out (None), never null: the model types them as they are when given
        since: float | None = req.from_
        until: float | None = req.to
        histograms: BaseModel | None = req.histograms
        try:
            if histograms is not None:
                if since is not None or until is not None:
                    raise BatchError("give 'from' and 'to', or 'histograms': not both", field="histograms")
                baseline = state.upload_baseline((model, variant), histograms.model_dump())  # 2.0 read as 2
            elif since is None or until is None:
                raise BatchError(f"give 'from' and 'to' (unix seconds, {UNIX_S[0]:g}..{UNIX_S[1]:g}) or 'histograms'",
                                 field="to" if since is not None else "from")
            elif since >= until:
                raise BatchError("'from' must be before 'to'", field="from")
            else:
                baseline = state.freeze_baseline((model, variant), since, until)
        except SegmentLimit as exc:
            return _error(409, str(exc), "too_many_segments")
        except BatchError as exc:
            return _error(422, str(exc), "invalid_baseline", field=exc.field)
        return JSONResponse(baseline_json(model, variant, baseline), status_code=201)

    @app.get("/v1/baselines", responses=_responses(list[api.BaselineInfo]), summary="Baselines held")
    async def baselines_get() -> Response:
        return JSONResponse([baseline_json(m, v, b) for (m, v), b in sorted(state.baselines.items())])

    @app.put("/v1/thresholds", responses=_responses(api.Thresholds, 401, 413, 422),
             openapi_extra=body(thresholds_request), summary="Change alpha or fix a method's threshold")
    async def thresholds_put(request: Request) -> Response:
        doc = await read_object(request, empty=True)
        if isinstance(doc, Response):
            return doc
        try:
            thresholds_request.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_threshold")
        try:
            return JSONResponse(state.set_thresholds(doc))
        except BatchError as exc:
            return _error(422, str(exc), "invalid_threshold", field=exc.field)

    @app.get("/v1/thresholds", responses=_responses(api.Thresholds), summary="How verdicts are reached")
    async def thresholds_get() -> Response:
        return JSONResponse(state.thresholds())

    @app.get("/v1/features", responses=_responses(list[api.FeatureInfo]),
             summary="Features, units and the bins uploaded baselines count on")
    async def features_get() -> Response:
        return JSONResponse([
            {"name": f.name, "unit": UNITS[f.name], "description": f.description,
             **({"edges": f.edges.values.tolist()} if hasattr(f, "edges") else {"categories": list(f.categories)})}
            for f in FEATURES.values()])

    def selected(model: str | None, variant: str | None) -> list[Segment]:
        return [s for s in state.segments() if (model is None or s[0] == model) and (variant is None or s[1] == variant)]

    # Handlers that score, calibrate (A/B, fleet) or wait on Prometheus are plain functions:
    # FastAPI runs them on its thread pool, so /health and ingest never wait behind them.
    @app.get("/v1/drift", responses=_responses(api.DriftResponse, 400), summary="Verdicts per segment")
    def drift_get(model: SegmentParam = None, variant: SegmentParam = None,
                        feature: FeatureParam = None) -> Response:
        return JSONResponse({"segments": [segment_json(state, s, feature) for s in selected(model, variant)]})

    @app.get("/v1/compare", responses=_responses(api.CompareResponse, 400, 404),
             summary="A/B: variant b's window against variant a's")
    def compare(model: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                a: Annotated[str, Query(min_length=1, max_length=TEXT_MAX, description="the reference variant")],
                b: Annotated[str, Query(min_length=1, max_length=TEXT_MAX,
                                        description="the variant compared with a; not a")]) -> Response:
        if a == b:
            return _error(400, "give two different variants 'a' (reference) and 'b'", "invalid_query", field="b")
        verdict = state.compare(model, a, b)
        if verdict is None:
            return _error(404, f"no current window for model '{model}' variant '{a}' and/or '{b}'", "no_data")
        return JSONResponse({"model": model, "a": a, "b": b, "status": verdict.status, "alpha": verdict.alpha,
                             "records": {"a": state.window_records((model, a)), "b": state.window_records((model, b))},
                             "drifted_features": verdict.drifted_features, "features": features_json(verdict)})

    @app.get("/v1/drift/exact", responses=_responses(api.ExactResponse, 400, 404),
             summary="KS and Wasserstein on raw samples (audit)")
    async def drift_exact(model: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                          variant: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                          feature: Annotated[NumericName, Query()]) -> Response:
        if (model, variant) not in state.segments():
            return _error(404, f"no segment model '{model}' variant '{variant}'", "no_data")
        return JSONResponse(state.exact((model, variant), feature))

    @app.get("/v1/fleet-drift", responses=_responses(None, 400, 422, 502, 503),
             summary="Drift from Prometheus histogram buckets over the fleet")
    def fleet(metric: Annotated[str, Query(min_length=1, max_length=200, description="a histogram's base name",
                                           json_schema_extra={"pattern": METRIC_NAME.pattern})],
              reference_end: Annotated[float, Query(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False,
                                                    description="unix seconds; before current_end")],
              selector: Annotated[str, Query(max_length=1000, description='label matchers: model="x",variant="y"',
                                             json_schema_extra={"pattern": SELECTOR.pattern})] = "",
              current_end: Annotated[float | None, Query(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False,
                                                         description="unix seconds; now if left out")] = None,
              window: Annotated[float, Query(gt=0, le=366 * 86400, allow_inf_nan=False,
                                             description="seconds of increase before each end")] = 3600.0) -> Response:
        try:
            result = source.drift(metric, selector, reference_end, time.time() if current_end is None else current_end,
                                  window, state.policy)
        except SourceError as exc:
            return _error(exc.status, str(exc), "fleet_drift_failed", field=exc.field)
        return JSONResponse(result)

    @app.get("/report", response_class=HTMLResponse, responses={400: {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}},
             summary="The HTML report")
    def report_get(model: SegmentParam = None, variant: SegmentParam = None,
                   detail: Annotated[int, Query(ge=0, le=200, description="sections shown in full, worst first; "
                                                "the rest are summary rows")] = report.DETAIL) -> Response:
        rows = []
        for segment in selected(model, variant):
            verdict = state.verdict(segment)
            if verdict is not None:
                rows.append(report.SegmentReport(segment, state.baselines[segment], state.current(segment), verdict,
                                                 state.history(segment), state.drifting_since(segment),
                                                 state.window_records(segment)))
        return HTMLResponse(report.render(rows, state.clock(), ab_report.sections(state, watchlist, model), detail))

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus exposition")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health", responses=_responses(api.Health), summary="Liveness")
    async def health() -> Response:
        return JSONResponse({"status": "ok", **state.snapshot._asdict()})  # no lock: never waits for an ingest

    ab_http.install(app, state, watchlist)
    _publish_request_schemas(app, request_schemas)
    return app


SegmentParam = Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX)]
if TYPE_CHECKING:  # the names are Literals built from the schema at import; mypy sees strings
    FeatureParam = str | None
    NumericName = str
else:
    FeatureParam = Annotated[Literal[tuple(FEATURES)] | None, Query()]
    NumericName = Literal[tuple(f.name for f in NUMERIC_FEATURES)]


def _body(model: type[BaseModel], schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Document a hand-parsed JSON body with ``model``'s schema (published by _publish_request_schemas)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def _publish_request_schemas(app: FastAPI, request_schemas: dict[str, dict[str, Any]]) -> None:
    """Add the hand-parsed bodies' schemas, and drop FastAPI's automatic 422: query errors are
    a 400 in the service's error shape (routes that answer 422 declare it themselves)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(request_schemas)
            for operation in (op for path in doc["paths"].values() for op in path.values()):
                automatic = operation["responses"].get("422", {}).get("content", {}).get("application/json", {})
                if automatic.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                    del operation["responses"]["422"]
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def baseline_json(model: str, variant: str, b: Baseline) -> dict[str, Any]:
    return {"model": model, "variant": variant, "records": b.records, "source": b.source, "created_at": b.created_at,
            "edges": {name: e.values.tolist() for name, e in analysis_edges(b.reference).items()}}
