"""The proxy routes at the HTTP level: the gateway serves them from its own protocol
callbacks (serving/exchange.py), so what uvicorn's request cycle did for them is checked
here on raw sockets: pipelining, keep-alive, HTTP/1.0, Expect: 100-continue, bodies that
arrive in pieces, a client that reads slowly, and a client gone before its request ran."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from inferwatch.serving.gateway import create_app
from inferwatch.serving.relay_client import UpstreamResponse
from inferwatch.serving.server import uvicorn_options
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import AppServer, GatewayServer, metric_sum
from tests.support.sockets import connect, post_request, read_to_close, read_until, reset
from tests.support.stub_upstream import LONG_STREAM_CHUNKS
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


@pytest.fixture
def gw(stub):
    settings = GatewaySettings(upstream_url=stub.url, upstream_timeout_s=5.0, upstream_stream_idle_timeout_s=1.0,
                               max_body_bytes=512 * 1024)
    with GatewayServer(settings) as g:
        yield g


def _body(model: str = "ok", stream: bool = False, content: str = "hi") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}).encode()


def _request(body: bytes, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    return post_request(CHAT, body, version, extra)


def _dechunk(body: bytes) -> tuple[bytes, bytes]:
    """(payload, what follows the last chunk): a strict reader of chunked transfer coding."""
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        out, sep, body = out + body[:size], body[size:size + 2], body[size + 2:]
        assert sep == b"\r\n", "a chunk does not end with CRLF"
        if size == 0:
            return out, body


def test_pipelined_requests_are_answered_in_order_on_one_connection(gw):
    with connect(gw.port) as sock:
        sock.sendall(_request(_body()) + _request(_body(stream=True)) + _request(_body(content="third")))
        got = read_until(sock, b"0\r\n\r\n")
        first, _, rest = got.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200") and b"content-length" in first
        length = int(first.split(b"content-length: ")[1].split(b"\r\n")[0])
        assert json.loads(rest[:length])["choices"][0]["message"]["content"] == "hi"
        second_head, _, chunked = rest[length:].partition(b"\r\n\r\n")
        assert second_head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in second_head
        events, after = _dechunk(read_until(sock, b"0\r\n\r\n", chunked) if b"0\r\n\r\n" not in chunked else chunked)
        assert events.endswith(b"data: [DONE]\n\n") and b'"content":"a"' in events
        third = read_until(sock, b'"finish_reason"', after)
        assert third.startswith(b"HTTP/1.1 200")
    eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", status_class="2xx") == 3)


def test_a_keep_alive_client_sends_many_requests_on_one_connection(gw):
    with requests.Session() as session:
        for i in range(20):
            stream = i % 2 == 1
            r = session.post(gw.url + CHAT, data=_body(stream=stream), timeout=10,
                             headers={"content-type": "application/json"})
            assert r.status_code == 200
            assert (b"data: [DONE]" in r.content) if stream else r.json()["choices"][0]["message"]["content"] == "hi"
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx") == 20
    assert metric_sum(text, "inferwatch_gateway_output_tokens_total") == 10 * 1 + 10 * 2


def test_an_http_10_stream_is_sent_whole_and_the_connection_closed(gw):
    with connect(gw.port) as sock:
        sock.sendall(_request(_body(stream=True), version=b"1.0"))
        got = read_to_close(sock)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head and b"connection: close" in head
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")


def test_expect_100_continue_is_answered_before_the_body_is_sent(gw):
    body = _body()
    with connect(gw.port) as sock:
        head = _request(body, extra=b"Expect: 100-continue\r\n")
        sock.sendall(head[:-len(body)])
        assert read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        answer = read_until(sock, b'"total_tokens"')
    assert answer.startswith(b"HTTP/1.1 200 OK") and b'"content": "hi"' in answer


def test_a_body_that_arrives_in_pieces_past_64_kib_is_read_whole(gw, stub):
    body = _body(content="y" * 300_000)
    with connect(gw.port) as sock:
        message = _request(body)
        for i in range(0, len(message), 16384):
            sock.sendall(message[i:i + 16384])
            time.sleep(0.002)
        assert read_until(sock, b'"finish_reason"').startswith(b"HTTP/1.1 200")
    assert stub.seen[-1]["messages"][0]["content"] == "y" * 300_000


def test_a_chunked_body_over_the_limit_is_a_413_and_the_connection_closes(gw, stub):
    seen = len(stub.seen)
    with connect(gw.port) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" % CHAT.encode())
        piece = b"x" * 65536
        try:
            for _ in range(12):  # 768 KiB against a 512 KiB limit
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway answered and closed while we were still sending
        got = read_to_close(sock)
    assert got.startswith(b"HTTP/1.1 413") and b'"code":"body_too_large"' in got and b"connection: close" in got
    assert len(stub.seen) == seen


def test_a_slow_reader_gets_the_whole_stream_and_is_not_taken_for_an_idle_upstream(gw, monkeypatch):
    """The client reads nothing for longer than the upstream idle timeout (1 s here) while
    megabytes wait: the gateway stops reading from upstream until the client catches up,
    which is no reason to fail the stream."""
    pauses = []
    pause = UpstreamResponse.pause_reading
    monkeypatch.setattr(UpstreamResponse, "pause_reading", lambda self: (pauses.append(1), pause(self)))
    with connect(gw.port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(_request(_body("long_stream", stream=True)))
        got = read_until(sock, b"data: ")
        time.sleep(2.5)
        got = read_until(sock, b"0\r\n\r\n", got)
    events, _ = _dechunk(got.partition(b"\r\n\r\n")[2])
    contents = [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events.split(b"\n\n")
                if e.startswith(b'data: {"id"') and b'"delta"' in e]
    assert len(contents) == LONG_STREAM_CHUNKS
    assert [c[:6] for c in contents[1:-1]] == [f"{i:06d}" for i in range(LONG_STREAM_CHUNKS - 2)]  # in order
    assert b'"error"' not in events and events.endswith(b"data: [DONE]\n\n")
    assert pauses, "the client's socket never filled: the test did not exercise the push-back"
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx") == 1
    assert metric_sum(text, "inferwatch_gateway_output_tokens_total") == LONG_STREAM_CHUNKS


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_before_its_request_ran_never_reaches_upstream(gw, stub, stream):
    seen = len(stub.seen)
    gw.stall(1.0)
    time.sleep(0.1)
    sock = connect(gw.port)
    sock.sendall(_request(_body(stream=stream)))
    time.sleep(0.1)
    reset(sock)
    eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", status_class="4xx") == 1)
    time.sleep(0.2)
    assert len(stub.seen) == seen
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_in_flight") == 0


def test_the_app_under_a_server_without_the_gateways_protocol_says_so(stub):
    app = create_app(GatewaySettings(upstream_url=stub.url))
    with AppServer(app) as server:
        r = requests.post(server.url + CHAT, data=_body(), timeout=10)
        assert r.status_code == 501 and r.json()["error"]["code"] == "misconfigured_server"
        assert "inferwatch gateway" in r.json()["error"]["message"]
        assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_metrics_with_an_unreadable_accept_header_is_a_400(gw):
    r = requests.get(gw.url + "/metrics", headers={"accept": "application/openmetrics-text; version=abc"}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_accept"
    r = requests.get(gw.url + "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}, timeout=5)
    assert r.status_code == 200 and r.text.endswith("# EOF\n")


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout_counted_from_the_last_answer(stub):
    """One keep-alive timer per connection, moved on lazily: the timeout runs from the last
    answer, not from the first one that set the timer."""
    app = create_app(GatewaySettings(upstream_url=stub.url))
    with AppServer(app, **uvicorn_options(app.state.gateway.proxy), timeout_keep_alive=1) as server, \
            connect(server.port) as sock:
        for pause in (0.0, 0.7, 0.7):  # 1.4 s after the first answer, 0.7 s after the last
            time.sleep(pause)
            sock.sendall(_request(_body()))
            assert read_until(sock, b'"total_tokens"').startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closes the idle connection
        assert 0.7 < time.monotonic() - started < 3.0


@pytest.mark.parametrize("model, stream, wait_for", [("stall_stream", True, b'"content":"a"'),
                                                      ("stall_headers", False, None)])
def test_a_client_that_leaves_with_a_request_pipelined_behind_the_one_in_flight_aborts_it(gw, model, stream,
                                                                                          wait_for):
    """uvicorn tells only the newest (pipelined) request that the client left, and stops
    reading while it waits, so the one in flight would run on: to vLLM's end, or its timeout."""
    with connect(gw.port) as sock:
        sock.sendall(_request(_body(model, stream=stream)) + _request(_body()))
        if wait_for:
            read_until(sock, wait_for)
        else:
            time.sleep(0.3)
    eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total") == 1, timeout_s=3)
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", model=model, status_class="4xx") == 1
    assert metric_sum(text, "inferwatch_gateway_requests_in_flight") == 0
    assert metric_sum(text, "inferwatch_gateway_upstream_errors_total") == 0


@pytest.mark.parametrize("headers", [b"Content-Length: 2097152\r\n",  # over the 512 KiB limit: refused unread
                                     b"Content-Length: 300000\r\nAuthorization: Bearer nope\r\n"])
def test_an_answer_given_before_the_body_came_closes_the_connection_after_reading_it_away(stub, headers):
    settings = GatewaySettings(upstream_url=stub.url, max_body_bytes=512 * 1024, api_keys=["k"])
    with GatewayServer(settings) as g, connect(g.port) as sock:
        declared = int(headers.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (CHAT.encode(), headers))
        answer = read_until(sock, b"\r\n\r\n")
        assert answer.startswith((b"HTTP/1.1 413", b"HTTP/1.1 401")) and b"connection: close" in answer
        sent = 0
        while sent < declared:  # the client sends its whole body anyway, then waits
            sent += sock.send(b"x" * min(65536, declared - sent))
        started = time.monotonic()
        while sock.recv(65536):
            pass
        assert time.monotonic() - started < 8  # closed once the body was read away (at most 5 s)


@pytest.mark.parametrize("extra", [b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
                                   b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"])
def test_an_upgrade_request_is_answered_over_http_11_and_the_connection_closed(gw, extra):
    with connect(gw.port) as sock:
        sock.sendall(_request(_body(), extra=extra))
        got = read_to_close(sock)
    assert got.startswith(b"HTTP/1.1 200") and b"connection: close" in got and b'"content": "hi"' in got


@pytest.mark.parametrize("path", [b"/v1%2Fchat%2Fcompletions", b"/v1/chat/%63ompletions"])
def test_a_percent_encoded_proxy_path_is_served_as_uvicorn_would_route_it(gw, path):
    with connect(gw.port) as sock:
        sock.sendall(_request(_body()).replace(CHAT.encode(), path, 1))
        assert read_until(sock, b'"total_tokens"').startswith(b"HTTP/1.1 200")


def test_errors_answered_before_any_route_are_counted(gw, monkeypatch):
    monkeypatch.setattr("inferwatch.serving.server.HEAD_TIMEOUT_S", 0.3)
    requests.get(gw.url + "/nowhere", timeout=5)
    requests.get(gw.url + CHAT, timeout=5)
    with connect(gw.port) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n" % CHAT.encode())
        assert read_to_close(sock).startswith(b"HTTP/1.1 400")
    with connect(gw.port) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n" % (CHAT.encode(), b"a" * 70_000))
        assert read_to_close(sock).startswith(b"HTTP/1.1 431")
    with connect(gw.port) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n" % CHAT.encode())
        assert read_to_close(sock).startswith(b"HTTP/1.1 408")
    text = gw.metrics_text()
    counted = {code: metric_sum(text, "inferwatch_gateway_rejected_requests_total", route="none", code=code)
               for code in ("not_found", "method_not_allowed", "invalid_http_request", "header_too_large",
                            "request_timeout")}
    assert counted == dict.fromkeys(counted, 1.0), counted
