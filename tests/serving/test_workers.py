"""``inferwatch gateway --workers N``: processes sharing one port in front of the real vLLM,
one ``/metrics`` for all of them, a killed worker started again, and the pod's view checked
against prometheus_client's own parsers, promtool and vLLM's own request counter."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from pydantic import ValidationError

from inferwatch.common.supervise import ManagedProcess
from inferwatch.serving.exposition import render
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.worker_metrics import UP_FAMILY, merge
from tests.conftest import TINY_MODEL_NAME
from tests.support.redis_server import RedisServer
from tests.support.servers import metric_sum
from tests.support.sockets import free_port
from tests.support.waiting import eventually

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def worker_registry(seed: int) -> CollectorRegistry:
    """A registry with every kind of family the gateway has, its values set by ``seed``."""
    registry = CollectorRegistry()
    requests_total = Counter("demo_requests", "Requests.", ["model", "route"], registry=registry)
    requests_total.labels("m", "/v1/chat").inc(3 + seed)
    requests_total.labels("m", "/v1/completions").inc(seed)
    Gauge("demo_in_flight", "In flight.", registry=registry).set(seed * 2.5)
    latency = Histogram("demo_latency_seconds", "Latency.", ["model"], buckets=(0.1, 1.0), registry=registry)
    for value in (0.05, 0.5, 5.0)[: seed + 1]:
        latency.labels("m").observe(value)
    Info("demo_build", "Build.", registry=registry).info({"version": f"1.{seed}"})
    return registry


def samples_of(families) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


@pytest.mark.parametrize("accept,parse", [("text/plain", parse_text), (OPENMETRICS, parse_openmetrics)],
                         ids=["text", "openmetrics"])
def test_the_pod_view_holds_each_workers_samples_labelled_with_its_index(accept, parse):
    registries = [worker_registry(seed) for seed in range(3)]
    texts = [render(r, accept)[0].decode() for r in registries]
    merged = merge([(0, texts[0]), (1, texts[1]), (2, None)])  # worker 2 did not answer
    got = samples_of(parse(merged))
    want = {}
    for index in (0, 1):
        for (name, labels), value in samples_of(parse(texts[index])).items():
            want[(name, labels | {("worker", str(index))})] = value
    want[(UP_FAMILY, frozenset({("worker", "0")}))] = 1.0
    want[(UP_FAMILY, frozenset({("worker", "1")}))] = 1.0
    want[(UP_FAMILY, frozenset({("worker", "2")}))] = 0.0
    assert got == want
    assert merged.count("# TYPE demo_latency_seconds histogram") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool comes with `make install`")
def test_promtool_finds_nothing_wrong_with_the_pod_view(tmp_path):
    texts = [render(worker_registry(seed), "text/plain")[0].decode() for seed in range(2)]
    merged = merge(list(enumerate(texts)))
    checked = subprocess.run(["promtool", "check", "metrics"], input=merged, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_more_than_one_worker_needs_shared_state():
    with pytest.raises(ValidationError, match="workers=2 needs redis_url"):
        GatewaySettings(workers=2)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        GatewaySettings(workers=0, redis_url="redis://127.0.0.1:6379/0")
    assert GatewaySettings(workers=2, redis_url="redis://127.0.0.1:6379/0").workers == 2


def gateway_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "inferwatch", "gateway", "--host", "127.0.0.1", "--port", str(port), *extra]


def clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")} | {"PYTHONUNBUFFERED": "1", **extra}


def test_a_worker_that_cannot_start_stops_the_others_with_its_message(tmp_path):
    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # never reached: the limits file fails first
    done = subprocess.run(gateway_argv(free_port(), "--workers", "2", "--redis-url", redis_url, "--limits-file",
                                       str(tmp_path / "missing.yaml")),
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cannot use the limits or experiment file" in done.stderr


def test_a_port_another_program_holds_is_refused_before_any_worker_starts(tmp_path):
    import socket
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(gateway_argv(port, "--workers", "2", "--redis-url", "redis://127.0.0.1:1/0"),
                              env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@contextmanager
def gateway_workers(upstream: str, redis_url: str, logs: Path, workers: int) -> Iterator[tuple[str, ManagedProcess]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ManagedProcess("gateway", gateway_argv(port, "--workers", str(workers), "--redis-url", redis_url),
                          log_path=logs / "gateway.log", env=clean_env(INFERWATCH_GATEWAY_UPSTREAM_URL=upstream),
                          health_url=url + "/health")
    proc.start()
    try:
        proc.wait_healthy(60)
        eventually(lambda: len(children(proc.pid)) == workers, timeout_s=30)
        yield url, proc
    finally:
        proc.stop()


def completions(url: str, n: int) -> list[int]:
    """``n`` completions, each on a connection of its own (so the kernel picks a worker each time)."""
    body = {"model": TINY_MODEL_NAME, "prompt": "one two", "max_tokens": 2}
    return [requests.post(url + "/v1/completions", json=body, timeout=60,
                          headers={"connection": "close"}).status_code for _ in range(n)]


def answered_by(text: str) -> dict[str, float]:
    return {w: metric_sum(text, "inferwatch_gateway_requests_total", worker=w, status_class="2xx")
            for w in ("0", "1")}


@pytest.mark.vllm
def test_two_workers_share_the_port_and_answer_for_each_other_on_metrics(vllm_server, tmp_path):
    with RedisServer(tmp_path / "redis") as redis_server, \
            gateway_workers(vllm_server.url, redis_server.url, tmp_path, 2) as (url, proc):
        vllm_before = metric_sum(requests.get(vllm_server.url + "/metrics", timeout=10).text,
                                 "vllm:request_success_total")
        assert completions(url, 40) == [200] * 40
        vllm_after = metric_sum(requests.get(vllm_server.url + "/metrics", timeout=10).text,
                                "vllm:request_success_total")
        assert vllm_after - vllm_before == 40
        # every scrape, whichever worker it lands on, counts all 40, each worker's apart
        for _ in range(6):
            text = requests.get(url + "/metrics", timeout=10, headers={"connection": "close"}).text
            by_worker = answered_by(text)
            assert sum(by_worker.values()) == 40, by_worker
            assert min(by_worker.values()) > 0, by_worker  # 40 connections, all on one worker: 2^-39
            assert metric_sum(text, UP_FAMILY) == 2

        # --- a worker killed: the other serves on, the parent starts it again ---------------------
        first, second = children(proc.pid)
        os.kill(second, signal.SIGKILL)
        # once it is gone (connections in its queue at that moment are reset, as in any crash),
        # the other worker has every new connection until the restarted one listens
        eventually(lambda: second not in children(proc.pid), timeout_s=10)
        assert completions(url, 10) == [200] * 10
        eventually(lambda: len(children(proc.pid)) == 2, timeout_s=30)
        restarted = next(p for p in children(proc.pid) if p != first)

        def both_up_again() -> bool:
            text = requests.get(url + "/metrics", timeout=10, headers={"connection": "close"}).text
            return metric_sum(text, UP_FAMILY) == 2
        eventually(both_up_again, timeout_s=30)
        # the killed worker's count went with it; the restarted one counts from zero
        text = requests.get(url + "/metrics", timeout=10).text
        assert sum(answered_by(text).values()) < 50

        # --- SIGTERM to the parent stops every worker ------------------------------------------
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.proc.wait(timeout=30) == 0
        for pid in (first, restarted):
            eventually(lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s=10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
