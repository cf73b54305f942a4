"""What is wrong with an answer, through the real gateway in front of a stub that answers
with loops and blanks: the metrics and the record say it, streamed or not; an echoed prompt
is not judged."""

from __future__ import annotations

import pytest
import requests

from inferwatch.serving.features import MemorySink
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import GatewayServer, metric_sum
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def gw():
    with StubUpstream() as stub, GatewayServer(GatewaySettings(upstream_url=stub.url, feature_flush_s=0.05),
                                               feature_sink=MemorySink()) as g:
        yield g


def ask(gw, model: str, stream: bool, **extra) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
    r = requests.post(gw.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text


def last_record(gw, count: int):
    sink = gw.gateway.features.sink
    return eventually(lambda: len(sink.records) >= count and sink.records[-1])


@pytest.mark.parametrize("stream", [True, False])
def test_a_looping_answer_is_repetition_and_a_loop(gw, stream):
    before = len(gw.gateway.features.sink.records)
    ask(gw, "looping", stream, temperature=0.7, top_p=0.95)
    record = last_record(gw, before + 1)
    assert record.loop is True and record.empty is False and record.repetition == pytest.approx(1 - 1 / 37)
    assert (record.temperature_bin, record.top_p_bin, record.max_tokens_bin) == ("0.5-1", "0.9-1", "default")
    text = gw.metrics_text()
    route = {"model": "looping", "route": "/v1/chat/completions"}
    assert metric_sum(text, "inferwatch_gateway_abnormal_outputs_total", kind="loop", **route) >= 1
    assert metric_sum(text, "inferwatch_gateway_output_repetition_ratio_count", **route) >= 1
    assert metric_sum(text, "inferwatch_gateway_sampling_requests_total", model="looping", param="temperature",
                      value="0.5-1") >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_a_whitespace_answer_is_empty(gw, stream):
    before = len(gw.gateway.features.sink.records)
    ask(gw, "blank", stream)
    record = last_record(gw, before + 1)
    assert record.empty is True and record.loop is False and record.repetition is None
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_abnormal_outputs_total", model="blank",
                      kind="empty") >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_of_unicode_whitespace_is_empty_streamed_or_not(gw, stream):
    """U+3000, newline and U+00A0: blank by one test on both paths (str.isspace)."""
    before = len(gw.gateway.features.sink.records)
    ask(gw, "unicode_blank", stream)
    assert last_record(gw, before + 1).empty is True


@pytest.mark.parametrize("stream", [True, False])
def test_a_call_of_a_named_function_is_not_an_empty_answer(gw, stream):
    """tool_choice naming a function: vLLM answers with the call and finish_reason "stop",
    content "" (or no content deltas)."""
    before = len(gw.gateway.features.sink.records)
    ask(gw, "named_tool", stream, tools=[{"type": "function", "function": {"name": "weather", "parameters": {}}}],
        tool_choice={"type": "function", "function": {"name": "weather"}})
    record = last_record(gw, before + 1)
    assert record.empty is False and record.finish_reason == "stop"
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_abnormal_outputs_total", model="named_tool",
                      kind="empty") == 0


def test_an_echoed_prompt_is_not_judged(gw):
    before = len(gw.gateway.features.sink.records)
    ask(gw, "looping", True, echo=True)
    record = last_record(gw, before + 1)
    assert (record.repetition, record.loop, record.empty) == (None, None, None)
