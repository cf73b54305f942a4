"""The gateway's upstream client against raw HTTP servers on loopback: keep-alive reuse, a
pooled connection the server closed, chunked and length-delimited bodies, a body cut short,
something that is not HTTP, the connection bound, and a slow reader's back-pressure."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferwatch.serving.relay_client import UpstreamConnectError, UpstreamDisconnected
from inferwatch.serving.upstream_pool import UpstreamPool

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"ok\": true}"


class RawServer:
    """Answers each request with ``reply(request_number)`` bytes; records connections."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for w in self.writers:
            w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                await reader.readexactly(length)
                self.requests += 1
                action = self.reply(self.requests)
                if callable(action):
                    await action(writer)
                else:
                    writer.write(action)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def run(coro):
    return asyncio.run(coro)


def test_keep_alive_reuses_one_connection_and_reads_chunked_and_sized_bodies():
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"6\r\ndata: \r\n3\r\nab\n\r\n0\r\n\r\n")

    async def scenario():
        async with RawServer(lambda n: OK if n % 2 else chunked) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            bodies = []
            for _ in range(4):
                resp = await pool.post("/v1/x", b"{}", {"content-type": "application/json"}, 5)
                bodies.append((resp.status, await resp.read(time.monotonic() + 5)))
                resp.release()
            pool.close()
            return bodies, srv.connections

    bodies, connections = run(scenario())
    assert bodies == [(200, b'{"ok": true}'), (200, b"data: ab\n")] * 2
    assert connections == 1


def test_a_pooled_connection_the_server_closed_is_replaced_without_a_failure():
    async def close_after(writer):
        writer.write(OK)
        await writer.drain()
        writer.close()  # like uvicorn's keep-alive timeout, right after answering

    async def scenario():
        async with RawServer(lambda n: close_after) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            statuses = []
            for _ in range(3):
                resp = await pool.post("/v1/x", b"{}", {}, 5)
                await resp.read(time.monotonic() + 5)
                resp.release()
                statuses.append(resp.status)
                await asyncio.sleep(0.05)
            pool.close()
            return statuses, srv.connections

    statuses, connections = run(scenario())
    assert statuses == [200, 200, 200] and connections == 3


def test_a_body_cut_short_is_an_error_and_the_connection_is_not_reused():
    async def cut(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.transport.abort()

    async def scenario():
        async with RawServer(lambda n: cut if n == 1 else OK) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            resp = await pool.post("/v1/x", b"{}", {}, 5)
            with pytest.raises(UpstreamDisconnected):
                await resp.read(time.monotonic() + 5)
            resp.release()
            again = await pool.post("/v1/x", b"{}", {}, 5)
            body = await again.read(time.monotonic() + 5)
            again.release()
            pool.close()
            return body, srv.connections

    body, connections = run(scenario())
    assert body == b'{"ok": true}' and connections == 2


def test_not_http_and_nobody_listening_are_clear_errors():
    async def scenario():
        async with RawServer(lambda n: b"SSH-2.0-OpenSSH\r\n\r\n") as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            with pytest.raises(UpstreamConnectError):
                await pool.post("/v1/x", b"{}", {}, 5)
            pool.close()
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await UpstreamPool("http://127.0.0.1:9", 2.0, 8).post("/v1/x", b"{}", {}, 5)

    run(scenario())


def test_a_refused_or_reset_connect_is_tried_once_more_before_it_fails(monkeypatch):
    """Nothing of the request left on a connect that failed: one more try costs nothing."""
    attempts: list[int] = []
    real = asyncio.BaseEventLoop.create_connection

    async def failing_first(loop, *args, **kwargs):
        attempts.append(1)
        if len(attempts) % 2:
            raise (ConnectionResetError if len(attempts) == 1 else ConnectionRefusedError)(104, "from the test")
        return await real(loop, *args, **kwargs)

    async def scenario():
        async with RawServer(lambda n: OK) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            resp = await pool.post("/v1/x", b"{}", {}, 5)  # reset, then connected
            status = resp.status
            resp.close()
            resp = await pool.post("/v1/x", b"{}", {}, 5)  # refused, then connected
            resp.close()
            pool.close()
            return status, resp.status

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_connection", failing_first)
    assert run(scenario()) == (200, 200) and len(attempts) == 4


def test_no_answer_in_time_is_a_timeout_and_drops_the_connection():
    async def never(writer):
        await asyncio.sleep(30)

    async def scenario():
        async with RawServer(lambda n: never if n == 1 else OK) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            with pytest.raises(TimeoutError):
                await pool.post("/v1/x", b"{}", {}, 0.2)
            resp = await pool.post("/v1/x", b"{}", {}, 5)
            resp.release()
            pool.close()
            return srv.connections

    assert run(scenario()) == 2


def test_connections_are_bounded_and_a_waiting_request_gets_a_freed_one():
    async def slow(writer):
        await asyncio.sleep(0.3)
        writer.write(OK)
        await writer.drain()

    async def scenario():
        async with RawServer(lambda n: slow) as srv:
            pool = UpstreamPool(srv.url, 2.0, 2)

            async def one():
                resp = await pool.post("/v1/x", b"{}", {}, 5)
                await resp.read(time.monotonic() + 5)
                resp.release()
                return resp.status

            statuses = await asyncio.gather(*(one() for _ in range(5)))
            pool.close()
            return statuses, srv.connections

    statuses, connections = run(scenario())
    assert statuses == [200] * 5 and connections == 2


def test_a_slow_reader_pauses_the_upstream_instead_of_buffering_everything():
    big = b"x" * (4 << 20)
    sized = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big

    async def scenario():
        async with RawServer(lambda n: sized) as srv:
            pool = UpstreamPool(srv.url, 2.0, 8)
            resp = await pool.post("/v1/x", b"{}", {}, 5)
            await asyncio.sleep(0.3)  # the reader is busy; the server keeps sending
            buffered = resp._buffered
            total = 0
            while part := await resp.readany(5):
                total += len(part)
            resp.release()
            pool.close()
            return buffered, total

    buffered, total = run(scenario())
    assert total == len(big) and buffered < 2 << 20


def test_the_status_line_deadline_counts_from_the_send_not_from_a_pause_after_it(monkeypatch):
    """The process pauses right after sending (a collection of a large heap) for longer than
    the timeout, and the answer, slower than the timeout too, arrives during the pause: by
    the clock the upstream was late, so it is a timeout, not an answer."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        time.sleep(0.2)  # slower than the 0.05 s timeout
        conn.sendall(OK)
        time.sleep(1)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()

    class Pausing:
        def __init__(self, transport) -> None:
            self.transport = transport

        def write(self, data: bytes) -> None:
            self.transport.write(data)
            time.sleep(0.4)  # the answer comes in meanwhile

        def __getattr__(self, name):
            return getattr(self.transport, name)

    acquire = UpstreamPool._acquire

    async def pausing_acquire(self, reuse: bool = True):
        conn, reused = await acquire(self, reuse)
        conn.transport = Pausing(conn.transport)
        return conn, reused

    monkeypatch.setattr(UpstreamPool, "_acquire", pausing_acquire)

    async def scenario():
        pool = UpstreamPool(f"http://127.0.0.1:{listener.getsockname()[1]}", 1.0, 4)
        with pytest.raises(TimeoutError):
            await pool.post("/v1/completions", b"{}", {}, 0.05)

    run(scenario())
    listener.close()
