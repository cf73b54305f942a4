"""The whole fleet behind a load balancer, as it runs in production: three gateway replicas
(`inferwatch gateway` processes) behind Debian's nginx (round robin), one Redis they share, a
drift pair (two `inferwatch drift serve` processes, each fed everything), and an A/B
experiment whose two variants each run on two real vLLM replicas (the session's two vLLMs,
both variants on both).

What a user of the fleet sees, checked through nginx and through each replica: one weight
change is in force everywhere within a second, a rating is counted once whichever replica
takes it, a limit holds for the fleet, both drift replicas give one verdict, and losing a
drift replica and a gateway mid-run costs only the requests that were in flight on the
gateway.

nginx keeps no idle connections to the gateways (no ``keepalive``): nginx never sends a POST
again once it wrote it, so a request written on a kept-alive connection to a gateway at the
moment it dies fails, while a new connection to a dead gateway is refused and
``proxy_next_upstream error timeout`` sends the request to the next one.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from inferwatch.common.supervise import ManagedProcess
from inferwatch.serving.admission import key_id
from tests.conftest import TINY_MODEL_NAME
from tests.drift.test_drift_pair import without_clock
from tests.support import nginx
from tests.support.redis_server import RedisServer
from tests.support.servers import metric_sum
from tests.support.sockets import free_ports
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm

PUBLIC = "assistant"
ADMIN = "fl33t-admin"
OPEN_KEY, LIMITED_KEY = "open-key", "limited-key"
LIMIT_PER_MINUTE = 60
USERS = [f"user-{i}" for i in range(80)]
START_S = 60.0

@dataclass
class Service:
    process: ManagedProcess
    url: str

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=10).text


@dataclass
class Fleet:
    url: str  # nginx
    gateways: list[Service]
    drifts: list[Service]


def _process(started: list[Service], name: str, argv: list[str], url: str, health: str, logs: Path,
             env: dict[str, str]) -> Service:
    proc = ManagedProcess(name, argv, log_path=logs / f"{name}.log", env=env, health_url=url + health)
    started.append(Service(proc, url))  # before it starts: stopped at the end whatever comes next
    proc.start()
    return started[-1]


@pytest.fixture(scope="module")
def fleet(vllm_server, second_vllm, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    replicas = f"{vllm_server.url},{second_vllm.url}"
    (work / "experiments.yaml").write_text(f"""
experiments:
  {PUBLIC}:
    name: fleet-canary
    variants:
      - {{name: v1, upstream_url: "{replicas}", model: {TINY_MODEL_NAME}, weight: 1.0}}
      - {{name: v2, upstream_url: "{replicas}", model: {TINY_MODEL_NAME}, weight: 0.0}}
""")
    (work / "limits.yaml").write_text(f"keys: {{{key_id(LIMITED_KEY)}: {{requests_per_minute: {LIMIT_PER_MINUTE}}}}}\n")
    ports = free_ports(6)
    drift_urls = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    gateway_urls = [f"http://127.0.0.1:{p}" for p in ports[2:5]]
    services: list[Service] = []
    # the fleet's settings are these, not whatever INFERWATCH_* the shell running the tests has
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")} | {"PYTHONUNBUFFERED": "1"}
    with RedisServer(work / "redis") as redis_server:
        try:
            drifts = [_process(services, f"drift-{i}", [sys.executable, "-m", "inferwatch", "drift", "serve", "--host",
                                                        "127.0.0.1", "--port", str(ports[i]), "--db-path",
                                                        str(work / f"drift-{i}.sqlite3")], url, "/health", work, base)
                      for i, url in enumerate(drift_urls)]
            env = dict(base, INFERWATCH_GATEWAY_UPSTREAM_URL=replicas,
                       INFERWATCH_GATEWAY_EXPERIMENT_FILE=str(work / "experiments.yaml"),
                       INFERWATCH_GATEWAY_LIMITS_FILE=str(work / "limits.yaml"),
                       INFERWATCH_GATEWAY_API_KEYS=f"{OPEN_KEY},{LIMITED_KEY}",
                       INFERWATCH_GATEWAY_ADMIN_TOKEN=ADMIN, INFERWATCH_GATEWAY_REDIS_URL=redis_server.url,
                       INFERWATCH_GATEWAY_DRIFT_URLS=",".join(drift_urls), INFERWATCH_GATEWAY_FEATURE_FLUSH_S="0.1",
                       # a request that finds its limit lease empty waits this long for Redis before it
                       # is admitted owing: the 5 ms default is for a production Redis, not one that
                       # shares two loaded cores with the whole fleet (tests/serving/test_shared_state.py)
                       INFERWATCH_GATEWAY_REDIS_TIMEOUT_S="0.25")
            gateways = [_process(services, f"gateway-{i}", [sys.executable, "-m", "inferwatch", "gateway", "--host",
                                                            "127.0.0.1", "--port", str(ports[2 + i])],
                                 url, "/health", work, env)
                        for i, url in enumerate(gateway_urls)]
            argv = nginx.configure(work, ports[5], ports[2:5], proxy="proxy_next_upstream error timeout; "
                                   "proxy_connect_timeout 2s; proxy_read_timeout 120s;")
            lb = _process(services, "nginx", argv, f"http://127.0.0.1:{ports[5]}", "/nginx-health", work, base)
            for s in services:
                s.process.wait_healthy(START_S)
            yield Fleet(lb.url, gateways, drifts)
        finally:
            for s in services:
                s.process.stop()


def ask(url: str, user: str, key: str = OPEN_KEY, stream: bool = False) -> requests.Response:
    body = {"model": PUBLIC, "messages": [{"role": "user", "content": f"hello from {user}"}], "user": user,
            "max_tokens": 2, "stream": stream}
    return requests.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                         timeout=60)


def set_weights(fleet: Fleet, *weights: str) -> None:
    """`inferwatch experiment set-weights` through nginx: one call, whichever replica takes it."""
    done = subprocess.run([sys.executable, "-m", "inferwatch", "experiment", "set-weights", PUBLIC, *weights,
                           "--gateway-url", fleet.url, "--token", ADMIN], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def routing(gw: Service) -> tuple[int, dict[str, float]]:
    doc = requests.get(gw.url + "/admin/experiments", headers={"authorization": f"Bearer {ADMIN}"},
                       timeout=5).json()["experiments"][0]
    return doc["epoch"], {v["name"]: v["weight"] for v in doc["variants"]}


def everywhere(fleet: Fleet, expected: tuple[int, dict[str, float]]) -> bool:
    """Every gateway routes by ``expected``, asked at once (one look takes one round trip)."""
    with ThreadPoolExecutor(len(fleet.gateways)) as pool:
        return all(r == expected for r in pool.map(routing, fleet.gateways))


def variants_seen(fleet: Fleet) -> dict[str, set[str]]:
    """Each user's variant as every replica and nginx answer it."""
    urls = [fleet.url, *(g.url for g in fleet.gateways)]
    pairs = [(u, url) for u in USERS for url in urls]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: ask(p[1], p[0]), pairs))
    seen: dict[str, set[str]] = {u: set() for u in USERS}
    for (user, _), r in zip(pairs, answers):
        assert r.status_code == 200, r.text
        seen[user].add(r.headers["x-inferwatch-variant"])
    return seen


def queues_empty(fleet: Fleet, gateways: list[Service]) -> bool:
    return all(metric_sum(g.metrics(), "inferwatch_gateway_feature_queue_depth") == 0
               and metric_sum(g.metrics(), "inferwatch_gateway_rating_queue_depth") == 0 for g in gateways)


def ingested(drift: Service) -> float:
    return metric_sum(drift.metrics(), "inferwatch_drift_ingested_records_total")


def verdict(drift: Service) -> dict:
    r = requests.get(f"{drift.url}/v1/ab/{PUBLIC}", params={"control": "v1", "treatment": "v2", "min_units": 10},
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_one_weight_change_through_nginx_is_in_force_on_every_replica_within_a_second(fleet):
    start = routing(fleet.gateways[0])[0]
    set_weights(fleet, "v2=50%")
    eventually(lambda: everywhere(fleet, (start + 1, {"v1": 0.5, "v2": 0.5})), timeout_s=1.0)
    seen = variants_seen(fleet)
    assert all(len(v) == 1 for v in seen.values()), {u: v for u, v in seen.items() if len(v) > 1}
    assert {next(iter(v)) for v in seen.values()} == {"v1", "v2"}

    set_weights(fleet, "v2=0")  # the rollback
    eventually(lambda: everywhere(fleet, (start + 2, {"v1": 1.0, "v2": 0.0})), timeout_s=5.0)
    assert all(v == {"v1"} for v in variants_seen(fleet).values())


def test_a_rating_through_any_replica_is_counted_once_and_both_drift_replicas_agree(fleet):
    set_weights(fleet, "v2=50%")
    eventually(lambda: all(routing(g)[1] == {"v1": 0.5, "v2": 0.5} for g in fleet.gateways), timeout_s=5.0)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda u: ask(fleet.url, u), USERS))
    assert all(r.status_code == 200 for r in answers)
    time.sleep(0.5)  # answers reach Redis in batches every 20 ms: on a loaded machine, let the last one land
    rate_headers = {"authorization": f"Bearer {OPEN_KEY}"}

    def rate(url: str, answer: requests.Response) -> int:
        thumbs = "up" if answer.headers["x-inferwatch-variant"] == "v1" else "down"
        return requests.post(url + "/v1/feedback", json={"response_id": answer.json()["id"], "thumbs": thumbs},
                             headers=rate_headers, timeout=10).status_code

    with ThreadPoolExecutor(12) as pool:
        # each answer rated through all three gateways at once: exactly one takes it
        tries = [(g.url, a) for a in answers for g in fleet.gateways]
        codes = list(pool.map(lambda p: rate(*p), tries))
        per_answer = [sorted(codes[i:i + 3]) for i in range(0, len(codes), 3)]
        assert all(c == [200, 409, 409] for c in per_answer), per_answer
        assert set(pool.map(lambda a: rate(fleet.url, a), answers)) == {409}  # and again through nginx

    # the split of these fixed ids by the gateway's hash (keyed by the experiment's name) is
    # fixed too: 30 rated units an arm, the feedback guardrail's minimum, is a property of them
    arms = {"v1": sum(r.headers["x-inferwatch-variant"] == "v1" for r in answers)}
    arms["v2"] = len(USERS) - arms["v1"]
    assert min(arms.values()) >= 30, arms
    eventually(lambda: queues_empty(fleet, fleet.gateways) and ingested(fleet.drifts[0]) == ingested(fleet.drifts[1]),
               timeout_s=30)

    differences: list[str] = []

    def agreed() -> dict | None:
        """Both replicas' verdicts, once equal: a queue depth of 0 means the last batch left the
        gateway, not that each replica has stored it yet."""
        a, b = (without_clock(verdict(d)) for d in fleet.drifts)
        differences[:] = difflib.unified_diff(*(json.dumps(v, indent=1, sort_keys=True).splitlines() for v in (a, b)),
                                              "drift 0", "drift 1", lineterm="", n=1)
        return a if a == b else None

    try:
        a = eventually(agreed, timeout_s=30, interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError("the drift replicas' verdicts still differ:\n" + "\n".join(differences[:80])) from exc
    feedback = a["metrics"]["feedback"]
    counted = re.match(r"([\d,]+) / ([\d,]+) ratings from ([\d,]+) / ([\d,]+) units", feedback["note"])
    assert counted, feedback
    ratings_v1, ratings_v2, units_v1, units_v2 = (int(x.replace(",", "")) for x in counted.groups())
    assert (ratings_v1, ratings_v2) == (units_v1, units_v2) == (arms["v1"], arms["v2"])  # once each
    assert (feedback["control"], feedback["treatment"]) == (1.0, 0.0), feedback  # v1 rated up, v2 down


def shared_state_errors(fleet: Fleet) -> float:
    return sum(metric_sum(g.metrics(), "inferwatch_gateway_shared_state_errors_total") for g in fleet.gateways)


def test_a_limit_of_60_a_minute_holds_across_the_replicas(fleet):
    """200 requests: more than three replicas would admit if each kept its own 60."""
    errors = shared_state_errors(fleet)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: ask(fleet.url, f"limited-{i}", LIMITED_KEY).status_code, range(200)))
    elapsed = time.monotonic() - started
    admitted = codes.count(200)
    assert set(codes) <= {200, 429}
    # the minute's allowance, what refilled while the burst ran (one a second), and 5 %
    assert LIMIT_PER_MINUTE * 0.9 <= admitted <= LIMIT_PER_MINUTE * 1.05 + elapsed, (admitted, elapsed)
    # held through Redis, not by each replica's fallback share of it (which would also hold)
    assert all(metric_sum(g.metrics(), "inferwatch_gateway_shared_state_up") == 1 for g in fleet.gateways)
    assert shared_state_errors(fleet) == errors


def test_losing_a_drift_replica_and_a_gateway_mid_run_costs_only_the_killed_gateways_requests(fleet):
    survivor, lost_drift = fleet.drifts
    g_killed, *g_kept = fleet.gateways
    results: list[tuple[float, float, bool]] = []
    stop = threading.Event()

    def client(n: int) -> None:
        i = n
        while not stop.is_set():
            started = time.monotonic()
            try:
                r = ask(fleet.url, f"kill-{i % 40}", stream=True)
                whole = r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") and "error" not in r.text
            except requests.RequestException:
                whole = False
            results.append((started, time.monotonic(), whole))
            i += 6

    with ThreadPoolExecutor(6) as pool:
        try:
            for n in range(6):
                pool.submit(client, n)
            eventually(lambda: len(results) >= 30, timeout_s=60)
            lost_drift.process.kill()
            at_kill = ingested(survivor)
            killing = time.monotonic()
            g_killed.process.kill()
            killed = time.monotonic()
            eventually(lambda: sum(1 for s, _, _ in results if s > killed + 0.5) >= 30, timeout_s=60)
        finally:
            stop.set()
    failed = [(start, end) for start, end, whole in results if not whole]
    # in flight on the killed gateway: started before it was dead, ended after it was killed
    assert len(failed) <= 6 and all(start < killed and end > killing for start, end in failed), (killing, failed)
    after = sum(1 for start, _, whole in results if whole and start > killed)

    # Every answer given after the kill came from a surviving gateway, and its record reached
    # the surviving drift replica: the gateways' queues to it empty with nothing dropped, and it
    # ingested at least one record per such answer (a batch sent again after a timeout may
    # count twice there, so this is a floor).
    eventually(lambda: all(metric_sum(g.metrics(), "inferwatch_gateway_feature_queue_depth",
                                      destination=survivor.url) == 0 for g in g_kept), timeout_s=30)
    dropped = sum(metric_sum(g.metrics(), "inferwatch_gateway_feature_records_total", outcome=o,
                             destination=survivor.url) for g in g_kept for o in ("dropped_full", "dropped_send_error"))
    assert dropped == 0
    assert ingested(survivor) - at_kill >= after > 0
