"""The demo's parts that need no stack: the slow relay on real sockets, the request budget
against a real HTTP server, and the CLI's refusals (remote targets, unknown scenarios, a
stack that does not answer), each before any request is sent."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferwatch.demo.relay import serve
from inferwatch.demo.traffic import Ask, Budget, Load
from tests.support.sockets import free_port

DELAY_S = 0.3


@contextmanager
def running(coro_factory):
    """Run an asyncio server in a loop on its own thread until the block ends."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def main():
        ready = asyncio.Event()
        task = asyncio.create_task(coro_factory(ready))
        await ready.wait()
        started.set()
        await task

    def run():
        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:  # how the block's end stops it
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)


async def echo_server(port: int, ready: asyncio.Event) -> None:
    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", port)
    async with server:
        ready.set()
        await server.serve_forever()


@pytest.fixture
def relay():
    upstream, port = free_port(), free_port()
    with running(lambda ready: echo_server(upstream, ready)), \
            running(lambda ready: serve("127.0.0.1", port, ("127.0.0.1", upstream), DELAY_S, ready)):
        yield port


def test_the_relay_holds_what_a_client_sends_and_passes_every_byte(relay):
    payload = bytes(range(256)) * 4096  # 1 MiB, many reads
    with socket.create_connection(("127.0.0.1", relay), timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        assert time.monotonic() - started >= DELAY_S
        conn.sendall(payload)
        got = bytearray()
        while len(got) < len(payload):
            got += conn.recv(65536)
    assert bytes(got) == payload


def test_the_relay_closes_a_client_when_vllm_is_not_there():
    port = free_port()
    with running(lambda ready: serve("127.0.0.1", port, ("127.0.0.1", free_port()), DELAY_S, ready)), \
            socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        # closed without an answer: a FIN, or a reset when the request reached the relay's socket
        # before it closed unread (Linux answers a close with unread data so), as it may on a busy machine
        try:
            answer = conn.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""


class Counting(BaseHTTPRequestHandler):
    status = 200
    seen = 0

    def do_POST(self):
        type(self).seen += 1
        self.rfile.read(int(self.headers["content-length"]))
        body = json.dumps({"choices": []}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def http_server(status: int):
    handler = type("Handler", (Counting,), {"status": status, "seen": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()


def test_the_budget_stops_every_client_at_the_announced_count():
    with http_server(200) as (url, handler):
        started = time.monotonic()
        counts = Load(url, Budget(7)).run(60, clients=4, asks=lambda i: Ask("m", 3, 4, i % 2 == 0))
        assert time.monotonic() - started < 30  # it stopped by itself, long before its minute
    assert counts == {200: 7} and handler.seen == 7


def test_a_client_that_gets_errors_does_not_hammer():
    with http_server(500) as (url, handler):
        counts = Load(url, Budget(1000)).run(2.5, clients=1, asks=lambda i: Ask("m", 3, 4, False))
    assert counts == {500: handler.seen} and 1 <= handler.seen <= 3  # one a second, not hundreds


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferwatch", "demo", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, says", [
    (["--gateway-url", "http://10.1.2.3:8080"], ["gateway=http://10.1.2.3:8080", "--allow-remote"]),
    (["--prometheus-url", "http://prometheus.example.com:9090"], ["prometheus=http://prometheus.example.com:9090"]),
    (["--scenario", "steady", "--scenario", "flood"], ["unknown scenario flood", "steady, burst, outage, canary"]),
    (["--pace", "0"], ["--pace"]),
    (["--max-requests", "0"], ["--max-requests"]),
    (["--drift-url", "ftp://127.0.0.1:8090"], ["--drift-url must be an http(s) URL"]),
    (["--pager-url", "http://127.0.0.1:notaport"], ["--pager-url has no valid port"]),
    (["--drift-url", "http://127.0.0.1:8090/ x"], ["--drift-url must be an http(s) URL"]),
])
def test_the_demo_refuses_before_sending_anything(args, says):
    with http_server(200) as (url, handler):
        result = demo("--gateway-url", url, *args) if "--gateway-url" not in args else demo(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    said = " ".join(result.stderr.replace("│", " ").split())  # typer's box wraps long lines
    for text in says:
        assert text in said, result.stderr
    assert handler.seen == 0


def test_the_demo_says_to_start_the_stack_when_it_does_not_answer():
    result = demo("--gateway-url", f"http://127.0.0.1:{free_port()}", "--prometheus-url",
                  f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 2 and "is `make up` running?" in result.stderr, result.stderr


def test_the_canary_scenario_needs_the_admin_token_before_any_traffic(tmp_path):
    """Found by an outside check: without the token a full run sent its steady traffic, burst
    and outage first, then failed at the canary."""
    with http_server(200) as (url, handler):  # answers /health and /-/ready: a stack to the demo
        result = demo("--gateway-url", url, "--prometheus-url", url, "--run-dir", str(tmp_path),
                      "--scenario", "steady", "--scenario", "canary")
    assert result.returncode == 2 and "admin token is needed" in " ".join(result.stderr.split()), result.stderr
    assert handler.seen == 0
