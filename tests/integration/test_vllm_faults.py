"""vLLM dying: killed in the middle of a stream, and gone for the requests after.

Uses its own vLLM process (the shared one must survive for other tests), killed with
SIGKILL on its whole process group, as the OOM killer or a crashed node would.
"""

from __future__ import annotations

import openai
import pytest
import requests

from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME, start_vllm
from tests.support.servers import GatewayServer, metric_sum

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def doomed_vllm(tiny_model, tmp_path_factory):
    server = start_vllm(tiny_model, tmp_path_factory.mktemp("doomed-vllm"))
    yield server
    server.process.stop()


def test_vllm_killed_mid_stream_then_down(doomed_vllm):
    settings = GatewaySettings(upstream_url=doomed_vllm.url, upstream_connect_timeout_s=0.5)
    with GatewayServer(settings) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
        stream = client.completions.create(model=TINY_MODEL_NAME, prompt="a long answer", max_tokens=500,
                                           stream=True, extra_body={"ignore_eos": True})
        received = 0
        with pytest.raises(openai.APIError) as info:
            for _chunk in stream:
                received += 1
                if received == 3:
                    doomed_vllm.process.kill()
        assert 3 <= received < 500
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
