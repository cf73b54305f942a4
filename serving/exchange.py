"""One request on a proxy route, served from the connection's protocol callbacks.

The proxy routes are the gateway's hot path: every streamed token passes through them. An
ASGI stack puts a task switch, a generator step and a message dict between each chunk vLLM
sends and the client's socket, and two tasks (the app and a disconnect watcher) around each
request; the bench measured that as most of the gateway's cost over nginx. So
``serving.server.GatewayHttpProtocol`` hands these routes an ``Exchange`` instead of
uvicorn's request cycle: the body arrives through it, the answer is written straight to the
client's transport, and a disconnect is a callback at the moment the connection drops.

The protocol drives an ``Exchange`` through the attributes it drives uvicorn's
``RequestResponseCycle`` with (``body``, ``more_body``, ``message_event.set()``,
``disconnected``, ``response_complete``, ``keep_alive``, ``run_asgi``), so keep-alive,
pipelining and graceful shutdown stay uvicorn's. What the exchange needs of the protocol in
turn is the ``Connection`` below; what it runs is the handler the protocol gives it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Protocol

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.server import ServerState

from inferwatch.serving import body, errors
from inferwatch.serving.errors import GatewayError
from inferwatch.serving.validation import Route

log = logging.getLogger(__name__)

_JSON = b"content-type: application/json\r\n"
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


class Connection(Protocol):
    """What an exchange uses of the HTTP protocol that owns its connection."""

    transport: asyncio.Transport
    flow: FlowControl
    server_state: ServerState
    expect_100_continue: bool

    def on_response_complete(self) -> None:
        """The answer is out: arm keep-alive, or start the next pipelined request."""

    def linger(self) -> None:
        """Close after an answer given before the request's body was read, without a reset."""


class _HeadCache:
    """uvicorn's default headers (``date``, ``server``) as bytes, joined once per list: the
    server swaps in a new list when the date changes, once a second."""

    __slots__ = ("joined", "source")

    def __init__(self) -> None:
        self.source: list | None = None
        self.joined = b""

    def get(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self.source:
            self.source, self.joined = headers, b"".join(b"%s: %s\r\n" % h for h in headers)
        return self.joined


_DEFAULT_HEAD = _HeadCache()


class Exchange:
    """The request's head and body as they arrive, and its answer, whole or streamed."""

    __slots__ = (
        "_body_limit",
        "_body_waiter",
        "_continued",
        "_headers",
        "_on_gone",
        "body",
        "chunked",
        "disconnected",
        "handler",
        "keep_alive",
        "more_body",
        "on_writable",
        "protocol",
        "raw_headers",
        "raw_length",
        "response_complete",
        "response_started",
        "route",
        "transport",
    )

    def __init__(self, protocol: Connection, handler: Callable[[Exchange], Awaitable[None]], route: Route,
                 raw_headers: list[tuple[bytes, bytes]], *, keep_alive: bool, chunked: bool) -> None:
        self.protocol, self.handler, self.transport = protocol, handler, protocol.transport
        self.route, self.raw_headers = route, raw_headers
        self._headers: dict[str, str] | None = None
        self.body = b""
        self.more_body = True
        self.disconnected = False  # set by the protocol when the connection drops
        self.response_complete = False
        self.response_started = False
        self.keep_alive = keep_alive  # the protocol clears it on graceful shutdown
        self.chunked = chunked  # HTTP/1.1: a stream is sent in chunks; HTTP/1.0: until the connection closes
        self._body_limit = 0
        self._body_waiter: asyncio.Future[None] | None = None
        self._continued = False  # "100 Continue" sent
        self._on_gone: Callable[[], object] | None = None
        self.on_writable: Callable[[bool], None] | None = None  # the client's socket filled up (False) or drained
        self.raw_length: int | None = None  # set when the parser stopped at an Upgrade: the body comes raw

    # -- driven by the protocol --------------------------------------------------------

    @property
    def message_event(self) -> Exchange:
        """What the protocol signals body bytes, end of body and disconnect with (``.set()``).
        A property, not an attribute holding ``self``: that would make every exchange a
        reference cycle, garbage only the collector frees, and the collector's pauses were
        the gateway's p99 (bench/gateway_overhead.py)."""
        return self

    def run_asgi(self, app: object) -> Coroutine[None, None, None]:
        """What uvicorn starts as the request's task (now, or when a pipelined request's turn comes)."""
        return self._run()

    async def _run(self) -> None:
        try:
            await self.handler(self)
        except Exception:
            log.exception("the gateway failed on %s", self.route)
            if not self.response_started:
                self.answer(500, errors.error_body("The gateway failed on this request; see its log.",
                                                   errors.UPSTREAM, "internal_error"), close=True)
            else:
                self.transport.close()

    def set(self) -> None:
        """The protocol's signal: body bytes came, the body ended, or the connection dropped."""
        if self.disconnected:
            self._wake_body()
            on_gone, self._on_gone = self._on_gone, None
            if on_gone is not None:
                on_gone()
            return
        if self._body_waiter is None:
            return  # not asked for yet: past 64 KiB the protocol pauses reading until it is
        if self.more_body and len(self.body) <= self._body_limit:
            self.protocol.flow.resume_reading()
            return
        self._wake_body()

    def take_raw_body(self, data: bytes) -> None:
        """Body bytes the HTTP parser did not read (it stops at an Upgrade header, where the
        new protocol would begin): up to the Content-Length, which such a request must have."""
        assert self.raw_length is not None
        self.body += data[:self.raw_length - len(self.body)]
        if len(self.body) >= self.raw_length:
            self.more_body = False
        self.set()

    def writable(self, ok: bool) -> None:
        if self.on_writable is not None:
            self.on_writable(ok)

    # -- read by the gateway ---------------------------------------------------------

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names (lower case) to values; a repeated header keeps its last value."""
        if self._headers is None:
            self._headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in self.raw_headers}
        return self._headers

    @property
    def gone(self) -> bool:
        """The client has left (its connection dropped or is closing), asked before answering."""
        return self.disconnected or self.transport.is_closing()

    def watch(self, on_gone: Callable[[], object] | None) -> None:
        """Call ``on_gone`` once if the client leaves before the answer is complete (at once,
        if it has left already); ``None`` stops watching."""
        self._on_gone = on_gone
        if on_gone is not None and self.gone:
            self._on_gone = None
            on_gone()

    async def read_body(self, limit: int) -> bytes:
        """The request body (serving/body.py); a refused body is not read on: the connection
        closes after the answer."""
        if self.raw_length is not None and "transfer-encoding" in self.headers:
            raise GatewayError(400, "upgrade_with_chunked_body", "A request with an Upgrade header needs a "
                               "Content-Length body here: the gateway answers it over HTTP/1.1.")
        try:
            data = await body.read_body(self, self.headers.get("content-length"), limit)
        except GatewayError as exc:
            if exc.status in (408, 413):
                self.keep_alive = False
            raise
        # past 64 KiB of body the protocol stops reading until the body is asked for; one that
        # came whole before that would leave it stopped, and a client that leaves unseen while
        # vLLM works (its FIN or reset is read only when reading goes on)
        self.protocol.flow.resume_reading()
        return data

    async def arrival(self, limit: int) -> None:
        """``BodyBuffer``: wait for the protocol's signal (``set``) that the body ended, passed
        ``limit``, or the client left."""
        if not self._continued and self.protocol.expect_100_continue and not self.transport.is_closing():
            self._continued = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._body_limit = limit
        self._body_waiter = asyncio.get_running_loop().create_future()
        self.protocol.flow.resume_reading()
        try:
            await self._body_waiter
        finally:
            self._body_waiter = None

    def _wake_body(self) -> None:
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the answer --------------------------------------------------------------------

    def _head(self, status: int, headers: list[bytes]) -> list[bytes]:
        self.response_started = True
        head = [STATUS_LINE[status], _DEFAULT_HEAD.get(self.protocol.server_state.default_headers), *headers]
        if not self.keep_alive:
            head.append(_CLOSE)
        head.append(b"\r\n")
        return head

    def answer(self, status: int, body: bytes, headers: Mapping[str, str] | None = None, *,
               extra: list[bytes] | None = None, close: bool = False) -> None:
        """A whole JSON answer. ``extra`` holds ready header lines (``b"name: value\\r\\n"``).
        Given before the request's body has all come (a 413, a 401), it closes the connection."""
        if close or self.more_body:
            self.keep_alive = False
        if not self.gone:
            lines = [_JSON, b"content-length: %d\r\n" % len(body)]
            if headers:
                lines.extend(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
            if extra:
                lines.extend(extra)
            head = self._head(status, lines)
            head.append(body)
            self.transport.write(b"".join(head))
        self._complete()

    def start_stream(self, headers: list[bytes]) -> None:
        """The head of a 200 event stream; the body follows with ``send`` and ``end_stream``."""
        if self.chunked:
            headers = [*headers, _CHUNKED]
        else:
            self.keep_alive = False  # an HTTP/1.0 client reads the stream until the connection closes
        if not self.gone:
            self.transport.write(b"".join(self._head(200, headers)))

    def send(self, data: bytes) -> None:
        if self.chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(data)

    def end_stream(self, last: bytes = b"") -> None:
        """The stream's last bytes and its end, in one write."""
        if not self.gone:
            if self.chunked:
                self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(last), last) if last else _LAST_CHUNK)
            elif last:
                self.transport.write(last)
        self._complete()

    def _complete(self) -> None:
        self.response_complete = True
        self._on_gone = None
        self.on_writable = None
        if self.transport.is_closing():
            return
        if self.keep_alive:
            self.protocol.on_response_complete()  # keep-alive timer, the next pipelined request
        elif self.more_body:  # answered (413, 408) while the client may still be sending its body
            self.protocol.linger()
        else:
            self.transport.close()
