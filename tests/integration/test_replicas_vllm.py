"""One variant over real vLLM replicas behind the gateway: a slow replica gets fewer
requests than its twin, and a replica killed under load fails only the requests it had, new
requests avoid it at once and come back to it after it restarts.

The replicas: the session's vLLM, a twin of it, and one started with ``--max-num-seqs 1``
(the balancer's choice is all that differs), started as every vLLM of the suite
(tests/conftest.py).

``--max-num-seqs 1`` alone does not make a replica slower on a machine whose CPUs are the
bottleneck: three vLLMs on two shared cores, measured, it finished its requests as fast as
the batching ones (0–1 running in vLLM's own gauge while they ran 4–6) and got as many. So
the share test also throttles its engine core as a CPU-limited pod is throttled
(tests/support/throttle.py), and its gateway runs in a process of its own, as in
production: a gateway inside the suite's process, late in a full run, answered so late that
every replica looked equally busy (the throttled replica got 23–30 of 64–72 requests in
three full runs, 16–18 alone). The Makefile runs this module in the first, fresh pytest
process with the other timing tests.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from inferwatch.common.supervise import ManagedProcess
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME, VLLM_STARTUP_TIMEOUT_S, RunningVLLM, running_vllms, suite_vllm
from tests.support.servers import GatewayServer, metric_sum
from tests.support.sockets import free_port
from tests.support.throttle import descendants, throttled
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def replicas(vllm_server, tiny_model, tmp_path_factory):
    """The session's vLLM, a twin, and one that runs a single sequence at a time. The two
    start together (not the session's ``second_vllm`` and then this one): this module runs
    in the timing tests' own pytest process, where nothing else uses a second vLLM, and two
    starts overlap on two cores (~50 s, against ~70 s one after the other)."""
    twin = suite_vllm(tiny_model, port=free_port())
    single = suite_vllm(tiny_model, port=free_port(), extra_args=("--max-num-seqs", "1"))
    with running_vllms([twin, single], tmp_path_factory.mktemp("replicas")) as started:
        yield [vllm_server, *started]


def endpoint(server: RunningVLLM) -> str:
    return f"127.0.0.1:{server.config.port}"


def sent_to(gw: GatewayServer, server: RunningVLLM) -> float:
    return metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_endpoint_requests_total",
                      endpoint=endpoint(server))


def holds(gw: GatewayServer, server: RunningVLLM, n: int) -> bool:
    """Whether the gateway has ``n`` requests or more at the replica now."""
    return metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_endpoint_requests_in_flight",
                      endpoint=endpoint(server)) >= n


def is_up(gw: GatewayServer, server: RunningVLLM) -> bool:
    return metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_endpoint_up", endpoint=endpoint(server)) == 1


def stream(gw: GatewayServer, i: int) -> tuple[float, float, bool]:
    """(start, end, whole answer) of a streamed chat answer."""
    start = time.monotonic()
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": f"count to {i}"}],
            "max_tokens": 24, "stream": True}
    try:
        r = requests.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
        whole = r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") and "error" not in r.text
    except requests.RequestException:
        whole = False
    return start, time.monotonic(), whole


@contextmanager
def gateway_process(upstreams: list[RunningVLLM], logs: Path) -> Iterator[str]:
    """`inferwatch gateway` in a process of its own over ``upstreams``; yields its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")} | {
        "PYTHONUNBUFFERED": "1", "INFERWATCH_GATEWAY_UPSTREAM_URL": ",".join(s.url for s in upstreams)}
    url = f"http://127.0.0.1:{port}"
    proc = ManagedProcess("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--host", "127.0.0.1",
                                      "--port", str(port)], log_path=logs / "gateway.log", env=env,
                          health_url=url + "/health")
    proc.start()
    try:
        proc.wait_healthy(60)
        yield url
    finally:
        proc.stop()


def endpoint_requests(gateway_url: str, server: RunningVLLM) -> float:
    return metric_sum(requests.get(gateway_url + "/metrics", timeout=10).text,
                      "inferwatch_gateway_upstream_endpoint_requests_total", endpoint=endpoint(server))


def test_a_slow_replica_gets_fewer_requests_than_its_twin(replicas, tmp_path):
    """The second vLLM against the slow one, alone behind a gateway: twins but for the
    constraint (the session's vLLM, which exports spans, sits this one out)."""
    _, b, single = replicas
    with gateway_process([b, single], tmp_path) as url:
        body = {"model": TINY_MODEL_NAME, "prompt": "one two three", "max_tokens": 96, "ignore_eos": True}
        with throttled(descendants(single.process.pid), run_s=0.025), ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: requests.post(url + "/v1/completions", json=body,
                                                          timeout=60).status_code, range(64)))
        assert set(codes) == {200}
        shares = {name: endpoint_requests(url, s) for name, s in (("b", b), ("single", single))}
    assert sum(shares.values()) == 64, shares
    assert shares["single"] < 0.6 * shares["b"], shares


def test_a_killed_replica_fails_only_its_requests_and_returns_after_its_restart(replicas):
    _a, b, _single = replicas
    settings = GatewaySettings(upstream_url=",".join(s.url for s in replicas), upstream_eject_max_s=2,
                               upstream_health_interval_s=1)
    with GatewayServer(settings) as gw:
        before_b = sent_to(gw, b)
        # --- kill b under load -----------------------------------------------------------------
        results: list[tuple[float, float, bool]] = []
        stop = threading.Event()

        def client(n: int) -> None:
            i = n
            while not stop.is_set():
                results.append(stream(gw, i))
                i += 6

        with ThreadPoolExecutor(6) as pool:
            for n in range(6):
                pool.submit(client, n)
            # killed while it holds requests (at a random moment a replica of three may hold none):
            # two, so that one ending in the moment before the kill leaves one to fail
            eventually(lambda: sent_to(gw, b) >= before_b + 5 and holds(gw, b, 2), timeout_s=30, interval_s=0.01)
            b.process.kill()
            killed = time.monotonic()
            time.sleep(2)
            after_2s = sent_to(gw, b)
            time.sleep(3)
            stop.set()
        failed = [(start, end) for start, end, whole in results if not whole]
        assert failed, "no request was in flight on the killed replica"
        assert len(failed) <= 6 and all(start < killed for start, _ in failed), (killed, failed)
        assert sum(1 for start, _, _ in results if start > killed + 0.5) >= 10  # the others carried on
        assert sent_to(gw, b) == after_2s and not is_up(gw, b)

        # --- b restarts and is back in rotation within its probe's backoff (2 s at most here) ---
        b.process.start()
        b.process.wait_healthy(VLLM_STARTUP_TIMEOUT_S)
        healthy = time.monotonic()
        eventually(lambda: is_up(gw, b), timeout_s=6)
        back_after = time.monotonic() - healthy
        base = sent_to(gw, b)
        with ThreadPoolExecutor(6) as pool:
            assert all(whole for _, _, whole in pool.map(lambda i: stream(gw, i), range(30)))
        assert sent_to(gw, b) > base, f"back in rotation after {back_after:.1f} s, but sent nothing"
