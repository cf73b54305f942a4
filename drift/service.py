"""The drift service: ingest feature records, keep windows, serve drift as JSON, Prometheus
metrics and an HTML report. Thin HTTP over ``DriftState``."""

from __future__ import annotations

import hmac
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Iterator

import orjson
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from drift import metrics as drift_metrics
from drift import report
from drift.methods import DriftResult
from drift.prometheus_source import PrometheusSource, SourceError
from drift.schema import NUMERIC_FEATURES, BatchError
from drift.state import DriftState, WindowConfig
from drift.store import Store
from inferwatch import __version__


class DriftSettings(BaseSettings):
    """INFERWATCH_DRIFT_* or flags."""

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
    prometheus_url: str = Field("http://127.0.0.1:9090", description="for fleet-wide drift from buckets")


def _error(status: int, message: str, code: str, **extra: object) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code, **extra}},
                        status_code=status)


def result_json(r: DriftResult) -> dict:
    return {"method": r.method, "kind": r.kind, "direction": r.direction, "score": r.score,
            "threshold": r.threshold, "drifted": r.drifted, "status": r.status}


class DriftCollector(Collector):
    """Scores computed at scrape time from the windows: always current, nothing cached."""

    def __init__(self, state: DriftState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        score, detected, threshold, records, base = (
            GaugeMetricFamily(m.name, m.doc, labels=list(m.labels))
            for m in (drift_metrics.SCORE, drift_metrics.DETECTED, drift_metrics.THRESHOLD, drift_metrics.WINDOW_RECORDS,
                      drift_metrics.BASELINE_RECORDS))
        for segment in self.state.segments():
            records.add_metric(list(segment), self.state.window_records(segment))
            baseline = self.state.baselines.get(segment)
            if baseline is not None:
                base.add_metric(list(segment), baseline.records)
            for feature, methods in self.state.results(segment).items():
                for r in methods.values():
                    if r.score is None:
                        continue
                    key = [*segment, feature, r.method]
                    score.add_metric(key, r.score)
                    detected.add_metric(key, 1.0 if r.drifted else 0.0)
                    threshold.add_metric(key, r.threshold)
        yield from (score, detected, threshold, records, base)


def create_app(settings: DriftSettings, registry: CollectorRegistry | None = None,
               state: DriftState | None = None) -> FastAPI:
    registry = registry or CollectorRegistry()
    store = state.store if state else Store(settings.db_path)
    state = state or DriftState(store, WindowConfig(settings.window_s, settings.buckets, settings.reservoir,
                                                    settings.retention_s))
    registry.register(DriftCollector(state))
    ingested, rejected = (Counter(m.name, m.doc, m.labels, registry=registry)
                          for m in (drift_metrics.INGESTED, drift_metrics.REJECTED))
    token = settings.token.get_secret_value().encode() if settings.token else None
    source = PrometheusSource(settings.prometheus_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.restore()
        yield
        store.close()

    app = FastAPI(title="inferwatch drift", version=__version__, lifespan=lifespan)
    app.state.drift = state

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

    async def ingest(request: Request) -> Response:
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        try:
            accepted, in_window = state.ingest(body)
        except BatchError as exc:
            rejected.labels("invalid").inc()
            return _error(422, str(exc), "invalid_batch", record=exc.record, field=exc.field)
        ingested.inc(accepted)
        return JSONResponse({"accepted": accepted, "in_window": in_window})

    async def read_object(request: Request) -> dict | Response:
        """An authorised, size-checked JSON object body, or the error response to send."""
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _error(422, f"body is not valid JSON: {exc}", "invalid_json")
        if not isinstance(doc, dict) or not doc:
            return _error(422, "body must be a non-empty JSON object", "invalid_body")
        return doc

    async def baselines_post(request: Request) -> Response:
        doc = await read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            model, variant = doc.get("model"), doc.get("variant")
            if not isinstance(model, str) or not isinstance(variant, str) or not model or not variant:
                raise BatchError("'model' and 'variant' are required strings", field="model")
            if "histograms" in doc:
                baseline = state.upload_baseline((model, variant), doc["histograms"])
            else:
                since, until = doc.get("from"), doc.get("to")
                if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (since, until)):
                    raise BatchError("give 'from' and 'to' (unix seconds) or 'histograms'", field="from")
                if since >= until:
                    raise BatchError("'from' must be before 'to'", field="from")
                baseline = state.freeze_baseline((model, variant), float(since), float(until))
        except BatchError as exc:
            return _error(422, str(exc), "invalid_baseline", field=exc.field)
        return JSONResponse({"model": model, "variant": variant, "records": baseline.records,
                             "source": baseline.source}, status_code=201)

    async def thresholds_put(request: Request) -> Response:
        doc = await read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            return JSONResponse(state.set_thresholds(doc))
        except BatchError as exc:
            return _error(422, str(exc), "invalid_threshold", field=exc.field)

    async def thresholds_get(request: Request) -> Response:
        return JSONResponse(state.thresholds)

    async def baselines_get(request: Request) -> Response:
        return JSONResponse([{"model": m, "variant": v, "records": b.records, "source": b.source}
                             for (m, v), b in sorted(state.baselines.items())])

    def selected(request: Request) -> list[tuple[str, str]]:
        model, variant = request.query_params.get("model"), request.query_params.get("variant")
        return [s for s in state.segments() if (model is None or s[0] == model) and (variant is None or s[1] == variant)]

    async def drift_get(request: Request) -> Response:
        feature = request.query_params.get("feature")
        out = []
        for segment in selected(request):
            results = state.results(segment)
            if feature is not None:
                results = {k: v for k, v in results.items() if k == feature}
            out.append({"model": segment[0], "variant": segment[1], "window_records": state.window_records(segment),
                        "baseline_records": state.baselines[segment].records if segment in state.baselines else 0,
                        "features": {f: {m: result_json(r) for m, r in ms.items()} for f, ms in results.items()}})
        return JSONResponse({"segments": out})

    async def compare(request: Request) -> Response:
        q = request.query_params
        model, a, b = q.get("model"), q.get("a"), q.get("b")
        if not model or not a or not b or a == b:
            return _error(400, "give 'model' and two different variants 'a' (reference) and 'b'", "invalid_query")
        results = state.compare(model, a, b)
        if not results:
            return _error(404, f"no current window for model '{model}' variant '{a}' and/or '{b}'", "no_data")
        return JSONResponse({"model": model, "a": a, "b": b,
                             "records": {"a": state.window_records((model, a)), "b": state.window_records((model, b))},
                             "features": {f: {m: result_json(r) for m, r in ms.items()} for f, ms in results.items()}})

    async def drift_exact(request: Request) -> Response:
        feature, segments = request.query_params.get("feature"), selected(request)
        numeric = [f.name for f in NUMERIC_FEATURES]
        if feature not in numeric or len(segments) != 1:
            return _error(400, f"give 'model', 'variant' (one segment) and 'feature', one of {', '.join(numeric)}",
                          "invalid_query")
        return JSONResponse(state.exact(segments[0], feature))

    async def fleet(request: Request) -> Response:
        q = request.query_params
        try:
            result = source.drift(q.get("metric", ""), q.get("selector", ""), _num(q, "reference_end"),
                                  _num(q, "current_end", time.time()), _num(q, "window", 3600.0))
        except SourceError as exc:
            return _error(exc.status, str(exc), "fleet_drift_failed")
        return JSONResponse(result)

    async def report_get(request: Request) -> Response:
        rows = []
        for segment in selected(request):
            results = state.results(segment)
            if results:
                rows.append((segment, state.baselines[segment].histograms, state.current(segment), results))
        return HTMLResponse(report.render(rows))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "segments": len(state.segments()), "ingested": state.ingested})

    for path, endpoint, methods in (
        ("/v1/ingest", ingest, ["POST"]), ("/v1/baselines", baselines_post, ["POST"]),
        ("/v1/baselines", baselines_get, ["GET"]), ("/v1/drift", drift_get, ["GET"]),
        ("/v1/drift/exact", drift_exact, ["GET"]), ("/v1/fleet-drift", fleet, ["GET"]),
        ("/v1/thresholds", thresholds_put, ["PUT"]), ("/v1/thresholds", thresholds_get, ["GET"]),
        ("/v1/compare", compare, ["GET"]),
        ("/report", report_get, ["GET"]), ("/metrics", metrics, ["GET"]), ("/health", health, ["GET"]),
    ):
        app.router.add_route(path, endpoint, methods=methods)
    return app


def _num(params, name: str, default: float | None = None) -> float:
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise SourceError(400, f"query parameter '{name}' is required")
        return default
    try:
        return float(raw)
    except ValueError:
        raise SourceError(400, f"query parameter '{name}' must be a number") from None
