"""The drift service: ingest feature records and ratings, keep windows, baselines and
experiment ledgers, serve drift and A/B verdicts as JSON, Prometheus metrics and an HTML
report. Its settings, and the app: the roles (``DriftState``) under thin routes, one module
per resource."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import ClassVar, Literal

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Counter
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from inferwatch import __version__
from inferwatch.common.secret_files import SecretFileSettings
from inferwatch.drift import metrics as drift_metrics
from inferwatch.drift.ab import http as ab_http
from inferwatch.drift.ab.cost import PrometheusCost
from inferwatch.drift.ab.exposition import AbCollector, Watchlist
from inferwatch.drift.errors import CatchAll, error_response, http_error
from inferwatch.drift.prometheus_source import PrometheusSource
from inferwatch.drift.service import baselines, fleet, pages, records, segments, thresholds
from inferwatch.drift.service.collector import DriftCollector
from inferwatch.drift.service.http import Bodies
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.thresholds import smallest_alpha
from inferwatch.drift.window_config import WindowConfig

log = logging.getLogger(__name__)


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


def _checkpoint_loop(state: DriftState, every_s: float, stop: threading.Event) -> None:
    """Write changed experiment ledgers every ``every_s``; a failed write is tried again at
    the next (the ledgers stay marked changed) and never stops the service."""
    while not stop.wait(every_s):
        try:
            state.ledgers.checkpoint()
        except Exception:
            log.exception("experiment ledger checkpoint failed")


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
    registry.register(AbCollector(state.ledgers, watchlist))
    ingested, rejected, internal_errors = (Counter(m.name, m.doc, m.labels, registry=registry) for m in (
        drift_metrics.INGESTED, drift_metrics.REJECTED, drift_metrics.INTERNAL_ERRORS))
    token = settings.token.get_secret_value().encode() if settings.token else None
    bodies = Bodies(token, settings.max_body_bytes, rejected)

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
        state.ledgers.checkpoint()
        store.close()

    app = FastAPI(title="inferwatch drift", version=__version__, lifespan=lifespan,
                  description="Drift of LLM request features against baselines, with calibrated thresholds.")
    app.state.drift = state
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(CatchAll, errors=internal_errors)

    @app.exception_handler(RequestValidationError)
    async def invalid_query(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return error_response(400, f"'{where}': {first.get('msg', 'invalid')}", "invalid_query", field=where)

    records.install(app, state, bodies, ingested)
    baselines.install(app, state, bodies)
    thresholds.install(app, state, bodies)
    segments.install(app, state)
    fleet.install(app, state, PrometheusSource(settings.prometheus_url))
    pages.install(app, state, watchlist, registry)
    ab_http.install(app, state.ledgers, watchlist)
    bodies.publish(app)
    return app
