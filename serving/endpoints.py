"""The gateway's routes other than the proxy ones, served through its ASGI app: the model
list, feedback on answers, the experiments' admin endpoints, metrics and probes.

Errors are OpenAI error objects here too (``answers_errors``), counted in the
rejected-requests metric by route and code, like the proxy routes'.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.serving import errors
from inferwatch.serving.access import Access
from inferwatch.serving.body import AsgiBody, read_body
from inferwatch.serving.errors import GatewayError
from inferwatch.serving.exposition import render
from inferwatch.serving.feedback import AnswerMemory, RatingSink, parse_rating, unknown_answer
from inferwatch.serving.metrics import UNROUTED, GatewayMetrics
from inferwatch.serving.proxy import upstream_unavailable
from inferwatch.serving.routing import Experiments
from inferwatch.serving.shared_state import SharedStateUnavailable
from inferwatch.serving.shared_weights import ExperimentConflict
from inferwatch.serving.split import ExperimentError
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.worker_metrics import WorkerView

log = logging.getLogger(__name__)

Endpoint = Callable[["Endpoints", Request], Awaitable[Response]]  # a method, before it is bound


def _error_response(exc: GatewayError) -> Response:
    return Response(exc.body(), exc.status, headers=exc.headers, media_type="application/json")


def answers_errors(counted: str | None = None) -> Callable[[Endpoint], Endpoint]:
    """An endpoint's ``GatewayError`` becomes its OpenAI error answer; with ``counted``, the
    rejected-requests metric counts it under that route."""
    def wrap(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def answering(self: Endpoints, request: Request) -> Response:
            try:
                return await endpoint(self, request)
            except GatewayError as exc:
                if counted is not None:
                    self.metrics.rejected.labels(counted, exc.code).inc()
                return _error_response(exc)
        return answering
    return wrap


async def _request_body(request: Request, limit: int) -> bytes:
    return await read_body(AsgiBody(request.receive), request.headers.get("content-length"), limit)


class Endpoints:
    def __init__(self, registry: CollectorRegistry, metrics: GatewayMetrics, max_body_bytes: int, upstream: Upstream,
                 experiments: Experiments | None, access: Access, answers: AnswerMemory | None,
                 feedback_sink: RatingSink | None) -> None:
        self.registry, self.metrics, self.max_body_bytes = registry, metrics, max_body_bytes
        self.upstream, self.experiments, self.access = upstream, experiments, access
        self.answers, self.feedback_sink = answers, feedback_sink
        self.workers: WorkerView | None = None  # with --workers: the pod's view, every worker's series

    @answers_errors()
    async def list_models(self, request: Request) -> Response:
        self.access.authorize(request.headers)
        try:
            async with self.upstream.get(self.upstream.any_replica(), "/v1/models", self.upstream.timeout()) as resp:
                raw = await resp.read()
                if self.experiments is not None and resp.status == 200:
                    raw = self.experiments.with_public_models(raw)
                return Response(raw, resp.status, media_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error_response(upstream_unavailable(exc))

    @answers_errors(counted="/v1/feedback")
    async def feedback(self, request: Request) -> Response:
        """POST /v1/feedback: a rating of an answer, forwarded to the drift service with the
        variant that gave the answer. Each answer can be rated once."""
        self.access.authorize(request.headers)
        if self.answers is None:
            raise GatewayError(404, "feedback_disabled", "Feedback is off: this gateway runs with "
                               "INFERWATCH_GATEWAY_FEEDBACK_MEMORY=0.", error_type=errors.NOT_FOUND)
        rating = parse_rating(await _request_body(request, self.max_body_bytes))
        try:
            answer = await self.answers.lookup(rating.response_id)
        except SharedStateUnavailable:
            raise GatewayError(503, "shared_state_unavailable", f"No answer with id '{rating.response_id[:80]}' "
                               "went through this gateway replica, and the replicas' shared state (Redis) does not "
                               "answer to say whether another one gave it; retry later.",
                               error_type=errors.UPSTREAM) from None
        if answer is None:
            raise unknown_answer(rating.response_id, self.answers)
        if self.feedback_sink is None:
            raise GatewayError(503, "feedback_unavailable", "Feedback has nowhere to go: set "
                               "INFERWATCH_GATEWAY_DRIFT_URL.", error_type=errors.UPSTREAM)
        try:
            first = await self.answers.claim(rating.response_id, answer)
        except SharedStateUnavailable:
            raise GatewayError(503, "shared_state_unavailable", f"The answer '{rating.response_id[:80]}' was given "
                               "by another gateway replica, and the replicas' shared state (Redis) does not answer to "
                               "say whether it was rated already; retry later.", error_type=errors.UPSTREAM) from None
        if not first:
            raise GatewayError(409, "already_rated", f"The answer '{rating.response_id[:80]}' has been rated "
                               "already; each answer counts once.", param="response_id")
        a = answer.assignment
        record = {"model": answer.model, "variant": answer.variant, "experiment": a.experiment if a else None,
                  "epoch": a.epoch if a else None, "unit": a.unit if a else None, "score": rating.score,
                  "at": time.time(), "response_id": rating.response_id}
        try:
            rated_before = await self.feedback_sink.send([record])
        except BaseException as exc:  # the drift service's failure (or a cancel): the client may retry
            await asyncio.shield(self.answers.unclaim(rating.response_id, answer))
            if not isinstance(exc, Exception):
                raise
            self.metrics.feedback.labels(answer.model, answer.variant, "undelivered").inc()
            log.warning("feedback for %s not delivered: %s", answer.variant, exc)
            raise GatewayError(503, "feedback_unavailable", "The drift service did not take the rating; "
                               "retry later.", error_type=errors.UPSTREAM) from None
        if rated_before:  # the gateways' memory of it was lost (Redis restarted empty): the drift service kept it
            raise GatewayError(409, "already_rated", f"The answer '{rating.response_id[:80]}' has been rated "
                               "already; each answer counts once.", param="response_id")
        self.metrics.feedback.labels(answer.model, answer.variant,
                                     "positive" if rating.score >= 0.5 else "negative").inc()
        return JSONResponse({"response_id": rating.response_id, "model": answer.model, "variant": answer.variant,
                             "experiment": a.experiment if a else None, "score": rating.score})

    @answers_errors()
    async def experiments_get(self, request: Request) -> Response:
        """GET /admin/experiments: every experiment with its current weights."""
        self.access.authorize_admin(request.headers)
        return JSONResponse(self.experiments.describe() if self.experiments else {"experiments": []})

    @answers_errors()
    async def weights_put(self, request: Request) -> Response:
        """PUT /admin/experiments/{model}/weights with ``{"weights": {variant: weight}}``."""
        model = request.path_params["model"]
        self.access.authorize_admin(request.headers)
        experiments = self.experiments
        if experiments is None or model not in experiments.splits:
            raise GatewayError(404, "experiment_not_found", f"No experiment for model '{model[:200]}'; "
                               f"experiments: {', '.join(experiments.splits) if experiments else 'none'}.",
                               param="model", error_type=errors.NOT_FOUND)
        try:
            doc = orjson.loads(await _request_body(request, self.max_body_bytes))
        except orjson.JSONDecodeError as exc:
            raise GatewayError(400, "invalid_json", f"Request body is not valid JSON: {exc}.") from None
        if not isinstance(doc, dict) or set(doc) != {"weights"}:
            raise GatewayError(400, "invalid_weights", 'Request body must be {"weights": {"<variant>": <0..1>, '
                               '...}}.', param="weights")
        try:
            new = await experiments.set_weights(model, doc["weights"])
        except ExperimentError as exc:
            raise GatewayError(400, "invalid_weights", str(exc), param=exc.field) from None
        except OSError as exc:
            raise GatewayError(500, "not_persisted", f"The weights could not be saved ({exc}); nothing changed.",
                               error_type=errors.UPSTREAM) from None
        except ExperimentConflict as exc:
            raise GatewayError(409, "experiment_conflict", str(exc), param="model") from None
        except SharedStateUnavailable as exc:
            raise GatewayError(503, "shared_state_unavailable", f"The replicas' shared weights could not be changed "
                               f"({exc}); nothing changed on any replica. Retry when Redis answers "
                               "(inferwatch_gateway_shared_state_up).", error_type=errors.UPSTREAM) from None
        return JSONResponse(new.describe())

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
        if self.workers is not None:
            body, content_type = await self.workers.scrape(accept)
        else:
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

    async def served_by_the_protocol(self, request: Request) -> Response:
        """The proxy routes are answered by ``serving.server.GatewayHttpProtocol`` before the
        ASGI app sees them; this answers only under a server started without it."""
        self.metrics.rejected.labels(request.url.path, "misconfigured_server").inc()
        return Response(errors.error_body("This server runs the gateway's app without its HTTP protocol: start it "
                                          "with `inferwatch gateway` (or uvicorn with "
                                          "inferwatch.serving.server.uvicorn_options).",
                                          errors.UPSTREAM, "misconfigured_server"), 501, media_type="application/json")

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """What the routing layer answers itself (404, 405), as OpenAI error objects."""
        assert isinstance(exc, StarletteHTTPException)
        code, error_type, hint = _HTTP_ERRORS.get(exc.status_code, ("http_error", errors.INVALID_REQUEST, ""))
        self.metrics.rejected.labels(UNROUTED, code).inc()
        message = f"{request.method} {request.url.path[:200]}: {exc.detail}. {hint}".strip()
        return Response(errors.error_body(message, error_type, code), exc.status_code, media_type="application/json",
                        headers=exc.headers)


_HTTP_ERRORS = {
    404: ("not_found", errors.NOT_FOUND, "The gateway serves POST /v1/chat/completions, POST /v1/completions and "
                                         "GET /v1/models."),
    405: ("method_not_allowed", errors.INVALID_REQUEST, "Use the method this path allows."),
}
