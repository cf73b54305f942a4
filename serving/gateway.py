"""The gateway: an OpenAI-compatible proxy in front of vLLM that measures each request.

This module is the composition root: it builds each role from the settings and wires them
together; the roles live in modules named for what they hold.

- ``proxy``: the proxy routes' request path (``relay`` for streams, ``relay_client`` to vLLM)
- ``recording``: metrics, feature records and spans, written once per request
- ``access``: API keys, the admin token, admission limits
- ``routing``: experiments' variants and their upstreams
- ``endpoints``: the model list, feedback, admin, metrics and probes (ASGI)
- ``server``: the HTTP protocol that hands the proxy routes to ``proxy`` (``uvicorn_options``)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferwatch import __version__
from inferwatch.config.load import read as read_settings
from inferwatch.config.settings import Settings
from inferwatch.serving.access import Access
from inferwatch.serving.budgets import SYNC_S as BUDGETS_SYNC_S, SharedBudgets
from inferwatch.serving.endpoints import Endpoints
from inferwatch.serving.exposition import render
from inferwatch.serving.features import FeatureFanout, FeatureQueue, FeatureSink, HttpSink
from inferwatch.serving.feedback import AnswerMemory, FeedbackFanout, FeedbackSink, RatingSink
from inferwatch.serving.genai_metrics import genai_metrics
from inferwatch.serving.goodput import Goodput
from inferwatch.serving.metrics import GatewayMetrics, create_metrics
from inferwatch.serving.proxy import Proxy
from inferwatch.serving.recording import Recorder
from inferwatch.serving.routing import Experiments
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.shared_answers import SharedAnswers
from inferwatch.serving.shared_limits import SYNC_S, SharedAdmission
from inferwatch.serving.shared_state import SharedState, every
from inferwatch.serving.tracing import ServerSpans, build_tracer_provider, get_tracer
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.validation import ROUTE_PATHS
from inferwatch.serving.worker_metrics import WorkerView, serve_own
from inferwatch.serving.workers import WorkerSlot


class Gateway:
    def __init__(self, settings: GatewaySettings, registry: CollectorRegistry, *,
                 feature_sink: FeatureSink | None = None, span_exporter: SpanExporter | None = None,
                 feedback_sink: RatingSink | None = None, worker: WorkerSlot | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics: GatewayMetrics = create_metrics(registry, shared_state=settings.redis_url is not None)
        self.shared = (SharedState(settings.redis_url.get_secret_value(), settings.redis_key_prefix,
                                   settings.redis_timeout_s, self.metrics.shared_state_up,
                                   self.metrics.shared_state_errors)
                       if settings.redis_url is not None else None)
        self.metrics.build.info({"version": __version__, "variant": settings.variant, "upstream": settings.upstream_url})
        self.upstream = Upstream(settings, self.metrics)
        self.experiments = (Experiments(settings.experiment_file, settings, self.metrics, self.upstream, self.shared)
                            if settings.experiment_file is not None else None)
        self.tracer_provider: TracerProvider | None = build_tracer_provider(settings, self.metrics.spans_dropped,
                                                                            span_exporter)
        tracer = get_tracer(self.tracer_provider)
        drift_token = settings.drift_token.get_secret_value() if settings.drift_token else None
        queue_options: dict[str, Any] = {"maxsize": settings.feature_queue_size, "batch_size": settings.feature_batch_size,
                         "flush_s": settings.feature_flush_s}
        destinations = settings.drift_destinations
        self.features: FeatureQueue | FeatureFanout | None = None
        queues: dict[str, FeatureQueue] = {}
        if feature_sink is not None:
            self.features = FeatureQueue(feature_sink, self.metrics, **queue_options)
        elif destinations:
            queues = {url: FeatureQueue(HttpSink(url, drift_token), self.metrics, destination=url, **queue_options)
                      for url in destinations}
            self.features = FeatureFanout(list(queues.values()))
        if feedback_sink is None and destinations:
            feedback_sink = FeedbackFanout({url: FeedbackSink(url, drift_token) for url in destinations},
                                           self.metrics, settings.feature_queue_size, queues)
        self.feedback_sink = feedback_sink
        answers = AnswerMemory(settings.feedback_memory, settings.feedback_ttl_s,
                               shared=SharedAnswers(self.shared, settings.feedback_ttl_s) if self.shared else None) \
            if settings.feedback_memory else None
        self.answers = answers
        self.access = Access(settings, self.metrics, self.shared, registry)
        self._syncs: list[asyncio.Task] = []
        objectives = read_settings(settings.config_file)[0] if settings.config_file is not None else Settings()
        self.genai = genai_metrics(settings)
        self.recorder = Recorder(self.metrics, self.features, answers, Goodput(objectives), self.genai)
        self.upstream.on_models = lambda models: self.recorder.served(models, settings.variant)
        self.proxy = Proxy(settings, self.upstream, self.experiments, self.access, self.recorder, tracer,
                           ServerSpans(tracer, settings.trace_sample_ratio, self.tracer_provider is not None))
        self.endpoints = Endpoints(registry, self.metrics, settings.max_body_bytes, self.upstream, self.experiments,
                                   self.access, answers, feedback_sink)
        self.worker = worker
        self._own_metrics: asyncio.Server | None = None
        if worker is not None:
            self.endpoints.workers = WorkerView(worker.index, worker.ports, partial(render, registry))

    async def start(self) -> None:
        if self.worker is not None:
            self._own_metrics = await serve_own(self.worker.sock, partial(render, self.registry))
        if self.shared is not None:
            await self.shared.start()
            if isinstance(self.access.admission, SharedAdmission):
                self._syncs.append(asyncio.create_task(every(SYNC_S, self.access.admission.sync, "limits sync")))
            if isinstance(self.access.budgets, SharedBudgets):
                self._syncs.append(asyncio.create_task(every(BUDGETS_SYNC_S, self.access.budgets.sync,
                                                             "budgets sync")))
        await self.upstream.start()
        if self.experiments is not None:
            await self.experiments.start()
        if self.features is not None:
            self.features.start()
        if isinstance(self.feedback_sink, FeedbackFanout):
            self.feedback_sink.start()

    async def stop(self) -> None:
        if self.features is not None:
            await self.features.stop()
        if self.shared is not None:
            for sync in self._syncs:
                sync.cancel()
            if self.answers is not None and self.answers.shared is not None:
                await self.answers.shared.flush()
        await self.upstream.close()
        if self.experiments is not None:
            await self.experiments.close()
        if self.feedback_sink is not None:
            await self.feedback_sink.close()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.genai is not None:
            self.genai.shutdown()
        if self.shared is not None:
            await self.shared.close()
        if self._own_metrics is not None:
            self._own_metrics.close()


def create_app(settings: GatewaySettings, registry: CollectorRegistry | None = None, *,
               feature_sink: FeatureSink | None = None, span_exporter: SpanExporter | None = None,
               feedback_sink: RatingSink | None = None, worker: WorkerSlot | None = None) -> FastAPI:
    """Build the ASGI app; ``registry`` defaults to a fresh one (never the global). Serve it
    with ``serving.server.uvicorn_options(app.state.gateway.proxy)``; ``worker``: one of
    several processes (serving/workers.py)."""
    gateway = Gateway(settings, registry or CollectorRegistry(), feature_sink=feature_sink,
                      span_exporter=span_exporter, feedback_sink=feedback_sink, worker=worker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="inferwatch gateway", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    endpoints = gateway.endpoints
    app.add_exception_handler(StarletteHTTPException, endpoints.http_error)
    app.router.redirect_slashes = False  # a 307 with an empty body is no answer for an OpenAI client
    for path in ROUTE_PATHS.values():  # so that other methods get a 405
        app.router.add_route(path, endpoints.served_by_the_protocol, methods=["POST"])
    app.router.add_route("/v1/models", endpoints.list_models, methods=["GET"])
    app.router.add_route("/v1/feedback", endpoints.feedback, methods=["POST"])
    app.router.add_route("/admin/experiments", endpoints.experiments_get, methods=["GET"])
    app.router.add_route("/admin/experiments/{model:path}/weights", endpoints.weights_put, methods=["PUT"])
    app.router.add_route("/health", endpoints.health, methods=["GET"])
    app.router.add_route("/ready", endpoints.ready, methods=["GET"])
    app.router.add_route("/metrics", endpoints.render_metrics, methods=["GET"])
    return app
