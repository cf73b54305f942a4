"""Several clusters' samples in one store: a Prometheus agent per cluster remote-writes to a
central Prometheus (its remote-write receiver on), which evaluates the shipped rules over
both. Each cluster runs a real gateway in front of the suite's vLLM; what one cluster loses
alerts for that cluster only."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.alerts.generate import cap_for, rule_files, write
from inferwatch.deploy.monitoring import (
    FAST_INTERVALS,
    Targets,
    agent_config,
    agent_process,
    central_config,
    prometheus_process,
    write_targets,
)
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME
from tests.support.prometheus_server import instant_query
from tests.support.servers import GatewayServer
from tests.support.sockets import free_ports
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm
CLUSTERS = ("east", "west")


def _address(url: str) -> str:
    return url.removeprefix("http://")


@contextlib.contextmanager
def _started(proc):
    proc.start()
    try:
        proc.wait_healthy(60, poll_s=0.2)
        yield proc
    finally:
        proc.stop()


def _by_cluster(url: str, expr: str) -> set[tuple[str, ...]]:
    return {tuple(r["metric"].get(k, "") for k in ("cluster", "job")) for r in instant_query(url, expr)}


def test_the_rules_evaluate_centrally_over_two_clusters_and_alert_for_the_one_that_lost_a_part(vllm_server,
                                                                                              tmp_path: Path):
    central_port, *agent_ports = free_ports(1 + len(CLUSTERS))
    central = f"http://127.0.0.1:{central_port}"
    rules = tmp_path / "rules"
    write(cap_for(rule_files(jobs={"inferwatch-gateway", "vllm"}), "2s"), rules)
    (tmp_path / "central.yml").write_text(yaml.safe_dump(central_config(
        [str(f) for f in sorted(rules.glob("*.yml"))], (), f"127.0.0.1:{central_port}", FAST_INTERVALS)))
    with contextlib.ExitStack() as stack:
        stack.enter_context(_started(prometheus_process(tmp_path / "central.yml", tmp_path / "central", "127.0.0.1",
                                                        central_port, tmp_path / "central.log", FAST_INTERVALS,
                                                        receive=True)))
        gateways = {c: stack.enter_context(GatewayServer(GatewaySettings(upstream_url=vllm_server.url)))
                    for c in CLUSTERS}
        for cluster, port, gateway in zip(CLUSTERS, agent_ports, gateways.values()):
            targets = Targets(prometheus=(f"127.0.0.1:{port}",), alertmanager=(), gateway=(_address(gateway.url),),
                              vllm=((_address(vllm_server.url), TINY_MODEL_NAME),))
            config = tmp_path / f"agent-{cluster}.yml"
            config.write_text(yaml.safe_dump(agent_config(
                targets, cluster, str(write_targets(targets, tmp_path / f"targets-{cluster}")),
                f"{central}/api/v1/write", FAST_INTERVALS)))
            stack.enter_context(_started(agent_process(config, tmp_path / f"wal-{cluster}", "127.0.0.1", port,
                                                       tmp_path / f"agent-{cluster}.log")))
        # every cluster's targets arrive with their cluster, and the central rules keep it
        both = {(c, job) for c in CLUSTERS for job in ("prometheus", "vllm", "inferwatch-gateway")}
        eventually(lambda: _by_cluster(central, "up == 1") >= both, timeout_s=30)
        served = "inferwatch:vllm_served_model:info"
        eventually(lambda: {(r["metric"]["cluster"], r["metric"]["model"]) for r in instant_query(central, served)}
                   == {(c, TINY_MODEL_NAME) for c in CLUSTERS}, timeout_s=30)
        # requests counted after the first scrapes, so their rates are not 0
        for gateway in gateways.values():
            answer = requests.post(f"{gateway.url}/v1/chat/completions", timeout=30, json={
                "model": TINY_MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200, answer.text

        events = 'inferwatch_slo:sli_events:rate5m{slo="availability"} > 0'
        eventually(lambda: {r["metric"]["cluster"] for r in instant_query(central, events)} == set(CLUSTERS),
                   timeout_s=30)

        # west's gateway goes away: the central rules page for west's, and east's stays quiet
        gateways["west"].__exit__(None, None, None)
        down = 'ALERTS{alertname="GatewayDown",alertstate="firing"}'
        firing = eventually(lambda: instant_query(central, down), timeout_s=30)
        assert [(a["metric"]["cluster"], a["metric"]["instance"]) for a in firing] == \
            [("west", _address(gateways["west"].url))]
        assert _by_cluster(central, 'up{job="inferwatch-gateway"} == 1') == {("east", "inferwatch-gateway")}
