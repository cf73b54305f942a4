"""Reading a request body, the same way on both of the gateway's request paths.

The proxy routes get their body from the HTTP protocol's callbacks (serving/exchange.py),
every other route from ASGI messages (serving/endpoints.py). Both wait at most
``BODY_TIMEOUT_S`` for it (a client that sends its headers and then trickles its body
must not hold a slot forever), refuse it past the limit, and call a client that left
before its body arrived a 499.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from starlette.types import Receive

from inferwatch.serving.errors import CLIENT_CLOSED, GatewayError

BODY_TIMEOUT_S = 30.0  # for a request body to arrive once its headers have (slowloris)


class BodyBuffer(Protocol):
    """A body as it arrives: what came so far, whether more is to come, whether the client left."""

    body: bytes
    more_body: bool

    @property
    def disconnected(self) -> bool: ...

    async def arrival(self, limit: int) -> None:
        """Return once more of the body came, it ended, it passed ``limit``, or the client left."""


def check_declared_length(declared: str | None, limit: int) -> None:
    """Refuse a Content-Length that is not a number or is over ``limit``, before the body is read."""
    if declared is None:
        return
    if not declared.isdigit():
        raise GatewayError(400, "invalid_content_length", "Content-Length must be a whole number.")
    if int(declared) > limit:
        raise GatewayError(413, "body_too_large", f"Request body is {declared} bytes; the limit is {limit}.")


async def read_body(buffer: BodyBuffer, declared: str | None, limit: int) -> bytes:
    """The whole body, up to ``limit`` bytes, within ``BODY_TIMEOUT_S``. On the proxy routes
    it has usually arrived with the headers: then this returns without waiting."""
    check_declared_length(declared, limit)
    if buffer.more_body and not buffer.disconnected and len(buffer.body) <= limit:
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                while buffer.more_body and not buffer.disconnected and len(buffer.body) <= limit:
                    await buffer.arrival(limit)
        except TimeoutError:
            raise GatewayError(408, "request_timeout",
                               f"The request body did not arrive within {BODY_TIMEOUT_S:g}s.") from None
    if len(buffer.body) > limit:
        raise GatewayError(413, "body_too_large", f"Request body exceeds the limit of {limit} bytes.")
    if buffer.more_body:
        raise GatewayError(CLIENT_CLOSED, "client_closed", "The client closed the connection before its body arrived.")
    return buffer.body


class AsgiBody:
    """A ``BodyBuffer`` over an ASGI ``receive``."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.body = b""
        self.more_body = True
        self.disconnected = False

    async def arrival(self, limit: int) -> None:
        message = await self._receive()
        if message["type"] != "http.request":
            self.disconnected = True
            return
        self.body += message.get("body", b"")
        self.more_body = message.get("more_body", False)
