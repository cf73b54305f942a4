"""The gateway: an OpenAI-compatible proxy in front of vLLM that measures each request.

Per request: validate and route (the server span's ``preprocessed`` event), call vLLM with
the trace context injected (``{operation} {model}`` client span, which vLLM's
``llm_request`` span joins and which lasts until the answer is relayed), then relay the
answer while timing tokens (``first_token`` event). Metrics, the feature record and span
attributes are written once, when the request ends.

Two spans, not one per phase: a sampled request's spans cost ~90 µs each in OpenTelemetry's
Python SDK and OTLP encoder (bench/gateway_overhead.py), more than the rest of the request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import orjson
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from inferwatch import __version__
from inferwatch.serving import errors
from inferwatch.serving.admission import ANONYMOUS, Admission, PolicyFile, Rejection, Ticket, key_id
from inferwatch.serving.errors import GatewayError, status_class
from inferwatch.serving.experiment import FORCE_HEADER, FORCE_TOKEN_HEADER, ExperimentError, Split
from inferwatch.serving.exchange import BODY_TIMEOUT_S, CLIENT_CLOSED, Exchange, check_declared_length
from inferwatch.serving.experiments import Experiments
from inferwatch.serving.exposition import render
from inferwatch.serving.features import FeatureQueue, FeatureRecord, FeatureSink, HttpSink
from inferwatch.serving.feedback import AnswerMemory, FeedbackSink, parse_rating, unknown_answer
from inferwatch.serving.metrics import UNKNOWN_MODEL, UNROUTED, GatewayMetrics, RouteSeries, create_metrics, observe_many
from inferwatch.serving.lazy_timer import SLACK_S, LazyTimer
from inferwatch.serving.relay_client import UpstreamResponse
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.sse import EventProcessor, SSESplitter, StreamAccount, chunk_logprobs, strip_logprobs
from inferwatch.serving.tracing import PROPAGATOR, ServerSpans, build_tracer_provider, exemplar, get_tracer, inject_context
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.validation import ROUTE_PATHS, ParsedRequest, Route, parse_request, upstream_payload


log = logging.getLogger(__name__)

RELAY_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                 (b"x-accel-buffering", b"no")]
VARIANT_HEADER = b"x-inferwatch-variant"  # on answers an experiment routed: which variant gave it
_RESPONSE_ID = re.compile(rb'"id":"([^"\\]{1,256})"')
OPERATION = {"chat": "chat", "completions": "text_completion"}


@dataclass
class RequestState:
    """What one request carries from preprocess to the end of the relay."""

    route: Route
    path: str
    started: float  # perf_counter
    started_at: float  # unix time
    span: trace.Span
    ctx: Context
    variant: str  # the settings' one, or the variant an experiment routed the request to
    upstream: Upstream
    model: str = UNKNOWN_MODEL
    req: ParsedRequest | None = None
    key: str = ANONYMOUS  # the API key's id (serving/admission.py), never the key
    body_bytes: int = 0  # of the client's request: a prompt's size when vLLM's count never came
    ticket: Ticket | None = None  # admission's, given back when the request ends
    experiment: str | None = None  # set when the experiment's split assigned the request
    unit: str | None = None  # the hashed unit key the assignment used
    rename: tuple[bytes, bytes] | None = None  # the variant's served model name → the public one
    response_id: str | None = None  # the answer's id, remembered for feedback
    routed: bool = False  # an experiment chose the variant: the response says which
    forced: bool = False  # the force header picked (or tried to pick) the variant: test traffic, no feature record


class Gateway:
    def __init__(self, settings: GatewaySettings, registry: CollectorRegistry, *,
                 feature_sink: FeatureSink | None = None, span_exporter: SpanExporter | None = None,
                 feedback_sink: FeedbackSink | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics: GatewayMetrics = create_metrics(registry)
        self._route_series: dict[tuple[str, str, str], RouteSeries] = {}
        self.metrics.build.info({"version": __version__, "variant": settings.variant, "upstream": settings.upstream_url})
        self.upstream = Upstream(settings, self.metrics)
        self.experiments = (Experiments(settings.experiment_file, settings, self.metrics, self.upstream)
                            if settings.experiment_file is not None else None)
        self._admin_token = settings.admin_token.get_secret_value().encode() if settings.admin_token else None
        self.tracer_provider: TracerProvider | None = build_tracer_provider(settings, span_exporter)
        self.tracer = get_tracer(self.tracer_provider)
        self.server_spans = ServerSpans(self.tracer, settings.trace_sample_ratio, self.tracer_provider is not None)
        if feature_sink is None and settings.drift_url:
            token = settings.drift_token.get_secret_value() if settings.drift_token else None
            feature_sink = HttpSink(settings.drift_url, token)
        self.features = (
            FeatureQueue(feature_sink, self.metrics, maxsize=settings.feature_queue_size,
                         batch_size=settings.feature_batch_size, flush_s=settings.feature_flush_s)
            if feature_sink is not None else None
        )
        if feedback_sink is None and settings.drift_url:
            token = settings.drift_token.get_secret_value() if settings.drift_token else None
            feedback_sink = FeedbackSink(settings.drift_url, token)
        self.feedback_sink = feedback_sink
        self.answers = AnswerMemory(settings.feedback_memory, settings.feedback_ttl_s) if settings.feedback_memory \
            else None
        self._keys = [k.get_secret_value().encode() for k in settings.api_keys]
        self._key_ids = [key_id(k.get_secret_value()) for k in settings.api_keys]
        self.limits: PolicyFile | None = None
        self.admission: Admission | None = None
        if settings.limits_file is not None:
            self.limits = PolicyFile(settings.limits_file, self._limits_error)
            self.admission = Admission(self.limits.policy)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self.upstream.start()
        if self.experiments is not None:
            await self.experiments.start()
        if self.features is not None:
            self.features.start()

    async def stop(self) -> None:
        if self.features is not None:
            await self.features.stop()
        await self.upstream.close()
        if self.experiments is not None:
            await self.experiments.close()
        if self.feedback_sink is not None:
            await self.feedback_sink.close()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()

    def _limits_error(self, message: str) -> None:
        log.error("limits file: %s", message)
        self.metrics.limits_reload_errors.inc()

    # -- endpoints -------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        try:
            self._authorize(request.headers)
            async with self.upstream.session.get(f"{self.upstream.base_url}/v1/models", headers=self.upstream.headers,
                                                 timeout=self.upstream.timeout()) as resp:
                raw = await resp.read()
                if self.experiments is not None and resp.status == 200:
                    raw = _with_public_models(raw, self.experiments)
                return Response(raw, resp.status, media_type="application/json")
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _upstream_unavailable(exc)

    async def feedback(self, request: Request) -> Response:
        """POST /v1/feedback: a rating of an answer, forwarded to the drift service with the
        variant that gave the answer. Each answer can be rated once."""
        try:
            self._authorize(request.headers)
            if self.answers is None:
                raise GatewayError(404, "feedback_disabled", "Feedback is off: this gateway runs with "
                                   "INFERWATCH_GATEWAY_FEEDBACK_MEMORY=0.", error_type=errors.NOT_FOUND)
            rating = parse_rating(await _read_body(request, self.settings.max_body_bytes))
            answer = self.answers.find(rating.response_id)
            if answer is None:
                raise unknown_answer(rating.response_id, self.answers)
            if answer.rated:
                raise GatewayError(409, "already_rated", f"The answer '{rating.response_id[:80]}' has been rated "
                                   "already; each answer counts once.", param="response_id")
            if self.feedback_sink is None:
                raise GatewayError(503, "feedback_unavailable", "Feedback has nowhere to go: set "
                                   "INFERWATCH_GATEWAY_DRIFT_URL.", error_type=errors.UPSTREAM)
            record = {"model": answer.model, "variant": answer.variant, "experiment": answer.experiment,
                      "score": rating.score, "at": time.time()}
            # marked before the await: a concurrent rating of the same answer sees it and gets
            # the 409, instead of passing the check while this one is still on its way to drift
            answer.rated = True
            try:
                await self.feedback_sink.send([record])
            except BaseException as exc:  # the drift service's failure (or a cancel): the client may retry
                answer.rated = False
                if not isinstance(exc, Exception):
                    raise
                self.metrics.feedback.labels(answer.model, answer.variant, "undelivered").inc()
                log.warning("feedback for %s not delivered: %s", answer.variant, exc)
                raise GatewayError(503, "feedback_unavailable", "The drift service did not take the rating; "
                                   "retry later.", error_type=errors.UPSTREAM) from None
            self.metrics.feedback.labels(answer.model, answer.variant,
                                         "positive" if rating.score >= 0.5 else "negative").inc()
            return JSONResponse({"response_id": rating.response_id, "model": answer.model, "variant": answer.variant,
                                 "experiment": answer.experiment, "score": rating.score})
        except GatewayError as exc:
            self.metrics.rejected.labels("/v1/feedback", exc.code).inc()
            return Response(exc.body(), exc.status, media_type="application/json")

    async def experiments_get(self, request: Request) -> Response:
        """GET /admin/experiments: every experiment with its current weights."""
        try:
            self._authorize_admin(request)
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        return JSONResponse(self.experiments.describe() if self.experiments else {"experiments": []})

    async def weights_put(self, request: Request) -> Response:
        """PUT /admin/experiments/{model}/weights with ``{"weights": {variant: weight}}``."""
        model = request.path_params["model"]
        try:
            self._authorize_admin(request)
            split = self.experiments.splits.get(model) if self.experiments else None
            if split is None or self.experiments is None:
                raise GatewayError(404, "experiment_not_found", f"No experiment for model '{model[:200]}'; "
                                   f"experiments: {', '.join(self.experiments.splits) if self.experiments else 'none'}.",
                                   param="model", error_type=errors.NOT_FOUND)
            try:
                doc = orjson.loads(await _read_body(request, self.settings.max_body_bytes))
            except orjson.JSONDecodeError as exc:
                raise GatewayError(400, "invalid_json", f"Request body is not valid JSON: {exc}.") from None
            if not isinstance(doc, dict) or set(doc) != {"weights"}:
                raise GatewayError(400, "invalid_weights", 'Request body must be {"weights": {"<variant>": <0..1>, '
                                   '...}}.', param="weights")
            try:
                new = await self.experiments.set_weights(model, doc["weights"])
            except ExperimentError as exc:
                raise GatewayError(400, "invalid_weights", str(exc), param=exc.field) from None
            except OSError as exc:
                raise GatewayError(500, "not_persisted", f"The weights could not be saved ({exc}); nothing changed.",
                                   error_type=errors.UPSTREAM) from None
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        return JSONResponse(new.describe())

    def _authorize_admin(self, request: Request) -> None:
        if self._admin_token is None:
            raise GatewayError(403, "admin_disabled", "The admin endpoints are off: start the gateway with "
                               "INFERWATCH_GATEWAY_ADMIN_TOKEN.", error_type=errors.AUTHENTICATION)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._admin_token):
            raise GatewayError(401, "invalid_admin_token", "Missing or invalid admin token: send "
                               "'Authorization: Bearer <INFERWATCH_GATEWAY_ADMIN_TOKEN>'.",
                               error_type=errors.AUTHENTICATION)

    async def render_metrics(self, request: Request) -> Response:
        """Prometheus text, or OpenMetrics (with exemplars) when the scraper asks for it.

        Rendered on a worker thread (serving/exposition.py): milliseconds of formatting at
        many models and variants would otherwise stall every request on the event loop."""
        accept = request.headers.get("accept", "")
        try:
            choose_encoder(accept)
        except (TypeError, ValueError):  # prometheus_client fails on e.g. "version=abc"
            return Response(errors.error_body(f"Accept header '{accept[:200]}' cannot be read; scrape with "
                                              "'application/openmetrics-text; version=1.0.0' or text/plain.",
                                              errors.INVALID_REQUEST, "invalid_accept"),
                            400, media_type="application/json")
        body, content_type = await asyncio.to_thread(render, self.registry, accept)
        return Response(body, headers={"content-type": content_type})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        if await self.upstream.healthy():
            return JSONResponse({"status": "ready", "upstream": self.upstream.base_url,
                                 "models": sorted(self.upstream.models)})
        return JSONResponse({"status": "not ready", "upstream": self.upstream.base_url,
                             "reason": "upstream /health did not answer 200"}, status_code=503)

    # -- the request path ----------------------------------------------------------------

    async def serve(self, exchange: Exchange) -> None:
        """A request on a proxy route, from its head to the last byte of its answer."""
        route = exchange.route
        path = ROUTE_PATHS[route]
        parent = PROPAGATOR.extract(exchange.headers)
        span = self.server_spans.start(f"POST {path}", parent,
                                       {"http.request.method": "POST", "http.route": path, "url.path": path})
        state = RequestState(route, path, time.perf_counter(), time.time(), span,
                             trace.set_span_in_context(span, parent) if span.is_recording() else parent,
                             self.settings.variant, self.upstream)
        try:
            req, body = await self._preprocess(exchange, state)
        except GatewayError as exc:
            self.metrics.rejected.labels(path, exc.code).inc()
            self._finish(state, exc.status, None, error=exc.message)
            exchange.answer(exc.status, exc.body(), exc.headers)
            return
        self._series(state.model, state.variant, state.path).in_flight.inc()
        if exchange.gone:  # left with its body sent: vLLM never sees the request
            self._done(state, CLIENT_CLOSED, None, "client closed the connection")
            return
        task = asyncio.current_task()
        assert task is not None
        exchange.watch(task.cancel)  # a client that leaves cancels the upstream call: vLLM aborts
        try:
            if req.stream:
                await self._stream(exchange, state, req, body)
            else:
                await self._unary(exchange, state, req, body)
        except asyncio.CancelledError:
            if not exchange.disconnected:
                raise  # we are cancelled ourselves (shutdown)
            task.uncancel()  # the client left; what was cut short has recorded the 499
        finally:
            exchange.watch(None)

    async def _preprocess(self, exchange: Exchange, state: RequestState) -> tuple[ParsedRequest, bytes]:
        state.key = self._authorize(exchange.headers)
        body = await exchange.read_body(self.settings.max_body_bytes)
        state.body_bytes = len(body)
        models = self.upstream.models if self.experiments is None else self.experiments.catalog
        try:
            req = parse_request(state.route, body, models, self.settings.max_tokens_limit)
        except GatewayError as exc:
            if exc.code != "model_not_found":
                raise
            if not await self.upstream.on_unknown_model():
                if not self.upstream.models:  # never reached vLLM: it is down, not the model unknown
                    self.metrics.upstream_errors.labels(UNKNOWN_MODEL, self.settings.variant, "connect").inc()
                    raise GatewayError(503, "upstream_unavailable",
                                       f"The model server at {self.upstream.base_url} is not reachable; "
                                       "retry later.", error_type=errors.UPSTREAM) from None
                raise
            req = parse_request(state.route, body, models, self.settings.max_tokens_limit)
        state.model, state.req = req.model, req
        served = None
        if self.experiments is not None:
            split = self.experiments.splits.get(req.model)
            if split is not None:
                served = self._route(exchange.headers, state, req, split)
        if self.admission is not None:
            self._admit(state)
        payload, changed = upstream_payload(req, self.settings.capture_logprobs)
        if served is not None:
            payload, changed = {**payload, "model": served}, True
        span = state.span
        if span.is_recording():
            # the request's parameters are the client span's (GenAI conventions); the model is
            # here too, to find a request's trace by model
            span.set_attributes({"gen_ai.request.model": req.model, "inferwatch.variant": state.variant})
            if state.experiment is not None:
                span.set_attributes({"inferwatch.experiment": state.experiment, "inferwatch.unit": state.unit or ""})
            span.add_event("preprocessed")
        return req, orjson.dumps(payload) if changed else body

    def _route(self, headers: Mapping[str, str], state: RequestState, req: ParsedRequest, split: Split) -> str | None:
        """Pick the variant (forced by header, else the split's assignment, counted now) and
        point the request at its upstream; the served name to send, if not the public one."""
        assert self.experiments is not None
        forced = headers.get(FORCE_HEADER)
        if forced is not None:
            state.forced = True
            index = self._forced_index(headers, req, split, forced)
        else:
            unit = req.payload.get("user")
            if not isinstance(unit, str) or not unit:
                unit = headers.get(self.settings.unit_header) or (state.key if state.key != ANONYMOUS else None)
            index, state.unit = split.assign(unit)
            state.experiment = split.name
            self.experiments.counters[req.model][index].inc()
        variant = split.variants[index]
        state.routed = True
        state.variant, state.upstream, state.rename = (variant.name, self.experiments.upstreams[variant.upstream_url],
                                                       variant.rename)
        return None if variant.rename is None else variant.served_model

    def _forced_index(self, headers: Mapping[str, str], req: ParsedRequest, split: Split, forced: str) -> int:
        """The variant the force header names. Forcing bypasses the weights, so it takes the
        admin token (any client could otherwise send users to a broken canary), and a variant
        rolled back to weight 0 is refused unless ``force_zero_weight`` allows it for testing."""
        presented = headers.get(FORCE_TOKEN_HEADER, "").strip().encode()
        if self._admin_token is None or not hmac.compare_digest(presented, self._admin_token):
            raise GatewayError(403, "forcing_not_allowed", f"Header '{FORCE_HEADER}' forces a variant only with "
                               f"'{FORCE_TOKEN_HEADER}: <INFERWATCH_GATEWAY_ADMIN_TOKEN>' (and the gateway started "
                               "with that token).", param=FORCE_HEADER, error_type=errors.AUTHENTICATION)
        index = split.index(forced)
        if index is None:
            raise GatewayError(400, "unknown_variant",
                               f"Header '{FORCE_HEADER}' names variant '{forced[:64]}', which experiment "
                               f"'{split.name}' of model '{req.model}' does not have (variants: "
                               f"{', '.join(v.name for v in split.variants)}).", param=FORCE_HEADER)
        if split.weights[index] == 0 and not self.settings.force_zero_weight:
            raise GatewayError(409, "variant_rolled_back",
                               f"Variant '{forced[:64]}' of experiment '{split.name}' has weight 0 (rolled back); "
                               "forcing it is refused unless the gateway runs with "
                               "INFERWATCH_GATEWAY_FORCE_ZERO_WEIGHT=true.", param=FORCE_HEADER)
        return index

    def _authorize(self, headers: Mapping[str, str]) -> str:
        """The id of the API key presented (``ANONYMOUS`` when the gateway has none)."""
        if not self._keys:
            return ANONYMOUS
        scheme, _, token = headers.get("authorization", "").partition(" ")
        presented = token.strip().encode()
        matched = -1
        for i, key in enumerate(self._keys):  # every key compared, so timing says nothing about which matched
            if hmac.compare_digest(key, presented):
                matched = i
        if matched < 0 or scheme.lower() != "bearer":
            raise GatewayError(401, "invalid_api_key",
                               "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                               error_type=errors.AUTHENTICATION)
        return self._key_ids[matched]

    def _admit(self, state: RequestState) -> None:
        assert self.admission is not None and self.limits is not None
        self.admission.policy = self.limits.current()
        verdict = self.admission.admit(state.key, state.model)
        if isinstance(verdict, Rejection):
            self.metrics.admission_rejected.labels(state.model, verdict.scope, verdict.limit).inc()
            raise GatewayError(429, "rate_limit_exceeded", verdict.message, error_type=errors.RATE_LIMIT,
                               headers={"retry-after": str(max(1, math.ceil(verdict.retry_after_s)))})
        state.ticket = verdict

    def _upstream_call_span(self, state: RequestState, req: ParsedRequest) -> tuple[trace.Span, dict[str, str]]:
        """The GenAI client span of the call to vLLM, with the request's parameters, and the
        headers that carry its context (vLLM joins a trace sampled out too, as sampled out)."""
        headers = dict(state.upstream.headers)
        if not state.span.is_recording():
            inject_context(headers, state.span)
            return trace.INVALID_SPAN, headers
        op = OPERATION[req.route]
        span = self.tracer.start_span(f"{op} {req.model}", context=state.ctx, kind=SpanKind.CLIENT,
                                      attributes=_request_attributes(req))
        span.set_attribute("server.address", state.upstream.base_url)
        inject_context(headers, span)
        return span, headers

    async def _unary(self, exchange: Exchange, state: RequestState, req: ParsedRequest, body: bytes) -> None:
        """The whole answer, read from vLLM and handed over. A client that leaves meanwhile
        cancels this (``serve``), which closes the upstream connection: vLLM aborts."""
        status, account, error = 502, StreamAccount(state.started), None
        try:
            span, headers = self._upstream_call_span(state, req)
            timeout_s = self.settings.upstream_timeout_s
            deadline = time.monotonic() + timeout_s  # the whole answer, headers and body
            try:
                resp = await state.upstream.pool.post(state.path, body, headers, timeout_s)
                try:
                    raw = await resp.read(deadline)
                finally:
                    if resp.complete:
                        resp.release()
                    else:
                        resp.close()  # cut short (the client left, a timeout): vLLM aborts the request
                upstream_status = resp.status
            except (ConnectionError, TimeoutError) as exc:
                status, reason, failure = _classify_failure(exc)
                error = str(failure.message)
                self._upstream_error(state, reason)
                _end_span(span, error)
                exchange.answer(status, failure.body())
                return
            except asyncio.CancelledError:
                _end_span(span, "client closed the connection")
                raise
            _end_span(span, None if upstream_status < 400 else f"upstream answered {upstream_status}")
            if upstream_status >= 400:
                status, error = upstream_status, f"upstream answered {upstream_status}"
                self._upstream_error(state, "http_4xx" if upstream_status < 500 else "http_5xx")
                exchange.answer(upstream_status, raw)
                return
            try:
                data = orjson.loads(raw)
                choices = data.get("choices") or []
                usage = data.get("usage") or {}
            except (orjson.JSONDecodeError, AttributeError):
                status, error = 502, "upstream answered with something that is not an OpenAI response"
                self._upstream_error(state, "bad_response")
                exchange.answer(502, errors.error_body(error, errors.UPSTREAM, "bad_response"))
                return
            account.on_usage(usage)
            if self.answers is not None and isinstance(rid := data.get("id"), str):
                state.response_id = rid
            account.finish_reasons = [c.get("finish_reason") for c in choices
                                      if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]
            if self.settings.capture_logprobs or req.client_wants_logprobs:
                account.add_logprobs(chunk_logprobs(choices, req.route))
                if not req.client_wants_logprobs:
                    strip_logprobs(choices)
                    raw = orjson.dumps(data)
            status = upstream_status
            if state.rename is not None:  # the served name → the public one, as bytes if vLLM's compact JSON
                if state.rename[0] in raw:
                    raw = raw.replace(*state.rename, 1)
                elif isinstance(data, dict) and "model" in data:
                    data["model"] = state.model
                    raw = orjson.dumps(data)
            if exchange.gone:  # left as the answer came: it never reached the client
                status, error = CLIENT_CLOSED, "client closed the connection"
            exchange.answer(status, raw, extra=_variant_header(state))
        except asyncio.CancelledError:
            status, error = CLIENT_CLOSED, "client closed the connection"
            raise
        finally:
            self._done(state, status, account, error)

    async def _stream(self, exchange: Exchange, state: RequestState, req: ParsedRequest, body: bytes) -> None:
        span, headers = self._upstream_call_span(state, req)
        idle_s = self.settings.upstream_stream_idle_timeout_s
        try:
            resp = await state.upstream.pool.post(state.path, body, headers, idle_s)
        except (ConnectionError, TimeoutError) as exc:
            status, reason, failure = _classify_failure(exc)
            self._upstream_error(state, reason)
            _end_span(span, failure.message)
            self._done(state, status, None, failure.message)
            exchange.answer(status, failure.body())
            return
        except asyncio.CancelledError:
            _end_span(span, "client closed the connection")
            self._done(state, CLIENT_CLOSED, None, "client closed the connection")
            raise
        if resp.status != 200:
            try:
                raw = await resp.read(time.monotonic() + idle_s)
            except (ConnectionError, TimeoutError):
                raw = errors.error_body("upstream failed while answering", errors.UPSTREAM, "bad_response")
            except asyncio.CancelledError:
                resp.close()
                _end_span(span, "client closed the connection")
                self._done(state, CLIENT_CLOSED, None, "client closed the connection")
                raise
            resp.release()
            error = f"upstream answered {resp.status}"
            self._upstream_error(state, "http_4xx" if resp.status < 500 else "http_5xx")
            _end_span(span, error)
            self._done(state, resp.status, None, error)
            exchange.answer(resp.status, raw)
            return
        relay = StreamRelay(self, state, req, resp, span, exchange)
        relay.start()
        try:
            await relay.finished
        except asyncio.CancelledError:
            relay.abort("the gateway stopped while relaying the stream")
            raise

    def _done(self, state: RequestState, status: int, account: StreamAccount | None, error: str | None) -> None:
        """A request that passed preprocessing ends: leave in-flight, give admission back
        its ticket with the tokens vLLM used, record it."""
        self._series(state.model, state.variant, state.path).in_flight.dec()
        if state.ticket is not None and self.admission is not None:
            self.admission.release(state.ticket, _tokens_to_charge(state, status, account))
        self._finish(state, status, account, error=error)

    # -- accounting --------------------------------------------------------------------

    def _upstream_error(self, state: RequestState, reason: str) -> None:
        self.metrics.upstream_errors.labels(state.model, state.variant, reason).inc()
        if reason == "connect":
            state.upstream.unreachable()

    def _series(self, model: str, variant: str, route: str) -> RouteSeries:
        series = self._route_series.get((model, variant, route))
        if series is None:
            series = self._route_series[(model, variant, route)] = RouteSeries(self.metrics, model, variant, route)
        return series

    def _finish(self, state: RequestState, status: int, account: StreamAccount | None, *, error: str | None) -> None:
        """Record the request once: metrics, feature record, span attributes and end."""
        e2e = time.perf_counter() - state.started
        variant, span = state.variant, state.span
        ex = exemplar(span)
        series = self._series(state.model, variant, state.path)
        requests, duration = series.answered(status_class(status))
        requests.inc()
        duration.observe(e2e, ex)
        ok = account is not None and status < 400
        if ok:
            ttft = account.ttft
            if ttft is not None:
                series.ttft.observe(ttft, ex)
                observe_many(series.itl, account.gaps)
            tpot = account.tpot()
            if tpot is not None:
                series.tpot.observe(tpot)
            if account.prompt_tokens is not None:
                series.prompt_tokens.observe(account.prompt_tokens)
            if account.completion_tokens is not None:
                series.completion_tokens.observe(account.completion_tokens)
        if account is not None and (ok or status == CLIENT_CLOSED):
            # what vLLM spent, as its own counters count it: the prompt once per choice, and
            # for an abandoned stream the tokens relayed before the client left
            if account.prompt_tokens is not None:
                series.input_tokens.inc(account.prompt_tokens * (state.req.n if state.req else 1))
            output = account.completion_tokens if account.completion_tokens is not None else (
                account.token_events if status == CLIENT_CLOSED else None)
            if output:
                series.output_tokens.inc(output)
        # forced requests are test traffic, not assignments: a record would count them in the
        # A/B arms (read per model and variant) and in drift's windows
        if self.features is not None and state.req is not None and not state.forced:
            self.features.submit(FeatureRecord(
                model=state.model, variant=variant, route=state.route, stream=state.req.stream,
                started_at=state.started_at, finished_at=state.started_at + e2e, status=status,
                prompt_tokens=account.prompt_tokens if account else None,
                completion_tokens=account.completion_tokens if account else None,
                ttft_s=account.ttft if account else None, tpot_s=account.tpot() if account else None, e2e_s=e2e,
                finish_reason=account.finish_reasons[0] if account and account.finish_reasons else None,
                mean_logprob=account.mean_logprob if account else None,
                experiment=state.experiment, unit=state.unit,
            ))
        if state.response_id is not None and status < 400 and self.answers is not None and not state.forced:
            self.answers.remember(state.response_id, state.model, variant, state.experiment)
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            if account is not None:
                span.set_attributes(_usage_attributes(account))
        _end_span(span, error if status >= 500 or status == CLIENT_CLOSED else None)


class StreamRelay:
    """Relays one upstream SSE stream to the client from the upstream connection's callbacks
    (a ``BodySink``): each chunk vLLM sends is accounted for and written to the client's
    transport in the same callback, with no task switch. Settles its accounting exactly once.

    A complete stream is settled before its last bytes go out, so a client that read [DONE]
    finds it counted. That waits for the callbacks already due in the loop's current turn: a
    gateway starved of CPU finds the end of the stream and the client's disconnect in the
    same poll, in either order, and the disconnect wins (a 499). A client that closes after
    reading [DONE] (the ``openai`` client does, before the response's last empty chunk) has
    its answer: that is a success.
    """

    def __init__(self, gateway: Gateway, state: RequestState, req: ParsedRequest, resp: UpstreamResponse,
                 upstream_span: trace.Span, exchange: Exchange) -> None:
        self.gateway, self.state, self.resp, self.upstream_span = gateway, state, resp, upstream_span
        self.exchange = exchange
        self.account = StreamAccount(state.started)
        capture = gateway.settings.capture_logprobs or req.client_wants_logprobs
        self.processor = EventProcessor(self.account, req.route, strip_usage=not req.client_wants_usage,
                                        read_logprobs=capture,
                                        strip_logprobs=capture and not req.client_wants_logprobs)
        self.splitter = SSESplitter()
        self.status, self.error, self.reason, self.code = 200, None, None, ""
        self.settled = False
        self.want_id = gateway.answers is not None
        self.as_is = not self.want_id and state.rename is None  # chunks may go out as they came
        self.first_seen = False
        self.idle_s = gateway.settings.upstream_stream_idle_timeout_s
        self.last = time.perf_counter()  # when the last chunk came (or the client caught up): the idle clock
        self.client_slow = False  # reading paused until the client's socket drains: not idle
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle = LazyTimer(self._idle_due)  # per chunk, only ``last`` moves
        self._idle.fire_by(time.monotonic() + self.idle_s)

    def start(self) -> None:
        headers = [b"%s: %s\r\n" % h for h in RELAY_HEADERS]
        self.exchange.start_stream(headers + _variant_header(self.state) if self.state.routed else headers)
        self.exchange.on_writable = self._writable
        self.resp.relay_to(self)
        if not self.settled:
            self.exchange.watch(self.client_left)

    # -- BodySink: called by the upstream connection --------------------------------------

    def on_data(self, chunk: bytes) -> None:
        if self.settled or self.account.done:
            return
        self.last = now = time.perf_counter()
        if self.as_is and not self.splitter.pending and self.processor.token_as_is(chunk, now):
            self.exchange.send(chunk)
            return
        events = self.splitter.feed(chunk)
        if not events:
            return
        account, state = self.account, self.state
        out = self.processor.process(events, now)
        if self.want_id and (found := _RESPONSE_ID.search(events[0])) is not None:
            state.response_id, self.want_id = found.group(1).decode(), False
            self.as_is = state.rename is None
        if state.rename is not None:
            out = out.replace(*state.rename)
        if not self.first_seen and account.first_token is not None:
            self.first_seen = True
            state.span.add_event("first_token")
        if account.upstream_error is not None:
            code = _error_event_code(account.upstream_error)
            if 400 <= code < 500:  # vLLM refused the request after accepting the stream: the client's error
                self.fail(code, "http_4xx", "upstream rejected the request in the stream")
            else:
                self.fail(502, "http_5xx", "upstream reported an error in the stream")
            self._end(out)
        elif account.done:
            asyncio.get_running_loop().call_soon(self._complete, out)
        elif out:
            self.exchange.send(out)

    def on_end(self) -> None:
        if not self.settled and not self.account.done:
            self.fail(502, "stream_interrupted", "upstream closed the stream before [DONE]")
            self._end(errors.stream_error_event(self.error or "stream failed", self.code))

    def on_error(self, error: ConnectionError) -> None:
        if not self.settled and not self.account.done:
            self.fail(502, "stream_interrupted", f"upstream connection lost mid-stream: {type(error).__name__}")
            self._end(errors.stream_error_event(self.error or "stream failed", self.code))

    def _complete(self, last: bytes) -> None:
        if self.settled:
            return
        if self.exchange.gone:
            self.client_left()
        else:
            self._end(last)

    # -- the client's side --------------------------------------------------------------

    def client_left(self) -> None:
        if not self.settled:
            self.fail(CLIENT_CLOSED, None, "client closed the connection")
            self._end(b"")

    def _writable(self, ok: bool) -> None:
        """The client reads slower than vLLM writes: stop reading from vLLM until it catches up."""
        self.client_slow = not ok
        if ok:
            self.last = time.perf_counter()
            self.resp.resume_reading()
        else:
            self.resp.pause_reading()

    def _idle_due(self) -> float | None:
        if self.settled:
            return None
        if self.client_slow:
            return time.monotonic() + self.idle_s
        remaining = self.last + self.idle_s - time.perf_counter()  # ``last`` is on the tokens' clock
        if remaining > SLACK_S:
            return time.monotonic() + remaining
        self.fail(504, "timeout", f"upstream sent nothing for {self.idle_s}s", code="upstream_timeout")
        self._end(errors.stream_error_event(self.error or "stream failed", self.code))
        return None

    def abort(self, error: str) -> None:
        if not self.settled:
            self.fail(502, None, error)
            self._end(errors.stream_error_event(error, "gateway_stopped"))

    # -- settling ---------------------------------------------------------------------

    def fail(self, status: int, reason: str | None, error: str, code: str | None = None) -> None:
        """``reason`` labels the upstream-errors metric; ``code`` is what the client's error event says."""
        self.status, self.reason, self.error, self.code = status, reason, error, code or reason or ""

    def _end(self, last: bytes) -> None:
        """Settle, then send the stream's last bytes (nothing to a client that left)."""
        self.settled = True
        self._idle.cancel()
        if self.account.done:
            self.resp.release()
        else:
            self.resp.close()  # drop the connection so vLLM aborts the request
        gw = self.gateway
        if self.reason is not None:
            gw._upstream_error(self.state, self.reason)  # noqa: SLF001
        _end_span(self.upstream_span, self.error)
        gw._done(self.state, self.status, self.account, self.error)  # noqa: SLF001
        self.exchange.end_stream(last)
        if not self.finished.done():
            self.finished.set_result(None)


def _with_public_models(raw: bytes, experiments: Experiments) -> bytes:
    """The upstream's model list plus each experiment's public name."""
    try:
        doc = orjson.loads(raw)
        data = doc["data"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return raw
    if not isinstance(data, list):
        return raw
    listed = {m.get("id") for m in data if isinstance(m, dict)}
    for model in experiments.splits:
        if model not in listed:
            info = experiments.catalog[model]
            data.append({"id": model, "object": "model", "owned_by": "inferwatch", "max_model_len": info.max_model_len})
    return orjson.dumps(doc)


def _request_attributes(req: ParsedRequest) -> dict:
    attrs = {
        "gen_ai.operation.name": OPERATION[req.route],
        "gen_ai.provider.name": "vllm",  # gen_ai.system before semantic conventions 1.37
        "gen_ai.request.model": req.model,
        "gen_ai.request.stream": req.stream,
    }
    if req.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = req.max_tokens
    for key in ("temperature", "top_p", "seed"):
        value = req.payload.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[f"gen_ai.request.{key}"] = value
    return attrs


def _usage_attributes(account: StreamAccount) -> dict:
    attrs: dict = {}
    if account.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = account.prompt_tokens
    if account.completion_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = account.completion_tokens
    if account.finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = account.finish_reasons
    if account.ttft is not None:
        attrs["gen_ai.server.time_to_first_token"] = account.ttft
    return attrs


def _end_span(span: trace.Span, error: str | None) -> None:
    if error is not None and span.is_recording():
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def _tokens_to_charge(state: RequestState, status: int, account: StreamAccount | None) -> int:
    """What a request is charged against tokens-per-minute: vLLM's usage when it reported
    it. A request the client abandoned has no usage (vLLM aborted it partway), so it is
    charged what it may have used: its prompt at about 4 bytes a token, and what it could
    generate, or for a stream what was relayed, so that leaving early is no way around the
    limit."""
    req = state.req
    n = req.n if req else 1
    if account is not None and account.prompt_tokens is not None:
        completion = account.completion_tokens if account.completion_tokens is not None else account.token_events
        return account.prompt_tokens * n + completion
    if status != CLIENT_CLOSED or req is None:
        return 0
    prompt = state.body_bytes // 4 * n
    if req.stream and account is not None:
        return prompt + account.token_events
    return prompt + (req.max_tokens or 0) * n


def _error_event_code(payload: bytes) -> int:
    """The HTTP-like code of a stream's error event (vLLM sends its 400s that way too); 500
    when it has none."""
    try:
        code = orjson.loads(payload).get("error", {}).get("code")
    except (orjson.JSONDecodeError, AttributeError):
        return 500
    return code if isinstance(code, int) and not isinstance(code, bool) else 500


def _classify_failure(exc: BaseException) -> tuple[int, str, GatewayError]:
    """Map an upstream failure before the response ended to (status, metric reason, error)."""
    if isinstance(exc, TimeoutError):
        return 504, "timeout", GatewayError(504, "upstream_timeout", "The model server did not answer in time.",
                                            error_type=errors.UPSTREAM)
    err = _upstream_unavailable_error(exc)
    return err.status, "connect", err


def _upstream_unavailable_error(exc: BaseException) -> GatewayError:
    return GatewayError(503, "upstream_unavailable",
                        f"The model server is not reachable ({type(exc).__name__}); retry later.",
                        error_type=errors.UPSTREAM)


def _upstream_unavailable(exc: BaseException) -> Response:
    err = _upstream_unavailable_error(exc)
    return Response(err.body(), err.status, media_type="application/json")


# What the routing layer answers itself, as OpenAI error objects (code, type, what to do).
_HTTP_ERRORS = {
    404: ("not_found", errors.NOT_FOUND, "The gateway serves POST /v1/chat/completions, POST /v1/completions and "
                                         "GET /v1/models."),
    405: ("method_not_allowed", errors.INVALID_REQUEST, "Use the method this path allows."),
}


async def _openai_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code, error_type, hint = _HTTP_ERRORS.get(exc.status_code, ("http_error", errors.INVALID_REQUEST, ""))
    request.app.state.gateway.metrics.rejected.labels(UNROUTED, code).inc()
    message = f"{request.method} {request.url.path[:200]}: {exc.detail}. {hint}".strip()
    return Response(errors.error_body(message, error_type, code), exc.status_code, media_type="application/json",
                    headers=exc.headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, read from the ASGI messages directly (one message, the common case,
    costs one await), within ``BODY_TIMEOUT_S``; a client gone before its body arrived is a
    499."""
    check_declared_length(request.headers.get("content-length"), limit)
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            return await _receive_body(request.receive, limit)
    except TimeoutError:
        raise GatewayError(408, "request_timeout",
                           f"The request body did not arrive within {BODY_TIMEOUT_S:g}s.") from None


async def _receive_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise GatewayError(CLIENT_CLOSED, "client_closed", "The client closed the connection before its body arrived.")
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if not chunks and not more:
            if len(chunk) > limit:
                raise GatewayError(413, "body_too_large", f"Request body exceeds the limit of {limit} bytes.")
            return chunk
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, "body_too_large", f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


def _variant_header(state: RequestState) -> list[bytes] | None:
    """On answers an experiment routed: which variant gave it."""
    return [b"%s: %s\r\n" % (VARIANT_HEADER, state.variant.encode())] if state.routed else None


async def _served_by_the_protocol(request: Request) -> Response:
    """The proxy routes are answered by ``serving.server.GatewayHttpProtocol`` before the ASGI
    app sees them; this answers only under a server started without it."""
    request.app.state.gateway.metrics.rejected.labels(request.url.path, "misconfigured_server").inc()
    return Response(errors.error_body("This server runs the gateway's app without its HTTP protocol: start it with "
                                      "`inferwatch gateway` (or uvicorn with serving.server.UVICORN_OPTIONS).",
                                      errors.UPSTREAM, "misconfigured_server"), 501, media_type="application/json")


def create_app(settings: GatewaySettings, registry: CollectorRegistry | None = None, *,
               feature_sink: FeatureSink | None = None, span_exporter: SpanExporter | None = None,
               feedback_sink: FeedbackSink | None = None) -> FastAPI:
    """Build the ASGI app; ``registry`` defaults to a fresh one (never the global)."""
    gateway = Gateway(settings, registry or CollectorRegistry(), feature_sink=feature_sink,
                      span_exporter=span_exporter, feedback_sink=feedback_sink)

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
    app.add_exception_handler(StarletteHTTPException, _openai_http_error)
    app.router.redirect_slashes = False  # a 307 with an empty body is no answer for an OpenAI client
    for path in ROUTE_PATHS.values():  # so that other methods get a 405
        app.router.add_route(path, _served_by_the_protocol, methods=["POST"])
    app.router.add_route("/v1/models", gateway.list_models, methods=["GET"])
    app.router.add_route("/v1/feedback", gateway.feedback, methods=["POST"])
    app.router.add_route("/admin/experiments", gateway.experiments_get, methods=["GET"])
    app.router.add_route("/admin/experiments/{model:path}/weights", gateway.weights_put, methods=["PUT"])
    app.router.add_route("/health", gateway.health, methods=["GET"])
    app.router.add_route("/ready", gateway.ready, methods=["GET"])
    app.router.add_route("/metrics", gateway.render_metrics, methods=["GET"])
    return app
