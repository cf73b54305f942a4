"""The gateway in front of real vLLM (CPU build, tiny model), driven by the official client.

Independent truths: vLLM answering directly (same greedy request, same text), vLLM's own
counters (`vllm:prompt_tokens_total`, ...), and vLLM's own `llm_request` span.
"""

from __future__ import annotations

import secrets
import subprocess
import time

import openai
import pytest
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from inferwatch.serving.features import MemorySink
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tiny_model import ADAPTER_NAME
from tests.conftest import TINY_MODEL_NAME
from tests.support.servers import GatewayServer, metric_sum
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm

MSG = [{"role": "user", "content": "Tell me about time to first token."}]
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture(scope="module")
def gateway(vllm_server, otlp_receiver, sink):
    settings = GatewaySettings(upstream_url=vllm_server.url, otlp_endpoint=otlp_receiver.endpoint,
                               feature_flush_s=0.05, variant="v1")
    with GatewayServer(settings, feature_sink=sink) as gw:
        yield gw


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def vllm_metrics(vllm_server) -> str:
    return requests.get(f"{vllm_server.url}/metrics", timeout=10).text


def settled_vllm_metrics(vllm_server, timeout_s: float = 10.0) -> str:
    """vLLM's exposition once nothing runs and its token counters stopped moving.

    vLLM updates counters from its engine loop a moment after a response is sent, so a
    baseline read right after another test's request could miss that request's tokens.
    """
    keys = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count")
    deadline = time.monotonic() + timeout_s
    previous = None
    while True:
        text = vllm_metrics(vllm_server)
        current = tuple(metric_sum(text, k) for k in keys)
        if current == previous and metric_sum(text, "vllm:num_requests_running") == 0:
            return text
        if time.monotonic() > deadline:
            raise AssertionError("vLLM's counters did not settle")
        previous = current
        time.sleep(0.3)


def test_models_endpoint_lists_vllm_models(gateway):
    assert [m.id for m in client(gateway.url).models.list()] == [TINY_MODEL_NAME, ADAPTER_NAME]


def test_non_streaming_answers_equal_vllm_direct(gateway, vllm_server):
    via, direct = client(gateway.url), client(vllm_server.url)
    a = via.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=12, **GREEDY)
    b = direct.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=12, **GREEDY)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.usage.completion_tokens == 12

    c = via.completions.create(model=TINY_MODEL_NAME, prompt="Grafana draws", max_tokens=8, **GREEDY)
    d = direct.completions.create(model=TINY_MODEL_NAME, prompt="Grafana draws", max_tokens=8, **GREEDY)
    assert c.choices[0].text == d.choices[0].text and c.usage.completion_tokens == 8


@pytest.mark.parametrize("include_usage", [False, True])
def test_streaming_chunks_equal_vllm_direct(gateway, vllm_server, include_usage):
    def run(base_url):
        stream = client(base_url).chat.completions.create(
            model=TINY_MODEL_NAME, messages=MSG, max_tokens=16, stream=True,
            stream_options={"include_usage": True} if include_usage else None, **GREEDY)
        return list(stream)

    text = lambda chunks: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # noqa: E731
    for _ in range(3):
        # vLLM merges deltas when its reader lags, so on a loaded machine either run may come
        # in fewer chunks; the exact check, every cut of a recorded vLLM stream, is
        # tests/serving/test_relay_replay.py
        via, direct = run(gateway.url), run(vllm_server.url)
        assert text(via) == text(direct) and text(via)
        if len(via) == len(direct):  # chunk by chunk, nothing merged, nothing added
            break
    else:
        raise AssertionError(f"the gateway relayed {len(via)} chunks where vLLM sent {len(direct)}, three times")
    usage_chunks = [c for c in via if not c.choices]
    if include_usage:
        assert len(usage_chunks) == 1 and usage_chunks[0].usage.completion_tokens == 16
    else:
        assert usage_chunks == [] and all(c.usage is None for c in via)


def test_token_counters_equal_vllm_counters(gateway, vllm_server):
    names = {"vllm:prompt_tokens_total": "inferwatch_gateway_input_tokens_total",
             "vllm:generation_tokens_total": "inferwatch_gateway_output_tokens_total"}
    v0, g0 = settled_vllm_metrics(vllm_server), gateway.metrics_text()
    c = client(gateway.url)
    for i in range(3):
        c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=5 + i)
        list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=7 + i, stream=True))
        c.completions.create(model=TINY_MODEL_NAME, prompt="x " * (10 + i), max_tokens=4)
        list(c.completions.create(model=TINY_MODEL_NAME, prompt="y " * (3 + i), max_tokens=9, stream=True))
    g1 = gateway.metrics_text()  # the gateway counts before a client sees the end of its answer
    v1 = settled_vllm_metrics(vllm_server)
    deltas = {v: (metric_sum(v1, v, model_name=TINY_MODEL_NAME) - metric_sum(v0, v, model_name=TINY_MODEL_NAME),
                  metric_sum(g1, g, model=TINY_MODEL_NAME) - metric_sum(g0, g, model=TINY_MODEL_NAME))
              for v, g in names.items()}
    for vllm_name, (vllm_delta, gw_delta) in deltas.items():
        assert vllm_delta > 0 and gw_delta == vllm_delta, (vllm_name, vllm_delta, gw_delta)


def test_gateway_ttft_is_at_least_vllm_ttft(gateway, vllm_server):
    c = client(gateway.url)
    for _ in range(5):
        v0, g0 = settled_vllm_metrics(vllm_server), gateway.metrics_text()
        list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=8, stream=True))
        g1 = gateway.metrics_text()
        v1 = settled_vllm_metrics(vllm_server)
        vllm_n = (metric_sum(v1, "vllm:time_to_first_token_seconds_count")
                  - metric_sum(v0, "vllm:time_to_first_token_seconds_count"))
        gw_n = (metric_sum(g1, "inferwatch_gateway_time_to_first_token_seconds_count")
                - metric_sum(g0, "inferwatch_gateway_time_to_first_token_seconds_count"))
        assert vllm_n == gw_n == 1
        vllm_ttft = (metric_sum(v1, "vllm:time_to_first_token_seconds_sum")
                     - metric_sum(v0, "vllm:time_to_first_token_seconds_sum"))
        gw_ttft = (metric_sum(g1, "inferwatch_gateway_time_to_first_token_seconds_sum")
                   - metric_sum(g0, "inferwatch_gateway_time_to_first_token_seconds_sum"))
        assert gw_ttft >= vllm_ttft > 0


@pytest.mark.parametrize("stream", [False, True])
def test_trace_joins_gateway_and_vllm_spans(gateway, otlp_receiver, stream):
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    resp = client(gateway.url).chat.completions.create(
        model=TINY_MODEL_NAME, messages=MSG, max_tokens=6, stream=stream,
        extra_body={"ignore_eos": True},  # 6 tokens, "length": sampled, the tiny model can end sooner
        extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    chunks = list(resp) if stream else [resp]
    names = {"POST /v1/chat/completions", f"chat {TINY_MODEL_NAME}", "llm_request"}
    spans = otlp_receiver.wait_for(
        lambda all_spans: (t := [s for s in all_spans if s.trace_id == trace_id]) and names <= {s.name for s in t} and t)
    by_name = {s.name: s for s in spans}
    server, call, vllm_span = by_name["POST /v1/chat/completions"], by_name[f"chat {TINY_MODEL_NAME}"], by_name["llm_request"]
    assert server.parent_span_id == parent  # the client's context was continued
    assert server.service == "inferwatch-gateway" and vllm_span.service != "inferwatch-gateway"
    assert call.parent_span_id == server.span_id
    assert vllm_span.parent_span_id == call.span_id  # vLLM's engine span hangs under our upstream call

    assert server.attributes["gen_ai.request.model"] == TINY_MODEL_NAME
    assert server.attributes["gen_ai.usage.output_tokens"] == 6
    assert server.attributes["gen_ai.usage.output_tokens"] == vllm_span.attributes["gen_ai.usage.completion_tokens"]
    assert server.attributes["gen_ai.usage.input_tokens"] == vllm_span.attributes["gen_ai.usage.prompt_tokens"]
    assert server.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert server.attributes["http.response.status_code"] == 200
    assert ("first_token" in server.events) is stream and "preprocessed" in server.events
    # the upstream call lasts until the answer is relayed: for a stream, past its first token
    assert call.end_ns <= server.end_ns and (not stream or call.end_ns > server.event_ns["first_token"])
    assert chunks


def test_exemplars_link_latency_buckets_to_traces(gateway, otlp_receiver):
    list(client(gateway.url).chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=4, stream=True))
    text = requests.get(f"{gateway.url}/metrics", headers={"accept": "application/openmetrics-text"}, timeout=5).text
    lines = [line for line in text.splitlines()
             if line.startswith("inferwatch_gateway_time_to_first_token_seconds_bucket") and "trace_id" in line]
    assert lines, "no exemplar on the TTFT histogram"
    trace_id = lines[-1].split('trace_id="')[1][:32]
    otlp_receiver.wait_for(lambda spans: [s for s in spans if s.trace_id == trace_id and s.name == "llm_request"])


def test_feature_records_match_responses(gateway, sink):
    t0 = time.time()
    c = client(gateway.url)
    # ignore_eos: the tiny model samples its end token now and then, and the checks need 5 and 7
    r = c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=5, extra_body={"ignore_eos": True})
    chunks = list(c.completions.create(model=TINY_MODEL_NAME, prompt="abc", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    mine = lambda: sorted((r for r in sink.records if r.started_at >= t0), key=lambda r: r.started_at)  # noqa: E731
    eventually(lambda: len(mine()) >= 2)
    unary, streamed = mine()
    assert (unary.route, unary.stream, unary.status, unary.variant) == ("chat", False, 200, "v1")
    assert (unary.prompt_tokens, unary.completion_tokens) == (r.usage.prompt_tokens, 5)
    assert unary.ttft_s is None and unary.finish_reason == "length" and unary.mean_logprob is None
    assert streamed.prompt_tokens == chunks[-1].usage.prompt_tokens and streamed.completion_tokens == 7
    # tokens that reach the gateway in one TCP read share a timestamp, so TPOT may be 0
    assert streamed.ttft_s > 0 and streamed.tpot_s >= 0
    # the last token (first + 6 gaps of tpot) comes before the end; how long [DONE] takes after
    # it is the machine's moment (47 vs 57 ms in a loaded clean run), not something to pin
    assert streamed.ttft_s + 6 * streamed.tpot_s <= streamed.e2e_s + 1e-6
    assert streamed.finished_at - streamed.started_at == pytest.approx(streamed.e2e_s, abs=1e-5)


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_call_is_not_an_empty_answer(gateway, sink, stream):
    """vLLM's own answer to tool_choice naming a function: the call, finish_reason "stop" (not
    "tool_calls") and no text. The gateway must judge it an answer, not an empty one."""
    t0 = time.time()
    empties = lambda: metric_sum(gateway.metrics_text(), "inferwatch_gateway_abnormal_outputs_total",  # noqa: E731
                                 model=TINY_MODEL_NAME, kind="empty")
    before = empties()
    kwargs = dict(model=TINY_MODEL_NAME, messages=MSG, max_tokens=40, tools=[WEATHER],
                  tool_choice={"type": "function", "function": {"name": "weather"}}, **GREEDY)
    if stream:
        chunks = list(client(gateway.url).chat.completions.create(stream=True, **kwargs))
        calls = [t for ch in chunks for c in ch.choices for t in (c.delta.tool_calls or ())]
        text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
        finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason][-1]
    else:
        (choice,) = client(gateway.url).chat.completions.create(**kwargs).choices
        calls, text, finish = choice.message.tool_calls or [], choice.message.content or "", choice.finish_reason
    assert calls and calls[0].function.name == "weather" and text.strip() == "" and finish != "tool_calls"
    record = eventually(lambda: [r for r in sink.records if r.started_at >= t0 and r.stream is stream])[-1]
    assert record.empty is False and record.finish_reason == finish
    assert empties() == before


def joined(chunks: list[list[dict]]) -> dict:
    """Per choice index: the whole text (chat: content) and the last finish reason seen."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk:
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            entry = out.setdefault(c["index"], {"text": "", "finish_reason": None})
            entry["text"] += piece or ""
            entry["finish_reason"] = c.get("finish_reason") or entry["finish_reason"]
    return out


@pytest.mark.parametrize("route, stream", [("chat", False), ("chat", True), ("completions", False),
                                           ("completions", True)])
def test_logprob_capture_is_invisible_to_the_client(gateway, vllm_server, route, stream):
    capture_sink = MemorySink()
    settings = GatewaySettings(upstream_url=vllm_server.url, capture_logprobs=True, feature_flush_s=0.05)
    with GatewayServer(settings, feature_sink=capture_sink) as capturing:
        def ask(base_url, **extra):
            c = client(base_url)
            if route == "chat":
                return c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=6, stream=stream,
                                                 **GREEDY, **extra)
            return c.completions.create(model=TINY_MODEL_NAME, prompt="abc", max_tokens=6, stream=stream,
                                        **GREEDY, **extra)

        def payload(resp):
            chunks = list(resp) if stream else [resp]
            return [[c.model_dump(exclude={"message": {"annotations"}})
                     for c in ch.choices] for ch in chunks]

        with_capture, without = payload(ask(capturing.url)), payload(ask(gateway.url))
        if stream:
            # Asked for logprobs, vLLM streams one chunk per token, even a token that ends inside a
            # UTF-8 character (an empty text, completed by a later chunk); without, it holds such
            # bytes back and sends them with the next. Chunk boundaries may differ then; what the
            # client reads may not: every choice's text and end, and no logprobs anywhere.
            assert joined(with_capture) == joined(without)
        else:
            assert with_capture == without
        assert all(choice["logprobs"] is None for chunk in with_capture for choice in chunk)

        # truth: the same greedy request asking vLLM for logprobs directly
        truth = ask(vllm_server.url, logprobs=True if route == "chat" else 0)
        chunks = list(truth) if stream else [truth]
        if route == "chat":
            values = [t.logprob for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.content]
        else:
            values = [v for ch in chunks for c in ch.choices if c.logprobs for v in c.logprobs.token_logprobs]
        eventually(lambda: capture_sink.records)
        assert len(values) == 6
        assert capture_sink.records[0].mean_logprob == pytest.approx(sum(values) / 6, rel=1e-6)


def test_upstream_timeout_with_real_vllm(vllm_server):
    settings = GatewaySettings(upstream_url=vllm_server.url, upstream_timeout_s=0.05)
    with GatewayServer(settings) as gw:
        # four choices of 400 tokens take vLLM about a second: a pause of the test process (its
        # garbage collector, with every earlier test's objects on the heap) must not let the
        # answer arrive before the 50 ms timer gets to run
        with pytest.raises(openai.APIStatusError) as info:
            client(gw.url).completions.create(model=TINY_MODEL_NAME, prompt="slow", max_tokens=400, n=4,
                                              extra_body={"ignore_eos": True})
        assert info.value.status_code == 504 and info.value.body["code"] == "upstream_timeout"
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_errors_total", reason="timeout") == 1


def test_promtool_accepts_the_exposition(gateway):
    list(client(gateway.url).chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=3, stream=True))
    text = requests.get(f"{gateway.url}/metrics", timeout=5).text
    assert "inferwatch_gateway_inter_token_latency_seconds_bucket" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr


def test_openmetrics_exposition_parses(gateway):
    """promtool 2.42 lints only the text format; OpenMetrics (with exemplars) is checked by
    the strict OpenMetrics parser, which rejects a missing # EOF or malformed exemplar."""
    resp = requests.get(f"{gateway.url}/metrics", headers={"accept": "application/openmetrics-text"}, timeout=5)
    assert resp.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(resp.text)}
    ttft = families["inferwatch_gateway_time_to_first_token_seconds"]
    assert ttft.type == "histogram" and any(s.exemplar for s in ttft.samples)
