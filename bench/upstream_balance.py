"""Least outstanding against round robin over the same three real vLLM replicas, one of them
slow: time to first token through the gateway, p50 and p95, for each policy in the same run.

The slow replica is a real constraint, not a sleep: vLLM started with ``--max-num-seqs 1``
runs one sequence at a time where the others batch, so under concurrency its queue grows.
Round robin sends it a third of the requests whatever its queue; least outstanding sends
fewer as its requests in flight pile up. The two policies take turns, one gateway each,
run after run, so a slow minute of the machine hurts both alike; the table is the median
over runs.

    python bench/upstream_balance.py [--runs 5] [--requests 120] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferwatch.serving.settings import GatewaySettings  # noqa: E402
from inferwatch.serving.tiny_model import build_tiny_model  # noqa: E402
from inferwatch.serving.vllm_launcher import VLLMConfig, vllm_process  # noqa: E402
from tests.support.servers import GatewayServer, metric_sum  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402

MODEL = "tiny"
POLICIES = ("round_robin", "least_outstanding")


def ttft(url: str, i: int) -> float:
    """Seconds from the request to the first content chunk of a streamed answer."""
    body = {"model": MODEL, "prompt": f"number {i} is", "max_tokens": 24, "stream": True}
    start = time.perf_counter()
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter() - start
        assert first is not None, "no chunk"
        return first


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def one_run(upstream: str, policy: str, n: int, concurrency: int, slow_key: str) -> tuple[float, float, float]:
    """(p50 TTFT, p95 TTFT, share of requests sent to the slow replica)."""
    settings = GatewaySettings(upstream_url=upstream, upstream_balance=policy)
    with GatewayServer(settings) as gw:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: ttft(gw.url, i), range(concurrency)))  # connections and caches warm
            text = gw.metrics_text()
            before = metric_sum(text, "inferwatch_gateway_upstream_endpoint_requests_total", endpoint=slow_key)
            total0 = metric_sum(text, "inferwatch_gateway_upstream_endpoint_requests_total")
            times = list(pool.map(lambda i: ttft(gw.url, i), range(n)))
        text = gw.metrics_text()
        slow = metric_sum(text, "inferwatch_gateway_upstream_endpoint_requests_total", endpoint=slow_key) - before
        total = metric_sum(text, "inferwatch_gateway_upstream_endpoint_requests_total") - total0
    return statistics.median(times), p95(times), slow / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    model = build_tiny_model()
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    logs = Path(tempfile.mkdtemp(prefix="inferwatch-bench-replicas-"))
    procs, urls = [], []
    for port, extra in zip(free_ports(3), ((), (), ("--max-num-seqs", "1"))):
        cfg = VLLMConfig(str(model), MODEL, port=port, dtype="bfloat16", extra_args=extra)
        proc = vllm_process(cfg, logs / f"vllm-{port}.log", env)
        proc.start()
        procs.append(proc)
        urls.append(cfg.base_url)
    try:
        for proc in procs:
            proc.wait_healthy(600)
        slow_key = urls[2].split("//")[1]
        results: dict[str, list[tuple[float, float, float]]] = {p: [] for p in POLICIES}
        for run in range(args.runs):
            for policy in POLICIES if run % 2 == 0 else POLICIES[::-1]:
                results[policy].append(one_run(",".join(urls), policy, args.requests, args.concurrency, slow_key))
    finally:
        for proc in procs:
            proc.stop()

    def med(policy: str, i: int) -> float:
        return statistics.median(r[i] for r in results[policy])

    print(f"three vLLM replicas (one with --max-num-seqs 1), {args.requests} streamed completions at concurrency "
          f"{args.concurrency}, median of {args.runs} runs")
    print(f"{'policy':<20}{'p50 TTFT ms':>13}{'p95 TTFT ms':>13}{'to slow':>9}{'p95 vs RR':>11}")
    for policy in POLICIES:
        print(f"{policy:<20}{med(policy, 0) * 1e3:>13.0f}{med(policy, 1) * 1e3:>13.0f}{med(policy, 2):>9.0%}"
              f"{med(policy, 1) / med('round_robin', 1):>11.2f}")


if __name__ == "__main__":
    main()
