"""vLLM dying: killed in the middle of a stream, and gone for the requests after.

Uses its own vLLM process (the shared one must survive for other tests), killed with
SIGKILL on its whole process group, as the OOM killer or a crashed node would. Its model is
the tiny one with a long context, so the stream can ask for more tokens than vLLM could make
before the kill lands: the kill is mid-stream by construction, not because it came quickly.
"""

from __future__ import annotations

import openai
import pytest
import requests

from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tiny_model import TinyModelSpec, build_tiny_model
from tests.conftest import TINY_MODEL_NAME, model_cache, running_vllms, suite_vllm
from tests.support.servers import GatewayServer, metric_sum
from tests.support.sockets import free_port

pytestmark = pytest.mark.vllm

# Tokens the doomed vLLM's model and context take. The tiny model makes ~2,000 tokens a second
# here at best (fewer as the context grows): a stream this long would run for minutes, and
# the test kills vLLM after its third chunk.
LONG_CONTEXT = 131_072
LONG_STREAM = LONG_CONTEXT - 64  # room for the prompt


@pytest.fixture(scope="module")
def doomed_vllm(tmp_path_factory):
    model = build_tiny_model(model_cache(), name="tiny-llama-long",
                             spec=TinyModelSpec(max_position_embeddings=LONG_CONTEXT))
    with running_vllms([suite_vllm(model, port=free_port(), max_model_len=LONG_CONTEXT)],
                       tmp_path_factory.mktemp("doomed-vllm")) as (server,):
        yield server


def running_in_vllm(server) -> float:
    return metric_sum(requests.get(f"{server.url}/metrics", timeout=10).text, "vllm:num_requests_running")


def test_vllm_killed_mid_stream_then_down(doomed_vllm):
    settings = GatewaySettings(upstream_url=doomed_vllm.url, upstream_connect_timeout_s=0.5,
                               max_tokens_limit=LONG_STREAM)
    with GatewayServer(settings) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
        stream = client.completions.create(model=TINY_MODEL_NAME, prompt="a long answer", max_tokens=LONG_STREAM,
                                           stream=True, extra_body={"ignore_eos": True})
        received = 0
        with pytest.raises(openai.APIError) as info:
            for chunk in stream:
                received += 1
                assert chunk.choices[0].finish_reason is None, "the stream ended before vLLM was killed"
                if received == 3:
                    assert running_in_vllm(doomed_vllm) == 1  # still generating when the kill lands
                    doomed_vllm.process.kill()
        assert 3 <= received < LONG_STREAM
        assert info.value.body["code"] == "stream_interrupted"

        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="stream_interrupted") == 1
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == 1
        assert metric_sum(text, "inferwatch_gateway_requests_in_flight") == 0

        # vLLM stays down: every later request is a clear 503, readiness says so, liveness does not
        with pytest.raises(openai.APIStatusError) as down:
            client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "hi"}])
        assert down.value.status_code == 503 and down.value.body["code"] == "upstream_unavailable"
        assert requests.get(f"{gw.url}/ready", timeout=5).status_code == 503
        assert requests.get(f"{gw.url}/health", timeout=5).status_code == 200
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_upstream_errors_total", reason="connect") == 1
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == 2
