"""Requests through the gateway (real vLLM) show up in the drift service's windows; with the
drift service down the gateway keeps answering and counts what it could not deliver."""

from __future__ import annotations

import openai
import pytest
import requests

from inferwatch.drift.service.app import DriftSettings, create_app as create_drift_app
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME
from tests.support.servers import AppServer, GatewayServer, metric_sum
from tests.support.sockets import free_port
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm
MSG = [{"role": "user", "content": "drift"}]


def ask(gw, n: int) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    for i in range(n):
        # ignore_eos: the tiny random model may end early with "stop"; every answer ends at its length.
        # logprobs: a token whose bytes end inside a UTF-8 character streams as an empty text,
        # which only its logprobs tell from an empty delta (serving/sse.py); the random model's
        # answer can be all such tokens, and then has no first token (a clean run saw it once)
        if i % 2:
            list(client.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=4 + i, stream=True,
                                                logprobs=True, extra_body={"ignore_eos": True}))
        else:
            client.completions.create(model=TINY_MODEL_NAME, prompt="x " * (i + 1), max_tokens=3,
                                      extra_body={"ignore_eos": True})


def test_gateway_records_reach_drift_windows(vllm_server, tmp_path):
    drift = create_drift_app(DriftSettings(db_path=str(tmp_path / "d.sqlite3"), token="t0k"))
    with AppServer(drift) as service:
        settings = GatewaySettings(upstream_url=vllm_server.url, drift_url=service.url, drift_token="t0k",
                                   feature_flush_s=0.05, variant="v7")
        with GatewayServer(settings) as gw:
            ask(gw, 6)

            def drift_segments():
                segs = requests.get(service.url + "/v1/drift", timeout=5).json()["segments"]
                return segs if segs and segs[0]["window_records"] == 6 else None

            segs = eventually(drift_segments)
            assert [(s["model"], s["variant"], s["window_records"]) for s in segs] == [(TINY_MODEL_NAME, "v7", 6)]
            assert metric_sum(gw.metrics_text(), "inferwatch_gateway_feature_records_total", outcome="sent") == 6
            state = drift.state.drift
            current = state.ingest.current((TINY_MODEL_NAME, "v7"))
            assert current["ttft_s"].total == 3  # only the streamed requests have a TTFT
            assert current["prompt_tokens"].total == 6 and current["finish_reason"].counts[1] == 6  # "length"


def test_gateway_keeps_serving_when_drift_is_down(vllm_server):
    settings = GatewaySettings(upstream_url=vllm_server.url, drift_url=f"http://127.0.0.1:{free_port()}",
                               feature_flush_s=0.05)
    with GatewayServer(settings) as gw:
        ask(gw, 4)
        # the records wait for the drift service (retried with backoff), none is dropped
        eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_delivery_failures_total",
                                      kind="features") >= 2)
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_feature_queue_depth") == 4
        assert metric_sum(text, "inferwatch_gateway_feature_records_total", outcome="dropped_send_error") == 0
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx") == 4
