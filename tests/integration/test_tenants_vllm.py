"""Tenants, goodput and budgets against real vLLM, through the official ``openai`` client.

Independent truths: vLLM's ``usage`` in each answer (prompt, completion and cached prompt
tokens: the suite's vLLM runs with ``--enable-prompt-tokens-details`` and its prefix cache
on), and the latencies the client measures itself for goodput.
"""

from __future__ import annotations

import time

import openai
import pytest

from inferwatch.serving.admission import key_id
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME
from tests.support.servers import GatewayServer, metric_sum, samples

pytestmark = pytest.mark.vllm

KEYS = {"search": "sk-search", "chat": "sk-chat", "stray": "sk-stray"}
MSG = [{"role": "user", "content": "Tell me about tenants."}]
# over a block of vLLM's prefix cache (the CPU build's is 128 tokens): the second time, the
# blocks it fills are found in the cache
LONG_PROMPT = "x " * 150


def limits(tmp_path, budget: str = "") -> object:
    f = tmp_path / "limits.yaml"
    f.write_text(f"""
tenants:
  search: {{keys: [{key_id(KEYS['search'])}], critical: true{', budget: ' + budget if budget else ''}}}
  chat: {{keys: [{key_id(KEYS['chat'])}]}}
""")
    return f


def settings_file(tmp_path, ttft_s: float, e2e_s: float) -> object:
    f = tmp_path / "inferwatch.yaml"
    f.write_text(f"""
slos:
  - {{name: availability, sli: availability, objective: 0.999}}
  - {{name: ttft, sli: ttft, objective: 0.99, threshold_s: {ttft_s}}}
  - {{name: e2e, sli: e2e_latency, objective: 0.99, threshold_s: {e2e_s}}}
""")
    return f


def client(gw, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=60)


def tenant_sum(gw, name: str, tenant: str, **labels: str) -> float:
    return metric_sum(gw.metrics_text(), name, tenant=tenant, model=TINY_MODEL_NAME, **labels)


def test_each_tenants_tokens_are_vllms_usage_of_its_answers(vllm_server, tmp_path):
    settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=list(KEYS.values()),
                               limits_file=limits(tmp_path))
    with GatewayServer(settings) as gw:
        usage: dict[str, list] = {t: [] for t in KEYS}
        for i, tenant in enumerate(["search", "chat", "stray", "search", "stray", "chat"]):
            c = client(gw, tenant)
            if i % 2:
                chunks = list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=6 + i,
                                                        stream=True, stream_options={"include_usage": True}))
                usage[tenant].append(chunks[-1].usage)
            else:
                usage[tenant].append(c.completions.create(model=TINY_MODEL_NAME, prompt="hello " * (i + 1),
                                                          max_tokens=4 + i).usage)
        for tenant, label in (("search", "search"), ("chat", "chat"), ("stray", "other")):
            assert tenant_sum(gw, "inferwatch_gateway_tenant_input_tokens_total", label) == \
                sum(u.prompt_tokens for u in usage[tenant])
            assert tenant_sum(gw, "inferwatch_gateway_tenant_output_tokens_total", label) == \
                sum(u.completion_tokens for u in usage[tenant])
            assert tenant_sum(gw, "inferwatch_gateway_tenant_requests_total", label, status_class="2xx") == 2
        # a request without a valid key is anonymous, whatever it claims
        bad = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=2)
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_tenant_requests_total", tenant="anonymous",
                          status_class="4xx") == 1
        tenants = {value for (name, labels) in samples(text) if name == "inferwatch_gateway_tenant_requests_total"
                   for label, value in labels if label == "tenant"}
        assert tenants == {"search", "chat", "other", "anonymous"}


def test_cached_prompt_tokens_are_what_vllm_found_in_its_prefix_cache(vllm_server, tmp_path):
    settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=list(KEYS.values()),
                               limits_file=limits(tmp_path))
    with GatewayServer(settings) as gw:
        c = client(gw, "search")
        prompt = LONG_PROMPT + str(time.time())  # its own blocks: no other test filled them
        answers = [c.completions.create(model=TINY_MODEL_NAME, prompt=prompt, max_tokens=2) for _ in range(2)]
        cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers]
        assert cached[0] == 0 and cached[1] > 0, cached  # the second found the first's blocks
        stream = list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=2, stream=True, stream_options={"include_usage": True}))
        details = stream[-1].usage.prompt_tokens_details
        streamed = details.cached_tokens if details is not None else 0
        assert tenant_sum(gw, "inferwatch_gateway_tenant_cached_input_tokens_total", "search") == \
            sum(cached) + streamed


def test_goodput_counts_requests_within_every_objective_together(vllm_server, tmp_path):
    """With a TTFT objective no stream can meet (5 ms on this CPU) and a generous end to end,
    only unary answers are good (they have no first token of their own to judge); with a
    generous TTFT and an end to end no request meets, none is."""
    for ttft_s, e2e_s, good_streams, good_unary in ((0.005, 300.0, 0, 2), (40.0, 0.01, 0, 0), (40.0, 300.0, 2, 2)):
        settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=list(KEYS.values()),
                                   limits_file=limits(tmp_path), config_file=settings_file(tmp_path, ttft_s, e2e_s))
        with GatewayServer(settings) as gw:
            c = client(gw, "chat")
            tokens = 0
            for _ in range(2):
                chunks = list(c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=8,
                                                        stream=True, stream_options={"include_usage": True}))
                tokens += chunks[-1].usage.completion_tokens if good_streams else 0
                answer = c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=8)
                tokens += answer.usage.completion_tokens if good_unary else 0
            good = tenant_sum(gw, "inferwatch_gateway_goodput_requests_total", "chat")
            assert good == good_streams + good_unary, (ttft_s, e2e_s, good)
            assert tenant_sum(gw, "inferwatch_gateway_goodput_output_tokens_total", "chat") == tokens
            assert tenant_sum(gw, "inferwatch_gateway_tenant_requests_total", "chat", status_class="2xx") == 4


def test_a_spent_budget_is_an_openai_quota_error_until_the_period_resets(vllm_server, tmp_path):
    settings = GatewaySettings(upstream_url=vllm_server.url, api_keys=list(KEYS.values()),
                               limits_file=limits(tmp_path, "{tokens: 60, period: month}"))
    with GatewayServer(settings) as gw:
        c = client(gw, "search")
        spent = 0
        with pytest.raises(openai.RateLimitError) as info:
            for _ in range(20):
                spent += c.chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=8).usage.total_tokens
        assert 60 <= spent < 60 + 40, spent  # refused once spent; the last admitted may overshoot
        error = info.value.body
        assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
        assert "per month (UTC)" in error["message"] and f"{spent:,} tokens used" in error["message"]
        assert int(info.value.response.headers["retry-after"]) > 0
        assert client(gw, "chat").chat.completions.create(model=TINY_MODEL_NAME, messages=MSG, max_tokens=2)
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_tenant_budget_used", tenant="search") == spent
        assert metric_sum(text, "inferwatch_gateway_tenant_budget_limit", tenant="search", critical="true") == 60
