"""How the gateway is served: uvicorn with httptools, its proxy routes taken over at the
protocol level, plus what that server lacks in front of untrusted clients.

- ``POST /v1/chat/completions`` and ``POST /v1/completions`` are served by an ``Exchange``
  (serving/exchange.py) from the protocol's callbacks, with the handler ``uvicorn_options``
  binds; everything else goes to the ASGI app. uvicorn's ``limit_concurrency`` holds for
  both (a 503 once that many connections or requests are open).
- The subclass relies on members of uvicorn's ``HttpToolsProtocol`` that uvicorn does not
  document as an API: ``UVICORN_METHODS`` and ``UVICORN_ATTRIBUTES`` list them, ``check_uvicorn`` fails at import
  with the missing one named, pyproject.toml bounds uvicorn to the versions tested, and
  tests/serving/test_uvicorn_contract.py fails when an overridden method changes upstream.

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
from collections import deque
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from inferwatch.serving.errors import INVALID_REQUEST, error_body
from inferwatch.serving.exchange import Exchange
from inferwatch.serving.lazy_timer import LazyTimer, reached
from inferwatch.serving.validation import ROUTE_PATHS

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; nginx's large_client_header_buffers default is 32 KiB
FIRST_READ_BYTES = 256 * 1024  # the first reads may carry the start of the body along with the head
HEAD_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers
LINGER_S = 5.0  # reading a refused body away before closing (nginx's lingering_timeout)
PROXY_ROUTES = {path.encode(): route for route, path in ROUTE_PATHS.items()}
PIPELINE_READ_AHEAD = 8  # requests read while they wait behind the one being answered

# What GatewayHttpProtocol uses of uvicorn's HttpToolsProtocol beyond asyncio.Protocol:
# methods it extends or calls, and attributes it reads.
UVICORN_METHODS = ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_header",
                   "on_headers_complete", "on_message_complete", "send_400_response", "pause_writing",
                   "resume_writing", "timeout_keep_alive_handler")
UVICORN_ATTRIBUTES = ("app", "loop", "transport", "flow", "parser", "cycle", "pipeline", "headers", "url", "tasks",
                      "connections", "server_state", "limit_concurrency", "timeout_keep_alive", "expect_100_continue")


def check_uvicorn() -> None:
    """Fail at once, naming the member, on a uvicorn whose protocol lacks what the gateway uses
    (instead of every proxied request failing at run time)."""
    missing = [m for m in UVICORN_METHODS if not callable(getattr(HttpToolsProtocol, m, None))]
    if missing:
        import uvicorn

        raise RuntimeError(f"uvicorn {uvicorn.__version__}: HttpToolsProtocol has no {', '.join(missing)}; the "
                           "gateway's protocol (inferwatch.serving.server) needs the uvicorn range pinned in "
                           "inferwatch's pyproject.toml.")


check_uvicorn()


class ProxyHandler(Protocol):
    """What the protocol needs of the gateway: the proxy routes' handler, its answer past
    ``limit_concurrency``, and a count of the requests refused before any route."""

    async def serve(self, exchange: Exchange) -> None: ...

    async def over_limit(self, exchange: Exchange) -> None: ...

    def refused(self, code: str) -> None: ...


class GatewayHttpProtocol(HttpToolsProtocol):
    proxy: ProxyHandler  # bound by uvicorn_options
    # uvicorn's, widened: the proxy routes run as an Exchange, and both go (None) with the connection
    cycle: RequestResponseCycle | Exchange | None  # type: ignore[assignment]  # widened, as said
    pipeline: deque[tuple[RequestResponseCycle | Exchange, Any]]  # type: ignore[assignment]  # widened
    _lingering = False
    _in_head = False
    _head_bytes = 0  # received while the head is incomplete
    _header_bytes = 0  # of parsed header names and values
    _head_started = 0.0  # time.monotonic()
    _idle_since: float | None = None  # when the last answer of a keep-alive connection went out
    _active: RequestResponseCycle | Exchange | None = None  # the request being answered
    _refusal: tuple[int, str, str] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own type
        super().connection_made(transport)
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
        if parser.get_method() == b"POST":
            path = httptools.parse_url(self.url).path
            route = PROXY_ROUTES.get(unquote_to_bytes(path) if b"%" in path else path)  # as uvicorn routes
        if route is None:
            super().on_headers_complete()
            if not self.pipeline or self.pipeline[0][0] is not self.cycle:
                self._active = self.cycle  # started (not queued behind another)
        else:
            http_11 = parser.get_http_version() == "1.1"
            # an Upgrade (curl --http2 asks for h2c) is ignored, as nginx does: the answer is
            # HTTP/1.1, and the connection closes after it (the parser stops at an upgrade)
            keep_alive = http_11 and parser.should_keep_alive() and not parser.should_upgrade()
            previous = self.cycle
            limit = self.limit_concurrency
            handler = self.proxy.serve if limit is None or (len(self.connections) < limit and len(self.tasks) < limit) \
                else self.proxy.over_limit
            exchange = Exchange(self, handler, route, self.headers, keep_alive=keep_alive, chunked=http_11)
            self.cycle = exchange
            if parser.should_upgrade():
                declared = dict(self.headers).get(b"content-length", b"0")
                exchange.raw_length = int(declared) if declared.isdigit() else 0
            if previous is None or previous.response_complete:
                self._start(exchange, self.app)
            else:  # pipelined behind a request still being answered: started in turn
                self.pipeline.appendleft((exchange, self.app))
        if self.pipeline:
            # uvicorn stops reading while a request waits; reading on (a few requests ahead)
            # is what notices a client that leaves meanwhile, so the one being answered aborts
            if len(self.pipeline) < PIPELINE_READ_AHEAD:
                self.flow.resume_reading()
            else:
                self.flow.pause_reading()

    def _start(self, cycle: Any, app: Any) -> None:
        """Start a request's task (an Exchange, or uvicorn's cycle for a pipelined request)."""
        self._active = cycle
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_response_complete(self) -> None:
        """uvicorn's, with the connection's lazy keep-alive timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start(cycle, app)
            return
        self._idle_since = time.monotonic()
        self._keep_alive_timer.fire_by(self._idle_since + self.timeout_keep_alive)

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
        self._head_timer.close()
        self._keep_alive_timer.close()
        active = self._active  # uvicorn tells only the newest request, which may be a pipelined one
        if active is not None and active is not self.cycle and not active.response_complete:
            active.disconnected = True
            active.message_event.set()
        super().connection_lost(exc)
        # uvicorn drops its parser here, which holds the protocol; the requests (each holds
        # its protocol) go too, or each closed connection would be a cycle for the collector
        self.cycle = self._active = None
        self.pipeline.clear()

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
        self.proxy.refused(code)
        if self.transport.is_closing():
            return
        body = error_body(message, INVALID_REQUEST, code)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def uvicorn_options(proxy: ProxyHandler, limit_concurrency: int | None = None) -> dict[str, Any]:
    """uvicorn.Config/run keywords for a gateway, shared by the CLI and the tests' servers: the
    protocol class is bound to the gateway's proxy handler (one class per gateway)."""
    protocol = type("BoundGatewayHttpProtocol", (GatewayHttpProtocol,), {"proxy": proxy})
    return {"loop": "uvloop", "http": protocol, "ws": "none", "access_log": False, "proxy_headers": False,
            "limit_concurrency": limit_concurrency}
