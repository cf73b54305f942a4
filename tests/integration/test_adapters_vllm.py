"""LoRA adapters through the gateway, against the suite's vLLM, which serves the tiny model and
its adapter (tests/conftest.py), through the official ``openai`` client.

Independent truths: vLLM's own model list (the adapter's ``parent``), its answers (the
adapter changes what greedy decoding says, so it was applied), its ``usage``, and its
counters, which count an adapter's tokens under the base model's ``model_name``, as the
gateway's per-model series must for a base model's SLOs to take in its adapters' traffic.
"""

from __future__ import annotations

import openai
import pytest
import requests

from inferwatch.serving.admission import key_id
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tiny_model import ADAPTER_NAME
from tests.conftest import TINY_MODEL_NAME
from tests.integration.test_gateway_vllm import settled_vllm_metrics
from tests.support.servers import GatewayServer, metric_sum, samples

pytestmark = pytest.mark.vllm

KEY = "sk-lora-team"
PROMPT = "The quick brown fox"


def limits(tmp_path) -> object:
    f = tmp_path / "limits.yaml"
    f.write_text(f"tenants:\n  lora-team: {{keys: [{key_id(KEY)}]}}\n")
    return f


def test_the_gateway_lists_the_adapter_with_its_base(vllm_server):
    with GatewayServer(GatewaySettings(upstream_url=vllm_server.url)) as gw:
        listed = {m["id"]: m for m in requests.get(f"{gw.url}/v1/models", timeout=10).json()["data"]}
    direct = {m["id"]: m for m in requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]}
    assert listed.keys() == direct.keys() == {TINY_MODEL_NAME, ADAPTER_NAME}
    assert listed[ADAPTER_NAME]["parent"] == direct[ADAPTER_NAME]["parent"] == TINY_MODEL_NAME


def test_an_adapters_traffic_counts_under_its_base_and_as_itself(vllm_server, tmp_path):
    settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=[KEY], limits_file=limits(tmp_path))
    with GatewayServer(settings) as gw:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0, timeout=60)
        v0, g0 = settled_vllm_metrics(vllm_server), gw.metrics_text()
        greedy = {"temperature": 0.0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
        base = c.completions.create(model=TINY_MODEL_NAME, prompt=PROMPT, **greedy)
        adapted = [c.completions.create(model=ADAPTER_NAME, prompt=PROMPT, **greedy)]
        chunks = list(c.chat.completions.create(model=ADAPTER_NAME, messages=[{"role": "user", "content": PROMPT}],
                                                stream=True, stream_options={"include_usage": True}, **greedy))
        # the adapter was applied: the same greedy prompt says something else
        assert adapted[0].choices[0].text != base.choices[0].text
        assert adapted[0].model == ADAPTER_NAME
        usages = [a.usage for a in adapted] + [chunks[-1].usage]
        v1, g1 = settled_vllm_metrics(vllm_server), gw.metrics_text()

    def delta(name: str, **labels: str) -> float:
        return metric_sum(g1, name, **labels) - metric_sum(g0, name, **labels)

    adapter_out = sum(u.completion_tokens for u in usages)
    all_out = adapter_out + base.usage.completion_tokens
    # vLLM counts all of it under the base model, and so do the gateway's per-model series
    assert metric_sum(v1, "vllm:generation_tokens_total", model_name=TINY_MODEL_NAME) - \
        metric_sum(v0, "vllm:generation_tokens_total", model_name=TINY_MODEL_NAME) == all_out
    assert delta("inferwatch_gateway_output_tokens_total", model=TINY_MODEL_NAME) == all_out
    assert delta("inferwatch_gateway_requests_total", model=TINY_MODEL_NAME, status_class="2xx") == 3
    assert delta("inferwatch_gateway_tenant_output_tokens_total", tenant="lora-team", model=TINY_MODEL_NAME) == all_out
    # the adapter on its own, beside its base
    assert delta("inferwatch_gateway_adapter_requests_total", model=TINY_MODEL_NAME, adapter=ADAPTER_NAME,
                 status_class="2xx") == 2
    assert delta("inferwatch_gateway_adapter_output_tokens_total", model=TINY_MODEL_NAME,
                 adapter=ADAPTER_NAME) == adapter_out
    assert delta("inferwatch_gateway_adapter_input_tokens_total", model=TINY_MODEL_NAME,
                 adapter=ADAPTER_NAME) == sum(u.prompt_tokens for u in usages)
    # the adapter's name is a label value of the adapter series only: every other model label is a base's
    models = {value for (name, labels) in samples(g1) if not name.startswith("inferwatch_gateway_adapter_")
              for label, value in labels if label == "model"}
    assert ADAPTER_NAME not in models


def test_an_adapter_request_is_held_to_its_bases_context(vllm_server):
    """vLLM lists an adapter without a context length: the gateway takes its base's and
    refuses what could not fit before vLLM sees it."""
    with GatewayServer(GatewaySettings(upstream_url=vllm_server.url)) as gw:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as refused:
            c.completions.create(model=ADAPTER_NAME, prompt=PROMPT, max_tokens=vllm_server.config.max_model_len + 1)
        # the gateway's words, with the base's context as the ceiling
        assert f"between 1 and {vllm_server.config.max_model_len} for model '{ADAPTER_NAME}'" in str(refused.value)
