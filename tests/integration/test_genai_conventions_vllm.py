"""OpenTelemetry's GenAI conventions at the gateway, against the suite's vLLM, through the
official ``openai`` client: the response attributes of its spans, and the ``gen_ai.*``
metrics behind ``OTEL_SEMCONV_STABILITY_OPT_IN``, received by a real OTLP/HTTP receiver.

Independent truths: the answers the client got (their ids, models and usage), the time the
client measured itself, and the conventions' names and bucket advice as the
``opentelemetry-semantic-conventions`` package and the specification state them.
"""

from __future__ import annotations

import time

import openai
import pytest
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as names

from inferwatch.serving.genai_metrics import DURATION_BUCKETS, OPT_IN, SCHEMA_URL, TOKEN_BUCKETS, TTFT_BUCKETS
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tiny_model import ADAPTER_NAME
from tests.conftest import TINY_MODEL_NAME
from tests.support.otlp import OTLPReceiver
from tests.support.servers import GatewayServer

pytestmark = pytest.mark.vllm

MSG = [{"role": "user", "content": "Which conventions?"}]
TO_LENGTH = {"extra_body": {"ignore_eos": True}}  # every answer ends at max_tokens, finish reason "length"
CLIENT_SPAN = 3  # SpanKind.CLIENT in OTLP


@pytest.fixture
def receiver():
    r = OTLPReceiver()
    yield r
    r.close()


def points(receiver: OTLPReceiver, name: str) -> list[tuple[dict, object]]:
    return receiver.histograms().get(name, [])


def test_opted_in_the_gateway_exports_genai_metrics_of_what_vllm_answered(vllm_server, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", f"http, {OPT_IN}")
    settings = GatewaySettings(upstream_url=vllm_server.url, otlp_endpoint=receiver.endpoint, trace_sample_ratio=1.0)
    with GatewayServer(settings) as gw:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60)
        unary = c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=6, **TO_LENGTH)
        adapted = c.completions.create(model=ADAPTER_NAME, prompt="hello", max_tokens=5, **TO_LENGTH)
        t0 = time.perf_counter()
        client_ttft = None
        chunks = []
        for chunk in c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=7, stream=True,
                                               stream_options={"include_usage": True}, **TO_LENGTH):
            if client_ttft is None and chunk.choices and chunk.choices[0].delta.content:
                client_ttft = time.perf_counter() - t0
            chunks.append(chunk)
        with pytest.raises(openai.BadRequestError):  # vLLM refuses it: the request reached vLLM and failed
            c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=4, temperature=-1)
    # the gateway stopped: its meter provider exported what it held
    answered = [unary.usage, adapted.usage, chunks[-1].usage]
    duration = points(receiver, names.GEN_AI_SERVER_REQUEST_DURATION)
    assert sum(p.count for _, p in duration) == 4
    failed = [(attrs, p) for attrs, p in duration if "error.type" in attrs]
    assert [(attrs["error.type"], p.count) for attrs, p in failed] == [("400", 1)]
    assert "gen_ai.response.model" not in failed[0][0]
    ok = {(a["gen_ai.operation.name"], a["gen_ai.request.model"], a["gen_ai.response.model"]): p.count
          for a, p in duration if "error.type" not in a}
    assert ok == {("chat", TINY_MODEL_NAME, TINY_MODEL_NAME): 2, ("text_completion", ADAPTER_NAME, ADAPTER_NAME): 1}
    assert {a["gen_ai.provider.name"] for a, _ in duration} == {"vllm"}
    assert all(list(p.explicit_bounds) == list(DURATION_BUCKETS) for _, p in duration)

    tokens = points(receiver, names.GEN_AI_CLIENT_TOKEN_USAGE)
    by_type = {kind: sum(p.sum for a, p in tokens if a["gen_ai.token.type"] == kind) for kind in ("input", "output")}
    assert by_type == {"input": sum(u.prompt_tokens for u in answered),
                       "output": sum(u.completion_tokens for u in answered)}
    assert {(a["server.address"], a["server.port"]) for a, _ in tokens} == {("127.0.0.1", vllm_server.config.port)}
    assert all(list(p.explicit_bounds) == list(TOKEN_BUCKETS) for _, p in tokens)

    ttft = points(receiver, names.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    assert [p.count for _, p in ttft] == [1]  # the stream's: a unary answer has no first token of its own
    assert 0 < ttft[0][1].sum <= client_ttft  # the client's own clock saw it later, through the network
    assert list(ttft[0][1].explicit_bounds) == list(TTFT_BUCKETS)
    assert sum(p.count for _, p in points(receiver, names.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN)) == 1
    calls = points(receiver, names.GEN_AI_CLIENT_OPERATION_DURATION)
    assert sum(p.count for _, p in calls) == 4
    assert sum(p.sum for _, p in calls) <= sum(p.sum for _, p in duration)  # a part of each request's time
    scopes = {sm.schema_url for req in receiver.metric_requests for rm in req.resource_metrics
              for sm in rm.scope_metrics}
    assert scopes == {SCHEMA_URL}

    # the client spans of the calls to vLLM say what each answer said of itself
    spans = {s.attributes.get("gen_ai.response.id"): s for s in receiver.spans if s.kind == CLIENT_SPAN}
    for answer, usage, model in ((unary, unary.usage, TINY_MODEL_NAME), (adapted, adapted.usage, ADAPTER_NAME),
                                 (chunks[0], chunks[-1].usage, TINY_MODEL_NAME)):
        span = spans[answer.id]
        assert span.attributes["gen_ai.response.model"] == model
        assert span.attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
        assert span.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
        assert span.attributes["gen_ai.response.finish_reasons"] == ["length"]


def test_without_the_opt_in_no_metrics_are_exported(vllm_server, receiver, monkeypatch):
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    settings = GatewaySettings(upstream_url=vllm_server.url, otlp_endpoint=receiver.endpoint, trace_sample_ratio=1.0)
    with GatewayServer(settings) as gw:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60)
        c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=3)
    receiver.wait_for(lambda spans: [s for s in spans if s.kind == CLIENT_SPAN])
    assert receiver.metric_requests == []
