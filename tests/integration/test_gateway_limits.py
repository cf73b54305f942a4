"""The gateway under token limits and clients that go away, against real vLLM.

Independent truths: vLLM's own counters (`vllm:generation_tokens_total` shows whether an
abandoned request was aborted or ran to its end) and vLLM's `usage` in its answers.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from inferwatch.serving import relay, relay_client
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME
from tests.integration.test_gateway_vllm import MSG, client, settled_vllm_metrics, vllm_metrics
from tests.support.servers import GatewayServer, metric_sum
from tests.support.sockets import connect, post_request, read_until, reset
from tests.support.throttle import descendants, frozen, throttled
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
LIMIT = 16
LONG = 450  # tokens an abandoned request would generate if nobody aborted it (~0.5 s here)
SLOW_S = 120.0  # the longest wait for vLLM on a loaded two-core machine
ABORT_HEARD_S = 1.0  # for vLLM's API server to take a request or hear its caller hang up (ms when idle)


@pytest.fixture(scope="module")
def limited(vllm_server):
    with GatewayServer(GatewaySettings(upstream_url=vllm_server.url, max_tokens_limit=LIMIT)) as gw:
        yield gw


@pytest.fixture(scope="module")
def gateway(vllm_server):
    with GatewayServer(GatewaySettings(upstream_url=vllm_server.url)) as gw:
        yield gw


def test_a_small_max_tokens_cannot_carry_a_large_max_completion_tokens(limited):
    c = client(limited.url)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=4, max_completion_tokens=300)
    assert info.value.body["code"] == "invalid_max_tokens" and info.value.body["param"] == "max_completion_tokens"
    answer = c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_completion_tokens=5,
                                       temperature=0.0)
    assert answer.usage.completion_tokens <= 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_without_a_limit_is_held_to_the_gateways(limited, stream):
    """vLLM alone would generate to the end of the context (~500 tokens for the tiny model)."""
    c = client(limited.url)
    if stream:
        chunks = list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, temperature=0.0, stream=True,
                                                stream_options={"include_usage": True}))
        usage = chunks[-1].usage
    else:
        usage = c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, temperature=0.0).usage
    assert 0 < usage.completion_tokens <= LIMIT


def _generated(vllm_server) -> float:
    return metric_sum(settled_vllm_metrics(vllm_server, timeout_s=30), "vllm:generation_tokens_total")


def _leave(gateway, sock: socket.socket) -> None:
    """The client hangs up; the gateway finishes the request, and vLLM's API server has time
    to hear the gateway hang up in turn."""
    reset(sock)
    eventually(lambda: metric_sum(gateway.metrics_text(), "inferwatch_gateway_requests_in_flight") == 0,
               timeout_s=30)
    time.sleep(ABORT_HEARD_S)


def _sent_upstream(gateway) -> bool:
    return metric_sum(gateway.metrics_text(), "inferwatch_gateway_upstream_endpoint_requests_in_flight") == 1


def _send(gateway, body: dict) -> socket.socket:
    sock = connect(gateway.port, timeout_s=30)
    sock.sendall(post_request(CHAT, json.dumps(body).encode()))
    return sock


def test_a_non_streaming_client_that_leaves_aborts_the_upstream_request(gateway, vllm_server):
    """The client leaves while vLLM holds its request, its engine stopped: a 499, and vLLM
    generates nothing once it runs again. The control, the same request whose client stays,
    shows the stopped engine loses nothing: it generates every token once it runs again."""
    body = {"model": TINY_MODEL_NAME, "messages": MSG, "max_tokens": LONG, "temperature": 0.0,
            "ignore_eos": True}
    before = _generated(vllm_server)
    with ThreadPoolExecutor(1) as pool:
        with frozen(descendants(vllm_server.process.pid)):
            stays = pool.submit(requests.post, gateway.url + CHAT, json=body, timeout=SLOW_S)
            eventually(lambda: _sent_upstream(gateway), timeout_s=30)
            time.sleep(ABORT_HEARD_S)
        assert stays.result().json()["usage"]["completion_tokens"] == LONG
    assert _generated(vllm_server) - before == LONG

    # One stop for the whole of it: the engine core never runs between the request reaching
    # it and the client leaving (a gap of milliseconds between two stops let it generate a
    # few tokens on a loaded machine), so only the gateway's abort keeps it from finishing.
    before, g0 = _generated(vllm_server), gateway.metrics_text()
    with frozen(descendants(vllm_server.process.pid)):
        leaves = _send(gateway, body)
        eventually(lambda: _sent_upstream(gateway), timeout_s=30)
        time.sleep(ABORT_HEARD_S)  # vLLM's API server has it for its engine
        _leave(gateway, leaves)
    assert _generated(vllm_server) - before == 0
    g1 = gateway.metrics_text()
    delta = {cls: metric_sum(g1, "inferwatch_gateway_requests_total", status_class=cls)
             - metric_sum(g0, "inferwatch_gateway_requests_total", status_class=cls) for cls in ("2xx", "4xx")}
    assert delta == {"2xx": 0, "4xx": 1}, delta


def _one_more_request_was_a_499(gateway, before: str) -> float:
    """Waits for the request to be recorded; returns the output tokens it was counted."""
    eventually(lambda: metric_sum(gateway.metrics_text(), "inferwatch_gateway_requests_in_flight") == 0
               and metric_sum(gateway.metrics_text(), "inferwatch_gateway_requests_total")
               > metric_sum(before, "inferwatch_gateway_requests_total"), timeout_s=30)
    after = gateway.metrics_text()
    delta = {cls: metric_sum(after, "inferwatch_gateway_requests_total", status_class=cls)
             - metric_sum(before, "inferwatch_gateway_requests_total", status_class=cls) for cls in ("2xx", "4xx")}
    assert delta == {"2xx": 0, "4xx": 1}, delta
    return (metric_sum(after, "inferwatch_gateway_output_tokens_total")
            - metric_sum(before, "inferwatch_gateway_output_tokens_total"))


@pytest.mark.parametrize("attempt", range(3))
def test_a_stream_whose_client_left_while_the_gateway_was_starved_is_a_499(gateway, vllm_server, attempt,
                                                                           monkeypatch):
    """The end of the upstream stream and the client's disconnect arrive together once the
    loop runs again: the request must be a 499 with the tokens relayed, not a success. Built,
    not timed: the gateway's loop is held once it has relayed three tokens, until vLLM's own
    counter says the stream is done and the client has left."""
    release, held = threading.Event(), threading.Event()
    relay_chunk = relay.StreamRelay.on_data

    def starved(self, chunk):  # the upstream connection's callback, on the gateway's loop
        relay_chunk(self, chunk)
        if self.account.token_events >= 3 and not held.is_set():
            held.set()
            release.wait(SLOW_S)

    done = "vllm:request_success_total"
    v0 = metric_sum(settled_vllm_metrics(vllm_server, timeout_s=30), done)
    g0 = gateway.metrics_text()
    monkeypatch.setattr(relay.StreamRelay, "on_data", starved)
    body = {"model": TINY_MODEL_NAME, "messages": MSG, "max_tokens": 120, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    sock = _send(gateway, body)
    try:
        read_until(sock, b"data: ", times=3)
        assert held.wait(SLOW_S)
        eventually(lambda: metric_sum(vllm_metrics(vllm_server), done) > v0, timeout_s=SLOW_S)  # into our socket
        reset(sock)
    finally:
        release.set()
    assert 0 < _one_more_request_was_a_499(gateway, g0) <= 120


def test_a_stream_whose_client_left_aborts_vllm(gateway, vllm_server):
    """The client leaves at its first token, vLLM's engine stopped as it leaves: vLLM stops
    with the few tokens it had made, far short of the 450 asked for. The engine runs slowed
    until the first token is read and then stays stopped: at full speed it makes all 450 in
    about 0.5 s, which a loaded machine can take to relay one token (a clean run saw 450)."""
    body = {"model": TINY_MODEL_NAME, "messages": MSG, "max_tokens": LONG, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    before = _generated(vllm_server)
    with throttled(descendants(vllm_server.process.pid), run_s=0.01) as hold:
        sock = _send(gateway, body)
        read_until(sock, b'"content"')
        hold()
        _leave(gateway, sock)
    generated = _generated(vllm_server) - before
    assert 0 < generated < LONG / 2, generated


def test_input_token_counters_equal_vllms_with_several_choices(gateway, vllm_server):
    v0, g0 = settled_vllm_metrics(vllm_server), gateway.metrics_text()
    c = client(gateway.url)
    c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=3, n=2)
    list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=3, n=2, stream=True))
    c.completions.create(model=TINY_MODEL_NAME, prompt="one two", max_tokens=2, n=3)
    v1, g1 = settled_vllm_metrics(vllm_server), gateway.metrics_text()
    for vllm_name, gw_name in (("vllm:prompt_tokens_total", "inferwatch_gateway_input_tokens_total"),
                               ("vllm:generation_tokens_total", "inferwatch_gateway_output_tokens_total")):
        vllm_delta = metric_sum(v1, vllm_name) - metric_sum(v0, vllm_name)
        gw_delta = metric_sum(g1, gw_name) - metric_sum(g0, gw_name)
        assert vllm_delta > 0 and gw_delta == vllm_delta, (vllm_name, vllm_delta, gw_delta)


def test_request_histograms_agree_with_vllms(gateway, vllm_server):
    """Prompt and completion lengths equal vLLM's per-request histograms; the gateway's
    end-to-end time and time per output token enclose vLLM's own."""
    pairs = {"prompt": ("vllm:request_prompt_tokens", "inferwatch_gateway_request_prompt_tokens"),
             "completion": ("vllm:request_generation_tokens", "inferwatch_gateway_request_completion_tokens"),
             "e2e": ("vllm:e2e_request_latency_seconds", "inferwatch_gateway_request_duration_seconds"),
             "tpot": ("vllm:request_time_per_output_token_seconds",
                      "inferwatch_gateway_time_per_output_token_seconds")}
    v0, g0 = settled_vllm_metrics(vllm_server), gateway.metrics_text()
    c = client(gateway.url)
    for i in range(4):
        list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=6 + 3 * i, stream=True,
                                       temperature=0.0, extra_body={"ignore_eos": True}))
    v1, g1 = settled_vllm_metrics(vllm_server), gateway.metrics_text()

    def delta(text0: str, text1: str, name: str, part: str) -> float:
        return metric_sum(text1, f"{name}_{part}") - metric_sum(text0, f"{name}_{part}")

    for what, (v, g) in pairs.items():
        assert delta(v0, v1, v, "count") == delta(g0, g1, g, "count") == 4, what
    for what in ("prompt", "completion"):
        v, g = pairs[what]
        assert delta(v0, v1, v, "sum") == delta(g0, g1, g, "sum") > 0, what
    e2e_v, e2e_g = delta(v0, v1, *pairs["e2e"][:1], "sum"), delta(g0, g1, pairs["e2e"][1], "sum")
    assert e2e_g >= e2e_v > 0 and e2e_g - e2e_v < 4 * 0.25, (e2e_v, e2e_g)
    # The gateway sees a token only after vLLM made it, so its decode span (first to last token
    # relayed) cannot be much longer than vLLM's; on a busy CPU it reads several tokens at once
    # and the span shrinks, so only the upper side is a law.
    tpot_v, tpot_g = delta(v0, v1, pairs["tpot"][0], "sum"), delta(g0, g1, pairs["tpot"][1], "sum")
    assert tpot_v > 0 and 0 < tpot_g <= tpot_v * 1.5, (tpot_v, tpot_g)


def test_prompt_and_completion_text_never_reach_spans_or_logs(vllm_server, otlp_receiver, caplog):
    marker = "zebra-quartz-7731"
    settings = GatewaySettings(upstream_url=vllm_server.url, otlp_endpoint=otlp_receiver.endpoint,
                               capture_logprobs=True)
    caplog.set_level("DEBUG")
    seen = len(otlp_receiver.spans)
    with GatewayServer(settings) as gw:
        c = client(gw.url)
        msg = [{"role": "user", "content": f"Repeat after me: {marker} {marker}"}]
        c.chat.completions.create(model=TINY_MODEL_NAME, messages=msg, max_tokens=8)
        list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=msg, max_tokens=8, stream=True))
        c.completions.create(model=TINY_MODEL_NAME, prompt=f"{marker} says", max_tokens=4)
        with pytest.raises(openai.BadRequestError):  # an error path too: the body is quoted nowhere
            c.chat.completions.create(model=TINY_MODEL_NAME, messages=msg, max_tokens=-1)
        requests.post(f"{gw.url}/v1/chat/completions", data=f'{{"model": "{marker}", bad', timeout=10)
        gw.gateway.tracer_provider.force_flush()
        spans = [s for s in otlp_receiver.spans[seen:] if s.service == settings.service_name]
    assert len(spans) >= 3 * 2  # a server and an upstream call span per answered request
    assert marker.encode() not in b"".join(otlp_receiver.payloads)
    assert not [r for r in caplog.records if marker in r.getMessage()]


def test_tokens_per_minute_are_charged_with_what_vllm_reports(vllm_server, tmp_path):
    """Key a may use 40 tokens a minute: its second request overdraws, its third is refused
    until the overdraft, as vLLM's usage reported it, has refilled. Key b is not held back."""
    from inferwatch.serving.admission import key_id

    limits = tmp_path / "limits.yml"
    limits.write_text(f"default_key: {{tokens_per_minute: 40}}\nkeys: {{{key_id('b')}: {{}}}}\n")
    settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=["a", "b"], limits_file=limits)
    with GatewayServer(settings) as gw:
        a = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="a", max_retries=0)
        b = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="b", max_retries=0)
        ask = {"model": TINY_MODEL_NAME, "messages": MSG, "max_tokens": 16, "extra_body": {"ignore_eos": True}}
        used = [a.chat.completions.create(**ask).usage.total_tokens for _ in range(2)]
        with pytest.raises(openai.RateLimitError) as info:
            a.chat.completions.create(**ask)
        overdraft = sum(used) - 40
        assert overdraft > 0 and "40 tokens per minute" in info.value.body["message"]
        expected_wait = (overdraft + 1) * 60 / 40
        assert abs(int(info.value.response.headers["retry-after"]) - expected_wait) <= 3, (used, expected_wait)
        assert b.chat.completions.create(**ask).usage.completion_tokens == 16
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_admission_rejected_total",
                          limit="tokens_per_minute", scope="key") == 1


@pytest.mark.parametrize("attempt", range(2))
def test_a_non_streaming_client_that_left_while_the_gateway_was_starved_is_a_499(gateway, vllm_server, attempt,
                                                                                 monkeypatch):
    """vLLM's whole answer and the client's disconnect reach the gateway together once its
    loop runs again: the client never got the answer, so it is a 499, not a 200. The order is
    built, not timed: the gateway's loop is held from the moment the request went to vLLM
    (as a starved CPU would hold it), the client leaves once vLLM's own counter says the
    answer is done, and only then does the loop run again."""
    release = threading.Event()
    wait_for_headers = relay_client.UpstreamResponse.headers

    async def starved(self, deadline):  # runs on the gateway's loop, right after the request is written
        release.wait(SLOW_S)
        return await wait_for_headers(self, deadline)

    done = "vllm:request_success_total"
    v0 = metric_sum(settled_vllm_metrics(vllm_server, timeout_s=30), done)
    g0 = gateway.metrics_text()
    monkeypatch.setattr(relay_client.UpstreamResponse, "headers", starved)
    sock = _send(gateway, {"model": TINY_MODEL_NAME, "messages": MSG, "max_tokens": 120, "temperature": 0.0,
                           "ignore_eos": True})
    try:
        eventually(lambda: metric_sum(vllm_metrics(vllm_server), done) > v0, timeout_s=SLOW_S)
        reset(sock)
    finally:
        release.set()
    # vLLM's answer and the hang-up are read in one turn: the answer's usage is counted if the
    # gateway read it first, else nothing (never a part of it)
    assert _one_more_request_was_a_499(gateway, g0) in (0, 120)
