"""The gateway's hot path to vLLM: HTTP/1.1 over a pool of keep-alive connections, parsed by
httptools (the parser uvicorn itself uses).

A general client (aiohttp) cost the gateway more CPU per request than everything else it
does (bench/gateway_overhead.py); the proxy routes need far less of it: POST a body, read a
status, then the body whole, or handed to a sink from the connection's callbacks as it
arrives (a stream's relay, with no task switch per chunk). Model listing and probes stay on
aiohttp (serving/upstream.py). A response whose connection is closed before it ends makes
vLLM abort the request, which is how a client that goes away stops the engine's work.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections import deque
from typing import Protocol

import httptools

from inferwatch.serving.lazy_timer import SLACK_S, LazyTimer, reached

HIGH_WATER = 1 << 20  # bytes buffered from vLLM before reading pauses (a client slower than vLLM)


class UpstreamConnectError(ConnectionError):
    """The request got no response: refused, unreachable, TLS, or closed before an answer.

    ``request_sent`` says whether any of it was written: only a request vLLM never saw may be
    sent to another replica (a replica killed while working on it must not run it twice)."""

    def __init__(self, message: str, request_sent: bool = True) -> None:
        super().__init__(message)
        self.request_sent = request_sent


class UpstreamDisconnected(ConnectionError):
    """The connection broke after the response started (or vLLM spoke something not HTTP)."""


class BodySink(Protocol):
    """Takes a response's body from the connection's callbacks (``UpstreamResponse.relay_to``)."""

    def on_data(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, error: ConnectionError) -> None: ...


class ConnectionHome(Protocol):
    """Where a response's connection goes when it ends (serving/upstream_pool.py)."""

    def put(self, conn: UpstreamConnection) -> None: ...

    def discard(self, conn: UpstreamConnection) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.lost = False
        self.idle_since = 0.0
        self.timer = LazyTimer(self._on_timer)  # the waiting response's deadline, one per connection

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response = self.response
            if response is not None:
                error_type = UpstreamDisconnected if response.status else UpstreamConnectError
                response.fail(error_type(f"upstream answered something that is not HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.timer.close()
        response = self.response
        if response is not None and not response.complete:
            error = (UpstreamDisconnected if response.status else UpstreamConnectError)(
                f"upstream closed the connection{': ' + str(exc) if exc else ''}")
            response.fail(error)
            if response.release_pending:
                response.close()

    def peer_closed(self) -> bool:
        """An idle connection that is readable was closed by its peer (or got bytes nobody
        asked for), though the loop has not seen it yet: a vLLM killed a moment ago. urllib3
        checks a pooled connection the same way before it reuses one. (Over TLS, an unread
        session ticket reads the same: the cost is one needless new connection.)"""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return True

    def pause_writing(self) -> None:  # a request body larger than the socket buffer is rare here
        return None

    def resume_writing(self) -> None:
        return None

    # httptools callbacks
    def on_headers_complete(self) -> None:
        response = self.response
        if response is not None:
            response.status = self.parser.get_status_code()
            response.status_late = time.monotonic() - response._deadline > SLACK_S
            response.keep_alive = self.parser.should_keep_alive()
            response.wake()

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None:
            response.end()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()

    def _on_timer(self) -> float | None:
        return self.response.on_timer() if self.response is not None else None


class UpstreamResponse:
    """One response: its status, then its body whole (``read``) or as it comes (``readany``).

    End it with ``release`` (the connection goes back to the pool if the response was read
    to its end) or ``close`` (the connection is dropped: vLLM aborts an unfinished request)."""

    def __init__(self, pool: ConnectionHome, conn: UpstreamConnection) -> None:
        self._pool, self._conn = pool, conn
        self.status = 0
        self.keep_alive = False
        self.complete = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: ConnectionError | None = None
        self._waiter: asyncio.Future | None = None
        self._ended = False
        self.release_pending = False  # released before the body's last bytes: pooled once they come
        self._deadline = 0.0
        self.status_late = False  # the status line was read after the deadline
        self._sink: BodySink | None = None

    # fed by the connection
    def feed(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink.on_data(body)
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER:
            self.pause_reading()
        self.wake()

    def end(self) -> None:
        self.complete = True
        if self._sink is not None:
            self._sink.on_end()
        else:
            self.wake()
        if self.release_pending:
            self.release()

    def fail(self, error: ConnectionError) -> None:
        self._error = error
        if self._sink is not None:
            self._sink.on_error(error)
        else:
            self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, deadline: float) -> None:
        """Wait for the connection to report something, until ``deadline`` (``time.monotonic()``).

        The connection's timer (serving/lazy_timer.py) is kept across its requests."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self._deadline = deadline
        self._conn.timer.fire_by(deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def on_timer(self) -> float | None:
        """The connection's timer fired: time out the wait, or say when to look again."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return None  # nothing waits: the next wait sets the timer again
        if not reached(self._deadline):
            return self._deadline
        waiter.set_exception(TimeoutError())
        return None

    async def headers(self, deadline: float) -> None:
        """Wait for the status line until ``deadline`` (``time.monotonic()``), however often woken.

        A status line read only after the deadline is a timeout too: when the process was
        paused past both the deadline and the answer's arrival, which one the loop runs first
        (uvloop: the timer; asyncio's own loop: the read) must not decide."""
        self._deadline = deadline
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait(deadline)
        if self.status_late:
            raise TimeoutError()

    async def readany(self, timeout_s: float) -> bytes:
        """The body bytes that have arrived (waiting up to ``timeout_s`` for some), or b"" at
        the end of the body."""
        chunks = self._chunks
        deadline = 0.0
        while not chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            deadline = deadline or time.monotonic() + timeout_s
            await self._wait(deadline)
        data = chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
        self._buffered -= len(data)
        self.resume_reading()
        return data

    def relay_to(self, sink: BodySink) -> None:
        """From now on hand the body to ``sink`` as it arrives, starting with what is
        buffered. ``release`` and ``close`` detach it."""
        self._sink = sink
        chunks = self._chunks
        while chunks and self._sink is sink:
            sink.on_data(chunks.popleft())
        chunks.clear()
        self._buffered = 0
        if self._sink is not sink:
            return
        self.resume_reading()
        if self._error is not None:
            sink.on_error(self._error)
        elif self.complete:
            sink.on_end()

    def pause_reading(self) -> None:
        """The client reads slower than vLLM writes: let the kernel's buffers push back."""
        if not self._paused and self._conn.transport is not None and not self._ended:
            self._paused = True
            self._conn.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()

    async def read(self, deadline: float) -> bytes:
        """The whole body, by ``deadline`` (``time.monotonic()`` seconds)."""
        parts = []
        while part := await self.readany(max(0.0, deadline - time.monotonic())):
            parts.append(part)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the response: its connection is reused once the body has ended (vLLM
        sends a stream's last empty chunk just after [DONE], often in a later packet)."""
        if self._ended:
            return
        if not self.complete and self.keep_alive and self._error is None and not self._conn.lost:
            self.release_pending = True
            self._sink = None
            return
        self._ended = True
        self._sink = None
        self._conn.response = None
        if self.complete and self.keep_alive and self._error is None:
            self._pool.put(self._conn)
        else:
            self._pool.discard(self._conn)

    def close(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._sink = None
        self._conn.response = None
        self._pool.discard(self._conn)
