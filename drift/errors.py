"""The drift service's error answers: one JSON shape for every 4xx and 5xx, including
routing's 404/405 and exceptions nobody expected.

An unexpected exception used to reach the server's own last-resort handler, which answered
a plain-text 500 and then re-raised, so uvicorn closed the keep-alive connection and the
client's next request on it was reset. ``CatchAll`` answers it instead (logged with the
traceback, counted by route) and returns normally, so the connection stays usable.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None,
                   error_type: str = "invalid_request_error", **extra: object) -> Response:
    return JSONResponse({"error": {"message": message, "type": error_type, "code": code, **extra}},
                        status_code=status, headers=headers)


_ROUTING = {404: ("not_found", "see /openapi.json for the paths this service serves"),
            405: ("method_not_allowed", "the Allow header lists the methods this path takes")}


async def http_error(request: Request, exc: Exception) -> Response:
    """Routing's own 404/405 (and any HTTPException) in the service's error shape."""
    assert isinstance(exc, HTTPException)
    code, hint = _ROUTING.get(exc.status_code, ("http_error", ""))
    message = f"{request.method} {request.url.path[:200]}: {exc.detail}" + (f"; {hint}" if hint else "")
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    return error_response(exc.status_code, message, code, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this path takes. A path with a GET and a POST handler is two
    routes, and Starlette's 405 names only the first one's methods (OPTIONS /v1/baselines
    said ``allow: POST`` although GET exists)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "\0"})  # a method no route takes: PARTIAL on a path match
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


class CatchAll:
    """Outermost layer: an exception that escapes a handler becomes a JSON 500."""

    def __init__(self, app: ASGIApp, errors: Counter) -> None:
        self.app = app
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            route = getattr(scope.get("route"), "path", "unmatched")  # the template: bounded labels
            self.errors.labels(route).inc()
            log.exception("unexpected error answering %s %s", scope["method"], route)
            if started:  # part of the answer is out: only a closed connection tells the client it is cut short
                raise
            message = (f"{scope['method']} {route} failed unexpectedly ({type(exc).__name__}); the drift service "
                       "logged it with a traceback. Retry, and report it if it persists.")
            await error_response(500, message, "internal_error", error_type="server_error")(scope, receive, send)
