"""How the gateway is served: uvicorn with httptools, its proxy routes taken over at the
protocol level, plus what that server lacks in front of untrusted clients.

- ``POST /v1/chat/completions`` and ``POST /v1/completions`` are served by an ``Exchange``
  (serving/exchange.py) from the protocol's callbacks; everything else goes to the ASGI app.

- Requests the HTTP parser refuses before the app sees them (a non-numeric
  Content-Length, a malformed request line) get an OpenAI error object, like every other
  error of the gateway.
- A request's head (request line and headers) is bounded in size and in time: httptools
  accepts headers without limit (a client could stream gigabytes of them into memory) and
  uvicorn times out only idle keep-alive connections, not one that sends half a request
  (slowloris). The body's own time bound is the gateway's (``Exchange.read_body``).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import unquote_to_bytes

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inferwatch.serving.errors import error_body
from inferwatch.serving.exchange import Exchange
from inferwatch.serving.lazy_timer import LazyTimer, reached
from inferwatch.serving.metrics import UNROUTED
from inferwatch.serving.validation import ROUTE_PATHS

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; nginx's large_client_header_buffers default is 32 KiB
FIRST_READ_BYTES = 256 * 1024  # the first reads may carry the start of the body along with the head
HEAD_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers
LINGER_S = 5.0  # reading a refused body away before closing (nginx's lingering_timeout)
PROXY_ROUTES = {path.encode(): route for route, path in ROUTE_PATHS.items()}
PIPELINE_READ_AHEAD = 8  # requests read while they wait behind the one being answered


def _find_gateway(app: object) -> object | None:
    """The Gateway behind the ASGI app uvicorn loaded (through any middleware it wrapped it in)."""
    while app is not None:
        gateway = getattr(getattr(app, "state", None), "gateway", None)
        if gateway is not None:
            return gateway
        app = getattr(app, "app", None)
    return None


class GatewayHttpProtocol(HttpToolsProtocol):
    gateway = None  # set per connection from the loaded app
    _lingering = False
    _in_head = False
    _head_bytes = 0  # received while the head is incomplete
    _header_bytes = 0  # of parsed header names and values
    _head_started = 0.0  # time.monotonic()
    _idle_since: float | None = None  # when the last answer of a keep-alive connection went out
    _active = None  # the request being answered (an Exchange or uvicorn's cycle)
    _refusal: tuple[int, str, str] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.gateway = _find_gateway(self.app)
        # one timer each per connection, moved on lazily, not one started and cancelled per request
        self._head_timer = LazyTimer(self._head_due)
        self._keep_alive_timer = LazyTimer(self._keep_alive_due)

    def linger(self) -> None:
        """Close after an answer given before the request's body was read, without a reset.

        Closing a socket with unread data sends a TCP reset, which can destroy the answer
        before the client reads it (the client is still busy sending). So, as nginx does:
        end our side, read and drop what still comes, and close when the client does or
        after ``LINGER_S``."""
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, bounding the head, and reading on past an Upgrade the gateway ignores."""
        if self._lingering:
            return
        cycle = self.cycle
        if isinstance(cycle, Exchange) and cycle.raw_length is not None:
            if not cycle.response_complete:
                cycle.take_raw_body(data)
            return
        if self._in_head:
            self._head_bytes += len(data)  # counted before parsing: one endless header line is bounded too
            if self._head_bytes > MAX_HEAD_BYTES + FIRST_READ_BYTES:
                self._refuse(431, "header_too_large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes.")
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as upgrade:
            cycle = self.cycle
            if isinstance(cycle, Exchange) and cycle.raw_length is not None:
                cycle.take_raw_body(data[upgrade.args[0]:])
            # uvicorn's routes: the request is served without what follows, as uvicorn does

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if isinstance(cycle, Exchange) and cycle.raw_length is not None:
            return  # its body comes raw (take_raw_body)
        super().on_message_complete()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._idle_since = None  # a request began: the keep-alive clock stops
        self._in_head, self._head_bytes, self._header_bytes = True, 0, 0
        self._head_started = time.monotonic()
        self._head_timer.fire_by(self._head_started + HEAD_TIMEOUT_S)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEAD_BYTES:
            self._refusal = (431, "header_too_large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes.")
            raise ValueError("headers too large")  # httptools turns it into a parser error: answered below
        name = name.lower()  # uvicorn's on_header, inlined: it runs for every header of every request
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._end_head()
        parser = self.parser
        route = None
        if self.gateway is not None and parser.get_method() == b"POST":
            path = httptools.parse_url(self.url).path
            route = PROXY_ROUTES.get(unquote_to_bytes(path) if b"%" in path else path)  # as uvicorn routes
        if route is None:
            super().on_headers_complete()
        else:
            http_11 = parser.get_http_version() == "1.1"
            # an Upgrade (curl --http2 asks for h2c) is ignored, as nginx does: the answer is
            # HTTP/1.1, and the connection closes after it (the parser stops at an upgrade)
            keep_alive = http_11 and parser.should_keep_alive() and not parser.should_upgrade()
            previous = self.cycle
            self.cycle = Exchange(self, route, self.headers, keep_alive=keep_alive, chunked=http_11)  # type: ignore[assignment]
            if parser.should_upgrade():
                declared = dict(self.headers).get(b"content-length", b"0")
                self.cycle.raw_length = int(declared) if declared.isdigit() else 0
            if previous is None or previous.response_complete:
                self._start_asgi_task(self.cycle, self.app)
            else:  # pipelined behind a request still being answered: started in turn
                self.pipeline.appendleft((self.cycle, self.app))
        if self.pipeline:
            # uvicorn stops reading while a request waits; reading on (a few requests ahead)
            # is what notices a client that leaves meanwhile, so the one being answered aborts
            if len(self.pipeline) < PIPELINE_READ_AHEAD:
                self.flow.resume_reading()
            else:
                self.flow.pause_reading()

    def _start_asgi_task(self, cycle, app) -> None:  # type: ignore[no-untyped-def, override]
        self._active = cycle
        super()._start_asgi_task(cycle, app)



    def on_response_complete(self) -> None:
        """uvicorn's, with the connection's lazy keep-alive timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = time.monotonic()
        self._keep_alive_timer.fire_by(self._idle_since + self.timeout_keep_alive)

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn calls this on every read. The keep-alive clock stops when a request begins
        (``on_message_begin``) instead: bytes that still come for a request already answered
        (a body refused unread) do not keep the connection open."""

    def _keep_alive_due(self) -> float | None:
        if self._idle_since is None:
            return None  # busy: the next answer sets the timer again
        deadline = self._idle_since + self.timeout_keep_alive
        if not reached(deadline):
            return deadline
        self.timeout_keep_alive_handler()
        return None

    def pause_writing(self) -> None:
        super().pause_writing()
        if isinstance(self.cycle, Exchange):
            self.cycle.writable(False)

    def resume_writing(self) -> None:
        super().resume_writing()
        if isinstance(self.cycle, Exchange):
            self.cycle.writable(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        self._head_timer.cancel()
        self._keep_alive_timer.cancel()
        active = self._active  # uvicorn tells only the newest request, which may be a pipelined one
        if active is not None and active is not self.cycle and not active.response_complete:
            active.disconnected = True
            active.message_event.set()
        super().connection_lost(exc)

    def _end_head(self) -> None:
        self._in_head = False

    def _head_due(self) -> float | None:
        if not self._in_head or self.transport.is_closing():
            return None  # the next request's head sets the timer again
        deadline = self._head_started + HEAD_TIMEOUT_S
        if not reached(deadline):
            return deadline
        self._refuse(408, "request_timeout", f"The request's headers did not arrive within {HEAD_TIMEOUT_S:g}s.")
        return None

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._end_head()
        self._answer(status, code, message)

    def send_400_response(self, msg: str) -> None:
        refusal, self._refusal = self._refusal, None
        self._end_head()
        if refusal is not None:
            self._answer(*refusal)
        else:
            self._answer(400, "invalid_http_request",
                         f"{msg} Check the request line, headers and Content-Length.")

    def _answer(self, status: int, code: str, message: str) -> None:
        if self.gateway is not None:
            self.gateway.metrics.rejected.labels(UNROUTED, code).inc()
        if self.transport.is_closing():
            return
        body = error_body(message, "invalid_request_error", code)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


# uvicorn.Config/run keywords for the gateway, shared by the CLI and the tests' servers.
UVICORN_OPTIONS = {"loop": "uvloop", "http": GatewayHttpProtocol, "ws": "none", "access_log": False,
                   "proxy_headers": False}
