"""The vLLM metrics that inferwatch's rules and dashboards read, as vLLM exports them.

vLLM declares these itself (``vllm/v1/metrics/loggers.py`` in the pinned vLLM); they are
listed here so the alert rules and dashboards name them from one place, and a test checks
every one against the ``/metrics`` of a real vLLM server, so a rename in a vLLM upgrade
fails the tests instead of silencing an alert. Labels: ``model_name``, ``engine``.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]

VLLM_METRICS: dict[str, Kind] = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",  # 0..1 despite the name
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",  # label finished_reason
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
}
