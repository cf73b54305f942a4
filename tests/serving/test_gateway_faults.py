"""The gateway's own answers: bad input, auth, upstream down / slow / broken.

Upstream misbehaviour comes from a stub server (tests/support/stub_upstream.py) because
real vLLM cannot be made to stall or send garbage on demand; killing real vLLM mid-stream
is tested in tests/integration.
"""

import time

import orjson
import pytest
import requests

from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import AppServer, GatewayServer, metric_sum
from tests.support.sockets import connect, free_port, post_request
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


def chat(gw, model="ok", stream=False, headers=None, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
    return requests.post(gw.url + CHAT, json=body, headers=headers, timeout=10, stream=stream)


def error_of(resp):
    return resp.json()["error"]


@pytest.fixture
def gw(stub):
    settings = GatewaySettings(upstream_url=stub.url, upstream_timeout_s=1.0, upstream_stream_idle_timeout_s=1.0,
                               max_body_bytes=4096)
    with GatewayServer(settings) as g:
        yield g


def test_happy_path_through_stub(gw):
    r = chat(gw)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", model="ok", status_class="2xx") == 1
    assert metric_sum(text, "inferwatch_gateway_input_tokens_total", model="ok") == 3


@pytest.mark.parametrize("data, status, code", [
    (b"{nope", 400, "invalid_json"),
    (orjson.dumps({"model": "ok"}), 400, "invalid_messages"),
    (orjson.dumps({"model": "ok", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}),
     400, "invalid_max_tokens"),
    (orjson.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404, "model_not_found"),
    (b"x" * 5000, 413, "body_too_large"),
])
def test_bad_input_is_answered_with_an_openai_error_and_counted(gw, stub, data, status, code):
    before = len(stub.seen)
    r = requests.post(gw.url + CHAT, data=data, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == status
    assert error_of(r)["code"] == code and error_of(r)["message"]
    assert len(stub.seen) == before  # nothing reached the upstream
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_rejected_requests_total", code=code) == 1
    assert metric_sum(text, "inferwatch_gateway_requests_total", status_class=f"{status // 100}xx") == 1


def test_body_limit_applies_without_content_length(gw):
    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    r = requests.post(gw.url + CHAT, data=chunks(), timeout=10)  # chunked transfer encoding
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_timeout_is_504(gw, stream):
    r = chat(gw, "stall_headers", stream=stream)
    assert r.status_code == 504 and error_of(r)["code"] == "upstream_timeout"
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_errors_total", reason="timeout") == 1


def test_upstream_stalling_mid_stream_ends_with_an_error_event(gw):
    r = chat(gw, "stall_stream", stream=True)
    assert r.status_code == 200
    events = [e for e in r.content.split(b"\n\n") if e]
    assert b'"content":"a"' in events[0]
    assert orjson.loads(events[-1][6:])["error"]["code"] == "upstream_timeout"
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="timeout") == 1
    assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == 1


def test_stream_cut_without_done_ends_with_an_error_event(gw):
    r = chat(gw, "cut", stream=True)
    last = [e for e in r.content.split(b"\n\n") if e][-1]
    assert orjson.loads(last[6:])["error"]["code"] == "stream_interrupted"
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_errors_total",
                      reason="stream_interrupted") == 1


def test_upstream_error_event_is_relayed_and_counted(gw):
    r = chat(gw, "error_event", stream=True)
    assert b"engine failed" in r.content
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="http_5xx") == 1
    assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == 1


def test_upstream_5xx_is_passed_through_and_counted(gw):
    r = chat(gw, "http500")
    assert r.status_code == 500 and error_of(r)["message"] == "engine dead"
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_errors_total", reason="http_5xx") == 1


def test_garbage_from_upstream_is_502(gw):
    r = chat(gw, "garbage")
    assert r.status_code == 502 and error_of(r)["code"] == "bad_response"
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_errors_total", reason="bad_response") == 1


def test_stream_without_usage_request_gets_no_usage_chunk_but_tokens_are_counted(gw, stub):
    r = chat(gw, stream=True)
    assert b'"usage"' not in r.content and r.content.endswith(b"data: [DONE]\n\n")
    assert stub.seen[-1]["stream_options"] == {"include_usage": True}
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_output_tokens_total", model="ok") == 2


def test_upstream_not_running():
    settings = GatewaySettings(upstream_url=f"http://127.0.0.1:{free_port()}", upstream_connect_timeout_s=0.5)
    with GatewayServer(settings) as gw:
        assert requests.get(gw.url + "/health", timeout=5).status_code == 200
        ready = requests.get(gw.url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        for stream in (False, True):
            r = chat(gw, "tiny-llama", stream=stream)
            assert r.status_code == 503 and error_of(r)["code"] == "upstream_unavailable"
        assert requests.get(gw.url + "/v1/models", timeout=5).status_code == 503
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_upstream_up") == 0
        assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="connect") == 2
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == 2


def test_api_keys(stub):
    settings = GatewaySettings(upstream_url=stub.url, api_keys="alpha,beta")
    with GatewayServer(settings) as gw:
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "Basic alpha"}):
            r = chat(gw, headers=headers)
            assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
        assert requests.get(gw.url + "/v1/models", timeout=5).status_code == 401
        assert chat(gw, headers={"authorization": "Bearer beta"}).status_code == 200
        # liveness, readiness and metrics stay open for probes and scrapers
        assert requests.get(gw.url + "/metrics", timeout=5).status_code == 200
        assert requests.get(gw.url + "/ready", timeout=5).status_code == 200
        # the client's key is the gateway's business, never forwarded to vLLM
        assert "authorization" not in {k.lower() for k in stub.headers_seen[-1]}
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_rejected_requests_total",
                          code="invalid_api_key") == 3


def test_client_going_away_mid_stream_is_counted_and_releases_upstream(gw):
    r = chat(gw, "stall_stream", stream=True)
    first = next(r.iter_content(chunk_size=None))
    assert b'"content":"a"' in first
    r.close()  # the user closed the tab
    eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", status_class="4xx") == 1)
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", model="stall_stream", status_class="4xx") == 1
    assert metric_sum(text, "inferwatch_gateway_requests_in_flight") == 0
    assert metric_sum(text, "inferwatch_gateway_upstream_errors_total") == 0  # not vLLM's fault


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_spans_exported_over_both_otlp_protocols(stub, protocol):
    from tests.support.otlp import GrpcOTLPReceiver, OTLPReceiver

    receiver = GrpcOTLPReceiver() if protocol == "grpc" else OTLPReceiver()
    try:
        settings = GatewaySettings(upstream_url=stub.url, otlp_endpoint=receiver.endpoint, otlp_protocol=protocol)
        with GatewayServer(settings) as gw:
            assert chat(gw).status_code == 200
        spans = receiver.spans if protocol == "grpc" else receiver
        got = spans.wait_for(lambda all_spans: [s for s in all_spans if s.name == "chat ok"])
        assert got[0].service == "inferwatch-gateway" and got[0].attributes["gen_ai.request.model"] == "ok"
    finally:
        receiver.close()


def test_sampling_ratio_zero_records_nothing_but_propagates(stub):
    from tests.support.otlp import OTLPReceiver

    receiver = OTLPReceiver()
    try:
        settings = GatewaySettings(upstream_url=stub.url, otlp_endpoint=receiver.endpoint, trace_sample_ratio=0.0)
        with GatewayServer(settings) as gw:
            assert chat(gw).status_code == 200
            parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"  # a sampled parent wins over the ratio
            assert chat(gw, headers={"traceparent": parent}).status_code == 200
        time.sleep(1.0)
        names = {(s.trace_id, s.name) for s in receiver.spans}
        assert {n for _, n in names} >= {"chat ok"} and {t for t, _ in names} == {"ab" * 16}
        assert stub.headers_seen[-1]["traceparent"].startswith("00-" + "ab" * 16)
        flags = int(stub.headers_seen[-2]["traceparent"].rsplit("-", 1)[1], 16)
        assert flags & 1 == 0  # the "not sampled" decision travels on
    finally:
        receiver.close()


def test_upstream_that_comes_back_is_seen_within_seconds_not_at_the_next_refresh():
    """While vLLM is down the gateway re-probes every couple of seconds, so upstream_up
    (and GatewayUpstreamDown) follow its return at once, not after models_refresh_s."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route


    port = free_port()
    settings = GatewaySettings(upstream_url=f"http://127.0.0.1:{port}", upstream_connect_timeout_s=0.5,
                               models_refresh_s=300)
    models = Starlette(routes=[Route("/v1/models", lambda request: JSONResponse(
        {"object": "list", "data": [{"id": "ok", "object": "model"}]}))])
    with GatewayServer(settings) as gw:
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_up") == 0
        with AppServer(models, port=port):
            eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_up") == 1, timeout_s=5)


@pytest.mark.parametrize("method, path, status, code", [
    ("GET", CHAT, 405, "method_not_allowed"),
    ("POST", "/v1/embeddings", 404, "not_found"),
    ("GET", "/nope", 404, "not_found"),
])
def test_routing_errors_are_openai_error_objects(gw, method, path, status, code):
    r = requests.request(method, gw.url + path, timeout=5)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    err = error_of(r)
    assert err["code"] == code and err["type"] and path in err["message"]
    if status == 405:
        assert r.headers["allow"] == "POST"


def test_a_request_the_http_parser_refuses_gets_an_openai_error_object(gw):
    with connect(gw.port, timeout_s=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
        head, _, body = s.recv(65536).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    assert orjson.loads(body)["error"]["code"] == "invalid_http_request"


def test_admission_answers_429_with_retry_after_per_key_and_per_model(stub, tmp_path):
    import openai

    from inferwatch.serving.admission import key_id

    limits = tmp_path / "limits.yml"
    limits.write_text("default_key: {requests_per_minute: 2}\n"
                      f"keys: {{{key_id('key-b')}: {{requests_per_minute: 100}}}}\n"
                      "models: {stall_stream: {max_in_flight: 1}}\n")
    settings = GatewaySettings(upstream_url=stub.url, api_keys=["key-a", "key-b"], limits_file=limits)
    with GatewayServer(settings) as g:
        a = openai.OpenAI(base_url=f"{g.url}/v1", api_key="key-a", max_retries=0)
        for _ in range(2):
            a.chat.completions.create(model="ok", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.RateLimitError) as info:
            a.chat.completions.create(model="ok", messages=[{"role": "user", "content": "hi"}])
        assert info.value.response.headers["retry-after"] == "30"
        assert info.value.body["code"] == "rate_limit_exceeded" and "2 requests per minute" in info.value.body["message"]
        # another key is not starved by the first
        assert chat(g, headers={"authorization": "Bearer key-b"}).status_code == 200
        # one stream in flight for the model, the next is refused until it ends
        held = chat(g, "stall_stream", stream=True, headers={"authorization": "Bearer key-b"})
        reading = held.iter_content(chunk_size=None)  # kept: a dropped iterator closes the connection
        assert next(reading)
        r = chat(g, "stall_stream", stream=True, headers={"authorization": "Bearer key-b"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and "in flight" in error_of(r)["message"]
        held.close()
        text = g.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_admission_rejected_total", scope="key",
                          limit="requests_per_minute", model="ok") == 1
        assert metric_sum(text, "inferwatch_gateway_admission_rejected_total", scope="model", limit="in_flight",
                          model="stall_stream") == 1
        # limits change without a restart; a broken file keeps them and is counted
        limits.write_text("default_key: {requests_per_minute: 1000}\n")
        eventually(lambda: chat(g, headers={"authorization": "Bearer key-a"}).status_code == 200, timeout_s=5)
        limits.write_text("default_key: {requests_per_minute: [}\n")
        # the file is looked at when a request comes: the request first, then the count
        eventually(lambda: chat(g, headers={"authorization": "Bearer key-a"}).status_code == 200
                   and metric_sum(g.metrics_text(), "inferwatch_gateway_limits_reload_errors_total") == 1,
                   timeout_s=5)


def test_a_missing_or_broken_limits_file_stops_the_start_with_a_clear_error(stub, tmp_path):
    from inferwatch.serving.admission import PolicyError
    from inferwatch.serving.gateway import create_app

    with pytest.raises(FileNotFoundError):
        create_app(GatewaySettings(upstream_url=stub.url, limits_file=tmp_path / "nope.yml"))
    bad = tmp_path / "bad.yml"
    bad.write_text("default_key: {tokens_per_minute: -5}\n")
    with pytest.raises(PolicyError, match=r"default_key\.tokens_per_minute"):
        create_app(GatewaySettings(upstream_url=stub.url, limits_file=bad))


def test_metrics_render_off_the_event_loop(gw):
    """A scrape that takes long to render (many models and variants) must not hold requests
    up: while a collector is stuck inside /metrics, requests are still answered."""
    import threading

    release, rendering = threading.Event(), threading.Event()

    class Slow:
        def collect(self):
            rendering.set()
            release.wait(10)
            return []

    gw.registry.register(Slow())
    scrape = threading.Thread(target=gw.metrics_text)
    scrape.start()
    assert rendering.wait(5)
    try:
        body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
        answered = requests.post(gw.url + CHAT, json=body, timeout=3)  # the collector holds /metrics for 10 s
        assert answered.status_code == 200
    finally:
        release.set()
        scrape.join(10)


def test_a_client_error_inside_a_stream_is_the_clients_not_an_upstream_failure(gw):
    r = chat(gw, "bad_request_event", stream=True)
    assert b"out of vocabulary" in r.content
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_requests_total", model="bad_request_event", status_class="4xx") == 1
    assert metric_sum(text, "inferwatch_gateway_requests_total", model="bad_request_event", status_class="5xx") == 0
    assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="http_4xx") == 1


def test_upstream_up_drops_as_soon_as_a_request_cannot_connect():
    stub = StubUpstream().__enter__()
    with GatewayServer(GatewaySettings(upstream_url=stub.url, models_refresh_s=3600)) as g:
        assert chat(g).status_code == 200
        stub.__exit__(None, None, None)  # vLLM goes away between two model-list refreshes
        assert chat(g).status_code == 503
        assert metric_sum(g.metrics_text(), "inferwatch_gateway_upstream_up") == 0


@pytest.mark.parametrize("more", [
    b"X-Flood: " + b"a" * 8000 + b"\r\n",  # header after header
    b"a" * 8000,  # one header line that never ends
])
def test_a_request_head_is_bounded_in_size(gw, more):
    """httptools keeps whatever headers come; a client must not fill the gateway's memory."""
    answer = b""
    with connect(gw.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Start: ")
        try:
            for _ in range(200):  # up to 1.6 MB, far past the bound
                s.sendall(more)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway answered and closed
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431"), answer[:200]
    assert orjson.loads(body)["error"]["code"] == "header_too_large"


def test_half_sent_requests_are_timed_out(stub, monkeypatch):
    monkeypatch.setattr("inferwatch.serving.server.HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr("inferwatch.serving.body.BODY_TIMEOUT_S", 0.5)
    with GatewayServer(GatewaySettings(upstream_url=stub.url)) as g:
        for partial, code in ((b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", "request_timeout"),
                              (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                               "request_timeout")):
            with connect(g.port) as s:
                s.sendall(partial)
                answer = s.recv(65536)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), answer[:200]
            assert orjson.loads(body)["error"]["code"] == code


def test_a_trailing_slash_is_an_openai_404_not_a_redirect(gw):
    r = requests.post(gw.url + CHAT + "/", json={}, timeout=5, allow_redirects=False)
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


def test_leaving_early_is_no_way_around_tokens_per_minute(stub, tmp_path):
    """A client that hangs up has no usage to be charged: it is charged what it may have used."""
    limits = tmp_path / "limits.yml"
    limits.write_text("default_key: {tokens_per_minute: 500}\n")
    with GatewayServer(GatewaySettings(upstream_url=stub.url, limits_file=limits)) as g:
        body = orjson.dumps({"model": "stall_headers", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 400, "n": 2})
        with connect(g.port) as s:
            s.sendall(post_request(CHAT, body))
            time.sleep(0.3)
        eventually(lambda: metric_sum(g.metrics_text(), "inferwatch_gateway_requests_in_flight") == 0)
        r = chat(g)
        assert r.status_code == 429 and "tokens per minute" in error_of(r)["message"]
