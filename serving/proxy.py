"""The proxy routes' request path: from a request's head to the last byte of its answer.

Per request: check access and read the body, validate and route it (the server span's
``preprocessed`` event), call vLLM with the trace context injected (``{operation} {model}``
client span, which vLLM's ``llm_request`` span joins and which lasts until the answer is
relayed), then hand the answer over whole, or relay it as a stream (serving/relay.py). The
request is recorded once, when it ends (serving/recording.py).

Two spans, not one per phase: a sampled request's spans cost ~90 µs each in OpenTelemetry's
Python SDK and OTLP encoder (bench/gateway_overhead.py), more than the rest of the request.

A client that leaves cancels the request's task (``Exchange.watch``): whatever waits on vLLM
then closes its connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from inferwatch.serving import errors
from inferwatch.serving.access import Access
from inferwatch.serving.errors import CLIENT_CLOSED, GatewayError
from inferwatch.serving.exchange import Exchange
from inferwatch.serving.metrics import UNKNOWN_MODEL, UNROUTED
from inferwatch.serving.output_quality import is_blank, words
from inferwatch.serving.recording import Recorder
from inferwatch.serving.relay import StreamRelay
from inferwatch.serving.relay_client import UpstreamResponse
from inferwatch.serving.request import RequestState
from inferwatch.serving.routing import Experiments
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.sse import StreamAccount, chunk_logprobs, finish_reason_of, strip_logprobs
from inferwatch.serving.tracing import (
    OPERATION,
    PROPAGATOR,
    ServerSpans,
    end_response_span,
    end_span,
    inject_context,
    request_attributes,
)
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.validation import ROUTE_PATHS, ParsedRequest, parse_request, upstream_payload

LEFT = "client closed the connection"


class Proxy:
    def __init__(self, settings: GatewaySettings, upstream: Upstream, experiments: Experiments | None,
                 access: Access, recorder: Recorder, tracer: trace.Tracer, server_spans: ServerSpans) -> None:
        self.settings, self.upstream, self.experiments = settings, upstream, experiments
        self.access, self.recorder, self.tracer, self.server_spans = access, recorder, tracer, server_spans

    def refused(self, code: str) -> None:
        """A request the HTTP protocol refused before any route (serving/server.py)."""
        self.recorder.rejected(UNROUTED, code)

    async def over_limit(self, exchange: Exchange) -> None:
        """A request past the server's ``limit_concurrency``: a 503 that counts against
        availability like any other failed request, not only as a refusal."""
        self._refuse(exchange, self._begin(exchange), GatewayError(
            503, "concurrency_limit", "The gateway is at its concurrency limit; retry later.",
            error_type=errors.SERVER, headers={"retry-after": "1"}))

    def _begin(self, exchange: Exchange) -> RequestState:
        path = ROUTE_PATHS[exchange.route]
        parent = PROPAGATOR.extract(exchange.headers)
        span = self.server_spans.start(f"POST {path}", parent,
                                       {"http.request.method": "POST", "http.route": path, "url.path": path})
        return RequestState(exchange.route, path, time.perf_counter(), time.time(), span,
                            trace.set_span_in_context(span, parent) if span.is_recording() else parent,
                            self.settings.variant, self.upstream)

    def _refuse(self, exchange: Exchange, state: RequestState, exc: GatewayError) -> None:
        self.recorder.rejected(state.path, exc.code)
        self.recorder.finish(state, exc.status, None, error=exc.message)
        exchange.answer(exc.status, exc.body(), exc.headers)

    async def serve(self, exchange: Exchange) -> None:
        """A request on a proxy route, from its head to the last byte of its answer."""
        state = self._begin(exchange)
        try:
            req, body = await self.preprocess(exchange, state)
        except GatewayError as exc:
            self._refuse(exchange, state, exc)
            return
        self.recorder.started(state)
        if exchange.gone:  # left with its body sent: vLLM never sees the request
            self.settle(state, CLIENT_CLOSED, None, LEFT)
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

    def settle(self, state: RequestState, status: int, account: StreamAccount | None, error: str | None,
               reason: str | None = None, cause: BaseException | None = None) -> None:
        """A request that passed preprocessing ends: count an upstream failure (``reason``,
        from ``cause``), give admission back its ticket with the tokens vLLM used, record it."""
        if reason is not None:
            self.recorder.upstream_error(state, reason, cause)
        if state.endpoint is not None:
            state.upstream.balancer.finish(state.endpoint, reason, status)
            state.endpoint = None
        self.access.release(state, status, account)
        self.recorder.ended(state, status, account, error)

    async def preprocess(self, exchange: Exchange, state: RequestState) -> tuple[ParsedRequest, bytes]:
        state.key = self.access.authorize(exchange.headers)
        state.tenant = self.access.tenant_of(state.key)
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
                    self.recorder.metrics.upstream_errors.labels(UNKNOWN_MODEL, self.settings.variant, "connect").inc()
                    raise GatewayError(503, "upstream_unavailable",
                                       f"The model server at {self.upstream.base_url} is not reachable; "
                                       "retry later.", error_type=errors.UPSTREAM) from None
                raise
            req = parse_request(state.route, body, models, self.settings.max_tokens_limit)
        state.model, state.base_model, state.req = req.model, req.base_model, req
        variant = None
        if self.experiments is not None:
            variant = self.experiments.route(exchange.headers, state, req, self.access.may_force)
        pending = self.access.admit(state)
        if pending is not None:
            await pending
        payload, changed = upstream_payload(req, self.settings.capture_logprobs)
        if variant is not None and (variant.rename is not None or variant.params):
            payload, changed = {**payload, **variant.params, "model": variant.served_model}, True
        state.response_model = payload.get("model", req.model)  # a stream's (vLLM answers under the name it is asked)
        span = state.span
        if span.is_recording():
            # the request's parameters are the client span's (GenAI conventions); the model is
            # here too, to find a request's trace by model
            span.set_attributes({"gen_ai.request.model": req.model, "inferwatch.variant": state.variant})
            if state.assignment is not None:
                a = state.assignment
                span.set_attributes({"inferwatch.experiment": a.experiment, "inferwatch.epoch": a.epoch,
                                     "inferwatch.unit": a.unit or ""})
            span.add_event("preprocessed")
        return req, orjson.dumps(payload) if changed else body

    def _upstream_call_span(self, state: RequestState, req: ParsedRequest) -> tuple[trace.Span, dict[str, str]]:
        """The GenAI client span of the call to vLLM, with the request's parameters, and the
        headers that carry its context (vLLM joins a trace sampled out too, as sampled out)."""
        headers = dict(state.upstream.headers)
        if not state.span.is_recording():
            inject_context(headers, state.span)
            return trace.INVALID_SPAN, headers
        span = self.tracer.start_span(f"{OPERATION[req.route]} {req.model}", context=state.ctx, kind=SpanKind.CLIENT,
                                      attributes=request_attributes(req))
        inject_context(headers, span)
        return span, headers

    @staticmethod
    async def _send(state: RequestState, span: trace.Span, body: bytes, headers: dict[str, str],
                    timeout_s: float) -> UpstreamResponse:
        """The request to one of the variant's replicas; ``settle`` tells the balancer how it ended."""
        sent = time.perf_counter()
        resp, state.endpoint = await state.upstream.balancer.post(state.path, body, headers, timeout_s)
        address = state.endpoint.address
        state.sent = (address.ip, address.target.port, sent)
        if span.is_recording():
            span.set_attributes({"server.address": address.ip, "server.port": address.target.port})
        return resp

    async def _unary(self, exchange: Exchange, state: RequestState, req: ParsedRequest, body: bytes) -> None:
        """The whole answer, read from vLLM and handed over. A client that leaves meanwhile
        cancels this (``serve``), which closes the upstream connection: vLLM aborts."""
        status, account, error, reason, cause = 502, StreamAccount(state.started), None, None, None
        try:
            span, headers = self._upstream_call_span(state, req)
            timeout_s = self.settings.upstream_timeout_s
            deadline = time.monotonic() + timeout_s  # the whole answer, headers and body
            try:
                resp = await self._send(state, span, body, headers, timeout_s)
                try:
                    raw = await resp.read(deadline)
                finally:
                    if resp.complete:
                        resp.release()
                    else:
                        resp.close()  # cut short (the client left, a timeout): vLLM aborts the request
                upstream_status = resp.status
            except (ConnectionError, TimeoutError) as exc:
                status, reason, failure = classify_failure(exc)
                error, cause = str(failure.message), exc
                end_span(span, error)
                exchange.answer(status, failure.body())
                return
            except asyncio.CancelledError:
                end_span(span, LEFT)
                raise
            if upstream_status >= 400:
                end_span(span, f"upstream answered {upstream_status}")
                status, error = upstream_status, f"upstream answered {upstream_status}"
                reason = "http_4xx" if upstream_status < 500 else "http_5xx"
                exchange.answer(upstream_status, raw)
                return
            try:
                data = orjson.loads(raw)
                choices = data.get("choices") or []
                usage = data.get("usage") or {}
            except (orjson.JSONDecodeError, AttributeError):
                status, error, reason = 502, "upstream answered with something that is not an OpenAI response", \
                    "bad_response"
                end_span(span, error)
                exchange.answer(502, errors.error_body(error, errors.UPSTREAM, "bad_response"))
                return
            account.on_usage(usage)
            if isinstance(rid := data.get("id"), str):
                state.response_id = rid
            if isinstance(answered_as := data.get("model"), str):
                state.response_model = answered_as
            account.finish_reasons = [kept for c in choices
                                      if isinstance(c, dict) and (kept := finish_reason_of(c.get("finish_reason")))]
            end_response_span(span, account, state.response_id, state.response_model)
            if req.n == 1 and choices:
                read_answer(account, choices[0], req.route)
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
                status, error = CLIENT_CLOSED, LEFT
            exchange.answer(status, raw, extra=state.variant_header())
        except asyncio.CancelledError:
            status, error = CLIENT_CLOSED, LEFT
            raise
        finally:
            self.settle(state, status, account, error, reason, cause)

    async def _stream(self, exchange: Exchange, state: RequestState, req: ParsedRequest, body: bytes) -> None:
        span, headers = self._upstream_call_span(state, req)
        idle_s = self.settings.upstream_stream_idle_timeout_s
        try:
            resp = await self._send(state, span, body, headers, idle_s)
        except (ConnectionError, TimeoutError) as exc:
            status, reason, failure = classify_failure(exc)
            end_span(span, failure.message)
            self.settle(state, status, None, failure.message, reason, exc)
            exchange.answer(status, failure.body())
            return
        except asyncio.CancelledError:
            end_span(span, LEFT)
            self.settle(state, CLIENT_CLOSED, None, LEFT)
            raise
        if resp.status != 200:
            try:
                raw = await resp.read(time.monotonic() + idle_s)
            except (ConnectionError, TimeoutError):
                raw = errors.error_body("upstream failed while answering", errors.UPSTREAM, "bad_response")
            except asyncio.CancelledError:
                resp.close()
                end_span(span, LEFT)
                self.settle(state, CLIENT_CLOSED, None, LEFT)
                raise
            resp.release()
            error = f"upstream answered {resp.status}"
            end_span(span, error)
            self.settle(state, resp.status, None, error, "http_4xx" if resp.status < 500 else "http_5xx")
            exchange.answer(resp.status, raw)
            return
        relay = StreamRelay(state, req, resp, span, exchange, self.settle,
                            capture_logprobs=self.settings.capture_logprobs,
                            want_id=self.recorder.answers is not None or span.is_recording(), idle_s=idle_s)
        relay.start()
        try:
            await relay.finished
        except asyncio.CancelledError:
            relay.abort("the gateway stopped while relaying the stream")
            raise


def read_answer(account: StreamAccount, choice: object, route: str) -> None:
    """A whole answer's text as units for the quality signals (serving/output_quality.py);
    the text itself goes no further."""
    if not isinstance(choice, dict):
        return
    message = choice.get("message") if route == "chat" else choice
    text = message.get("content") if route == "chat" and isinstance(message, dict) else choice.get("text")
    if isinstance(text, str):
        account.units = words(text)
        account.text_seen = not is_blank(text)
    if route == "chat" and isinstance(message, dict) and message.get("tool_calls"):
        account.tool_called = True


def classify_failure(exc: BaseException) -> tuple[int, str, GatewayError]:
    """Map an upstream failure before the response ended to (status, metric reason, error)."""
    if isinstance(exc, TimeoutError):
        return 504, "timeout", GatewayError(504, "upstream_timeout", "The model server did not answer in time.",
                                            error_type=errors.UPSTREAM)
    err = upstream_unavailable(exc)
    return err.status, "connect", err


def upstream_unavailable(exc: BaseException) -> GatewayError:
    return GatewayError(503, "upstream_unavailable",
                        f"The model server is not reachable ({type(exc).__name__}); retry later.",
                        error_type=errors.UPSTREAM)
