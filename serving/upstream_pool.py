"""Keep-alive connections to one vLLM server (serving/relay_client.py speaks HTTP on them):
reused while fresh, opened up to a bound, handed to waiting requests in order."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

from inferwatch.serving.relay_client import UpstreamConnectError, UpstreamConnection, UpstreamResponse

IDLE_KEEP_S = 4.0  # reuse a pooled connection only this long: uvicorn (vLLM's server) closes after 5 s


class UpstreamPool:
    """Keep-alive connections to one vLLM server, at most ``max_connections`` open.

    ``address`` is where to connect when the URL's host is a name resolved beforehand (one
    replica of several, serving/upstream_balancer.py); the Host header and TLS name stay
    the URL's."""

    def __init__(self, base_url: str, connect_timeout_s: float, max_connections: int,
                 address: str | None = None) -> None:
        url = urlsplit(base_url)
        self.host = url.hostname or "127.0.0.1"
        self.address = address or self.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/").encode()
        self.host_header = url.netloc.encode()
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[UpstreamConnection] = []
        self._waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()
        self._limit = max_connections
        self._open = 0
        self.closed = False  # a replica gone from DNS: connections in use are dropped when handed back

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> UpstreamResponse:
        """Send the request and wait up to ``timeout_s`` for the response's status line.

        A pooled connection that turns out closed before any answer (vLLM's server drops
        idle ones) is replaced once, by a new connection: the other idle ones went to the same
        process, which may be dying. Whatever fails after that first write says
        ``request_sent``: the connection may have closed while vLLM worked on the request.
        A pooled connection its peer closed before the write is not used (``peer_closed``):
        a replica killed a moment ago has read nothing, and its request goes elsewhere."""
        head = [b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n" % (
            self.prefix, path.encode(), self.host_header, len(body))]
        head.extend(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
        request = b"".join(head) + b"\r\n" + body
        for attempt in (0, 1):
            try:
                conn, reused = await self._acquire(reuse=not attempt)
            except UpstreamConnectError as exc:
                if attempt:  # the first try wrote the request: vLLM may have it, another replica must not
                    raise UpstreamConnectError(str(exc), request_sent=True) from None
                raise
            response = UpstreamResponse(self, conn)
            conn.response = response
            assert conn.transport is not None
            # the deadline counts from the send: a pause of the process between the send and the
            # wait (a collection of a large heap) must not push it past an answer that came meanwhile
            deadline = time.monotonic() + timeout_s
            conn.transport.write(request)
            try:
                await response.headers(deadline)
                return response
            except UpstreamConnectError:
                response.close()
                if not reused or attempt:
                    raise
            except BaseException:
                response.close()
                raise
        raise AssertionError("unreachable")

    async def _acquire(self, reuse: bool = True) -> tuple[UpstreamConnection, bool]:
        """A pooled connection (with ``reuse``) that its peer has not closed, a new one while
        fewer than the limit are open, or else the first one handed back (or slot freed) while
        waiting in line."""
        now = time.monotonic()
        while reuse and self._idle:
            conn = self._idle.pop()
            if not conn.lost and now - conn.idle_since < IDLE_KEEP_S and not conn.peer_closed():
                return conn, True
            self._drop(conn)
        while self._open >= self._limit:
            waiter: asyncio.Future[UpstreamConnection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                late = waiter.result() if waiter.done() and not waiter.cancelled() else None
                if late is not None:
                    self.put(late)  # handed over just as we were cancelled: pass it on
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
            if handed is not None:
                if not handed.lost:
                    return handed, True
                self._drop(handed)
        self._open += 1
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the connection when
            # the request's cancel (its client left) comes in the loop turn the connect completes
            # in, and the request then goes to vLLM with nobody left to cut it
            async with asyncio.timeout(self.connect_timeout_s):
                conn = await self._connect()
        except BaseException as exc:
            self._open -= 1
            self._hand_over(None)
            if isinstance(exc, OSError):
                raise UpstreamConnectError(f"cannot connect to {self.address}:{self.port}: {exc}",
                                           request_sent=False) from None
            raise
        return conn, False

    async def _connect(self) -> UpstreamConnection:
        """A new connection; a refused or reset connect sent nothing of the request and is
        tried once more (a vLLM that is down refuses the second as fast)."""
        loop, ssl, name = asyncio.get_running_loop(), self.ssl, self.host if self.ssl else None
        try:
            return (await loop.create_connection(UpstreamConnection, self.address, self.port, ssl=ssl,
                                                 server_hostname=name))[1]
        except (ConnectionRefusedError, ConnectionResetError):
            return (await loop.create_connection(UpstreamConnection, self.address, self.port, ssl=ssl,
                                                 server_hostname=name))[1]

    def put(self, conn: UpstreamConnection) -> None:
        if self.closed:
            self._drop(conn)
            return
        conn.idle_since = time.monotonic()
        if not self._hand_over(conn):
            self._idle.append(conn)

    def discard(self, conn: UpstreamConnection) -> None:
        self._drop(conn)

    def _drop(self, conn: UpstreamConnection) -> None:
        conn.close()
        self._open -= 1
        self._hand_over(None)

    def _hand_over(self, conn: UpstreamConnection | None) -> bool:
        """Give a connection (or, with None, a free slot) to the longest waiting request."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def close(self) -> None:
        self.closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
