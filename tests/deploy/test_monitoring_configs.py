"""The configs of the paging path's shapes, checked by promtool and amtool as each server
would read them: an HA pair's Prometheus servers, a cluster's agent, the central store."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from inferwatch.alerts.generate import RULES_DIR
from inferwatch.alerts.routing import Receivers
from inferwatch.deploy.monitoring import (
    REPLICA_LABEL,
    Targets,
    agent_config,
    alertmanager_process,
    central_config,
    prometheus_config,
    replica_names,
    write_local_configs,
    write_targets,
)

HA = Targets(prometheus=("127.0.0.1:9090", "127.0.0.1:9190"), alertmanager=("127.0.0.1:9093", "127.0.0.1:9193"),
             gateway=("127.0.0.1:8080",), vllm=(("127.0.0.1:8000", "m1"),))
RULES = [str(f) for f in sorted(RULES_DIR.glob("*.yml"))]


def _promtool(config: dict, tmp: Path, *flags: str) -> None:
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", *flags, str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_an_ha_pair_tells_its_replicas_apart_but_sends_alertmanager_one_alert(tmp_path):
    assert replica_names(HA) == ("a", "b")
    assert replica_names(Targets(prometheus=("p:9090",), alertmanager=("a:9093",))) == (None,)
    for replica in ("a", "b"):
        config = prometheus_config(HA, RULES, "local", str(write_targets(HA, tmp_path / "targets")), replica=replica)
        assert config["global"]["external_labels"] == {"cluster": "local", REPLICA_LABEL: replica}
        assert config["alerting"]["alert_relabel_configs"] == [{"action": "labeldrop", "regex": REPLICA_LABEL}]
        assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == list(HA.alertmanager)
        scraped = {job["job_name"]: job for job in config["scrape_configs"]}
        assert scraped["prometheus"]["static_configs"][0]["targets"] == list(HA.prometheus)  # each watches the other
        _promtool(config, tmp_path)
    lone = prometheus_config(Targets(prometheus=("p:9090",), alertmanager=("a:9093",)), RULES, "local", "t")
    assert "alert_relabel_configs" not in lone["alerting"] and REPLICA_LABEL not in lone["global"]["external_labels"]


def test_each_alertmanager_of_a_pair_gossips_with_the_other(tmp_path):
    receivers = Receivers("http://p/hooks/pager", "http://p/hooks/ticket", "http://p/hooks/deadman")
    proms, am = write_local_configs(tmp_path, HA, receivers, rules_dir=RULES_DIR)
    assert [p.parent.name for p in proms] == ["prometheus", "prometheus-b"]
    result = subprocess.run(["amtool", "check-config", str(am)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    first = alertmanager_process(am, tmp_path / "d", "127.0.0.1", 9093, tmp_path / "l", peers=("127.0.0.1:9193",))
    assert {"--cluster.listen-address=127.0.0.1:9094", "--cluster.peer=127.0.0.1:9194"} <= set(first.argv)
    alone = alertmanager_process(am, tmp_path / "d", "127.0.0.1", 9093, tmp_path / "l")
    assert "--cluster.listen-address=" in alone.argv  # gossip off: nothing listens beside the API


def test_a_clusters_agent_scrapes_and_sends_and_the_central_store_evaluates(tmp_path):
    cluster = Targets(prometheus=("127.0.0.1:9095",), alertmanager=(), gateway=("127.0.0.1:8080",))
    agent = agent_config(cluster, "east", str(write_targets(cluster, tmp_path / "targets")),
                         "http://central:9090/api/v1/write")
    assert agent["global"]["external_labels"] == {"cluster": "east"}
    assert [w["url"] for w in agent["remote_write"]] == ["http://central:9090/api/v1/write"]
    assert "rule_files" not in agent and "alerting" not in agent
    assert {job["job_name"] for job in agent["scrape_configs"]} == {"prometheus", "inferwatch-gateway"}
    _promtool(agent, tmp_path, "--agent")
    central = central_config(RULES, ("127.0.0.1:9093",), "127.0.0.1:9090")
    assert "external_labels" not in central["global"]  # every series keeps the cluster it came with
    _promtool(central, tmp_path)
