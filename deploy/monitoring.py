"""Prometheus and Alertmanager for the stack: their configs and their processes.

One function renders each config; the compose stack's copies under ``deploy/`` are
rendered with container host names (``make generate`` writes them, a test checks they are
current), and ``inferwatch up`` renders the same with loopback addresses into its run
folder. Scrape jobs are the ones the alert rules name (``alerts.spec.JOB_*``).

What Prometheus scrapes beside itself and Alertmanager comes from file-based discovery
(one ``targets/<job>.yml`` per job), so the one Prometheus config serves both stacks and a
fleet is pointed at by editing target files, which Prometheus re-reads while running.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from inferwatch.alerts import spec
from inferwatch.alerts.generate import RULES_DIR, render
from inferwatch.alerts.routing import DEADMAN, TEMPLATES_DIR, Receivers, Timing, alertmanager_config
from inferwatch.common.supervise import ManagedProcess
from inferwatch.config.settings import Routing

DEPLOY_DIR = Path(__file__).resolve().parent  # package data: the same in a checkout and an installed wheel
SCRAPE_INTERVAL = "10s"
EVALUATION_INTERVAL = "10s"


@dataclass(frozen=True)
class Targets:
    """host:port of everything Prometheus scrapes; vLLM servers with the model they serve.

    ``host`` names the one machine vLLM and the exporter run on where their addresses do not
    say it (containers of one compose project): the cost rules join a vLLM to the GPUs of its
    host by the ``host`` label, else by the host part of ``instance`` (alerts/cost.py)."""

    prometheus: tuple[str, ...]  # two or more: identical servers, each scraping and alerting on its own
    alertmanager: tuple[str, ...]  # two or more: a gossip cluster that sends each notification once
    gateway: tuple[str, ...] = ()
    vllm: tuple[tuple[str, str | None], ...] = ()  # (host:port, served model name when known)
    exporter: tuple[str, ...] = ()
    drift: tuple[str, ...] = ()
    supervisor: tuple[str, ...] = ()
    host: str | None = None

    def jobs(self) -> set[str]:
        """The scrape jobs these targets make (the ones absent() guards may expect)."""
        named = {spec.JOB_GATEWAY: self.gateway, spec.JOB_VLLM: self.vllm, spec.JOB_EXPORTER: self.exporter,
                 spec.JOB_DRIFT: self.drift, spec.JOB_SUPERVISOR: self.supervisor}
        return {"prometheus", spec.JOB_ALERTMANAGER} | {job for job, targets in named.items() if targets}


@dataclass(frozen=True)
class Intervals:
    scrape: str = SCRAPE_INTERVAL
    evaluation: str = EVALUATION_INTERVAL
    page: Timing | None = None  # None: the settings' (routing.page)
    ticket: Timing | None = None
    deadman: Timing = DEADMAN
    resend_delay: str = "1m"  # how often Prometheus re-sends a firing alert (its own default)


# For tests and demos (`inferwatch up --fast-alerting`): everything in about a second.
FAST_INTERVALS = Intervals("1s", "1s", Timing("1s", "2s", "1h"), Timing("1s", "2s", "1h"), Timing("0s", "5s", "4s"),
                           resend_delay="2s")
# The same for an HA pair (`inferwatch up --ha --fast-alerting`). Two Prometheus servers see
# an incident end up to one evaluation apart. If the one still firing re-sends its alert in
# that gap, Alertmanager takes the alert as firing again until that one resolves too; the
# Alertmanager that waits for its peer (the second in the cluster) and flushes its group just
# then notifies a stale "firing" after its peer has sent "resolved": a second page. At most
# (gap / resend delay) x (gap / group interval) / 2 per resolution: 12 % at 1 s evaluations
# with 2 s resends and group intervals, 0.5 % with 10 s ones (the shipped 10 s evaluations,
# 1 m resends and 1 m group intervals: 1.4 %; docs/alerts.md says more).
FAST_HA_INTERVALS = replace(FAST_INTERVALS, page=Timing("1s", "10s", "1h"), resend_delay="10s")


def target_groups(targets: Targets) -> dict[str, list[dict]]:
    """Prometheus file_sd target groups per scrape job, for the jobs that have targets.

    A vLLM whose served model is known carries it as the target label ``model``, so ``up``
    (VLLMDown) names the model too; vLLM and the exporter carry ``targets.host`` as ``host``."""
    host = {"host": targets.host} if targets.host else {}

    def labelled(address: str, labels: dict[str, str]) -> dict:
        return {"targets": [address], **({"labels": labels} if labels else {})}

    vllm = [labelled(address, {**({"model": model} if model else {}), **host}) for address, model in targets.vllm]
    groups = {spec.JOB_GATEWAY: [{"targets": list(targets.gateway)}], spec.JOB_VLLM: vllm,
              spec.JOB_EXPORTER: [{"targets": list(targets.exporter), **({"labels": host} if host else {})}],
              **{job: [{"targets": list(addresses)}] for job, addresses in (
                  (spec.JOB_DRIFT, targets.drift), (spec.JOB_SUPERVISOR, targets.supervisor))}}
    return {job: group for job, group in groups.items() if any(g["targets"] for g in group)}


def _discovered_job(job: str, targets_dir: str) -> dict:
    sd = {"job_name": job, "file_sd_configs": [{"files": [f"{targets_dir}/{job}.yml"]}]}
    if job == spec.JOB_VLLM:
        # vLLM labels its own series model_name; `model` is what the rules and dashboards group by.
        sd["metric_relabel_configs"] = [{"source_labels": ["model_name"], "regex": "(.+)", "target_label": "model"}]
    return sd


# The external label that tells HA Prometheus replicas apart (the Prometheus Operator's name).
# Dropped from the alerts they send, so Alertmanager sees one alert from both, and kept on
# what they remote-write, where a store that deduplicates (Thanos, Mimir's HA tracker) reads it.
REPLICA_LABEL = "prometheus_replica"


def replica_names(targets: Targets) -> tuple[str | None, ...]:
    """One name per Prometheus server: none for a lone server (its config as ever), a, b, ... for HA."""
    if len(targets.prometheus) == 1:
        return (None,)
    return tuple(chr(ord("a") + i) for i in range(len(targets.prometheus)))


def prometheus_config(targets: Targets, rule_files: list[str], cluster: str, targets_dir: str,
                      intervals: Intervals = Intervals(), replica: str | None = None) -> dict:
    """One Prometheus server's config. Every server of an HA pair scrapes the same targets,
    evaluates the same rules and sends to every Alertmanager; each also scrapes the other, so
    the survivor tells of a lost one."""
    static = [{"job_name": job, "static_configs": [{"targets": list(addresses)}]}
              for job, addresses in (("prometheus", targets.prometheus), (spec.JOB_ALERTMANAGER, targets.alertmanager))
              if addresses]
    jobs = static + [_discovered_job(job, targets_dir) for job in target_groups(targets)]
    external = {"cluster": cluster, **({REPLICA_LABEL: replica} if replica else {})}
    alerting: dict = {"alertmanagers": [{"static_configs": [{"targets": list(targets.alertmanager)}]}]}
    if replica:
        alerting["alert_relabel_configs"] = [{"action": "labeldrop", "regex": REPLICA_LABEL}]
    return {
        "global": {"scrape_interval": intervals.scrape, "evaluation_interval": intervals.evaluation,
                   "external_labels": external},
        "rule_files": rule_files,
        "alerting": alerting,
        "scrape_configs": jobs,
    }


# A cluster's agent sends a batch at least this often: samples reach the central store within
# about a second of their scrape, so the central rules lag the cluster's by that much.
REMOTE_WRITE_DEADLINE = "1s"


def agent_config(targets: Targets, cluster: str, targets_dir: str, remote_write_url: str,
                 intervals: Intervals = Intervals()) -> dict:
    """A cluster's Prometheus in agent mode: it scrapes what ``prometheus_config`` scrapes
    (``targets.prometheus``: the agent itself) and remote-writes every sample, with its
    ``cluster`` label, to the central store, which evaluates the rules over every cluster. No
    rules, no Alertmanager: a central Prometheus receiving remote-write, Mimir or Thanos
    Receive (docs/alerts.md says how each is set up)."""
    config = prometheus_config(replace(targets, alertmanager=()), [], cluster, targets_dir, intervals)
    del config["rule_files"], config["alerting"], config["global"]["evaluation_interval"]
    config["remote_write"] = [{"url": remote_write_url,
                               "queue_config": {"batch_send_deadline": REMOTE_WRITE_DEADLINE}}]
    return config


def central_config(rule_files: list[str], alertmanagers: tuple[str, ...], itself: str,
                   intervals: Intervals = Intervals()) -> dict:
    """The central store's Prometheus: no targets but itself, every cluster's samples by
    remote-write (``prometheus_process(receive=True)``), the rules evaluated over all of them.
    It has no ``cluster`` of its own: each series and alert keeps the one it came with."""
    return {
        "global": {"scrape_interval": intervals.scrape, "evaluation_interval": intervals.evaluation},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]},
        "scrape_configs": [{"job_name": "prometheus", "static_configs": [{"targets": [itself]}]}],
    }


# The compose project's machine: its vLLM and exporter containers have addresses of their own.
COMPOSE_HOST = "compose"
COMPOSE_TARGETS = Targets(prometheus=("localhost:9090",), alertmanager=("alertmanager:9093",), gateway=("gateway:8080",),
                          vllm=(("vllm:8000", None),), exporter=("exporter:9400",),
                          drift=("drift:8090", "drift-b:8090"), host=COMPOSE_HOST)
# `deploy/compose/ha.yml`: the same stack with a second Prometheus and Alertmanager.
COMPOSE_HA_TARGETS = replace(COMPOSE_TARGETS, prometheus=("prometheus:9090", "prometheus-b:9090"),
                             alertmanager=("alertmanager:9093", "alertmanager-b:9093"))
COMPOSE_RECEIVERS = Receivers(pager_webhook="http://pager:9097/hooks/pager",
                              ticket_webhook="http://pager:9097/hooks/ticket",
                              deadman_webhook="http://pager:9097/hooks/deadman")
COMPOSE_PAGERDUTY_KEY_FILE = "/run/secrets/pagerduty_routing_key"


HEADER = "# Generated by `make generate` (deploy/monitoring.py, alerts/routing.py). Do not edit.\n"
TARGETS_HEADER = ("# The compose stack's default scrape targets (services of the compose project). For a vLLM\n"
                  "# or exporter elsewhere, copy this folder, edit it and set PROMETHEUS_TARGETS_DIR in .env;\n"
                  "# Prometheus re-reads it while running. A vLLM target may carry labels: {model: <name>}.\n"
                  "# A vLLM and the exporter of the machine it runs on carry the same {host: <name>}: the\n"
                  "# cost rules give a vLLM the GPUs of its host (docs/cost.md).\n")


def compose_files(rule_names: Iterable[str], policy: Routing = Routing()) -> dict[Path, str]:
    """The configs the compose stack mounts, path -> text: Prometheus loads the rule files
    named ``rule_names`` from /etc/prometheus/rules, targets from /etc/prometheus/targets.

    Alertmanager has two configs: without PagerDuty (the default; a PagerDuty receiver
    without a key fails at every page) and with it, for ``ALERTMANAGER_CONFIG``. The dead
    man's switch goes to the settings' ``routing.heartbeat_url``, or to the local pager."""
    rules = [f"/etc/prometheus/rules/{name}" for name in sorted(rule_names)]
    prometheus = prometheus_config(COMPOSE_TARGETS, rules, "compose", "/etc/prometheus/targets")
    receivers = replace(COMPOSE_RECEIVERS, deadman_webhook=policy.heartbeat_url or COMPOSE_RECEIVERS.deadman_webhook)
    with_pagerduty = replace(receivers, pagerduty_routing_key_file=COMPOSE_PAGERDUTY_KEY_FILE)
    files = {
        DEPLOY_DIR / "prometheus" / "prometheus.yml": render(prometheus, HEADER),
        **{DEPLOY_DIR / "prometheus" / f"prometheus-ha-{replica}.yml": render(
            prometheus_config(COMPOSE_HA_TARGETS, rules, "compose", "/etc/prometheus/targets", replica=replica), HEADER)
           for replica in replica_names(COMPOSE_HA_TARGETS) if replica},
        DEPLOY_DIR / "alertmanager" / "alertmanager.yml": render(
            alertmanager_config(receivers, "/etc/alertmanager/templates", policy), HEADER),
        DEPLOY_DIR / "alertmanager" / "alertmanager-pagerduty.yml": render(
            alertmanager_config(with_pagerduty, "/etc/alertmanager/templates", policy), HEADER),
    }
    for job, groups in target_groups(COMPOSE_TARGETS).items():
        files[DEPLOY_DIR / "prometheus" / "targets" / f"{job}.yml"] = TARGETS_HEADER + yaml.safe_dump(
            groups, sort_keys=False)
    return files


def write_targets(targets: Targets, targets_dir: Path) -> Path:
    """The file discovery's target files of ``targets``, one per job, in ``targets_dir``."""
    targets_dir.mkdir(parents=True, exist_ok=True)
    for job, groups in target_groups(targets).items():
        (targets_dir / f"{job}.yml").write_text(yaml.safe_dump(groups, sort_keys=False))
    return targets_dir


def prometheus_dir(run_dir: Path, replica: str | None) -> Path:
    """A server's folder in a local stack's run folder: its config and its TSDB."""
    return run_dir / ("prometheus" if replica in (None, "a") else f"prometheus-{replica}")


def write_local_configs(run_dir: Path, targets: Targets, receivers: Receivers,
                        intervals: Intervals = Intervals(), rules_dir: Path = RULES_DIR,
                        policy: Routing = Routing()) -> tuple[list[Path], Path]:
    """Render the configs of a local stack into ``run_dir``: one per Prometheus server (in
    the order of ``targets.prometheus``) and the Alertmanagers' one; return their paths."""
    am_dir = run_dir / "alertmanager"
    am_dir.mkdir(parents=True, exist_ok=True)
    rules = [str(f) for f in sorted(rules_dir.glob("*.yml"))]
    targets_dir = write_targets(targets, run_dir / "prometheus" / "targets")
    proms = []
    for replica in replica_names(targets):
        prom = prometheus_dir(run_dir, replica) / "prometheus.yml"
        prom.parent.mkdir(parents=True, exist_ok=True)
        prom.write_text(yaml.safe_dump(prometheus_config(targets, rules, "local", str(targets_dir), intervals, replica),
                                       sort_keys=False))
        proms.append(prom)
    am = am_dir / "alertmanager.yml"
    am.write_text(yaml.safe_dump(alertmanager_config(receivers, TEMPLATES_DIR, policy, page=intervals.page,
                                                     ticket=intervals.ticket, deadman=intervals.deadman),
                                 sort_keys=False))
    return proms, am


def prometheus_binary() -> str:
    return shutil.which("prometheus") or "prometheus"


def alertmanager_binary() -> str:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "alertmanager"


def prometheus_process(config: Path, data_dir: Path, host: str, port: int, log_path: Path,
                       intervals: Intervals = Intervals(), retention: str = "35d",
                       key: str = "prometheus", receive: bool = False) -> ManagedProcess:
    """``retention`` must outlast the SLO period (30d) for the error budget to be whole.
    ``receive``: accept remote-write (``/api/v1/write``), as a central store."""
    argv = [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--rules.alert.resend-delay={intervals.resend_delay}",
            f"--web.listen-address={host}:{port}", "--enable-feature=exemplar-storage",
            f"--storage.tsdb.retention.time={retention}", "--web.enable-lifecycle",
            *(["--web.enable-remote-write-receiver"] if receive else [])]
    return ManagedProcess(f"Prometheus (:{port})", argv, log_path=log_path,
                          health_url=f"http://{host}:{port}/-/ready", key=key)


def agent_process(config: Path, wal_dir: Path, host: str, port: int, log_path: Path,
                  key: str = "prometheus-agent") -> ManagedProcess:
    """Prometheus in agent mode: a write-ahead log in place of a TSDB, kept until sent."""
    argv = [prometheus_binary(), "--enable-feature=agent", f"--config.file={config}",
            f"--storage.agent.path={wal_dir}", f"--web.listen-address={host}:{port}"]
    return ManagedProcess(f"Prometheus agent (:{port})", argv, log_path=log_path,
                          health_url=f"http://{host}:{port}/-/ready", key=key)


def gossip_address(alertmanager: str) -> str:
    """Where an Alertmanager of a cluster gossips: its web port plus one (9093 -> 9094, the default)."""
    host, _, port = alertmanager.rpartition(":")
    return f"{host}:{int(port) + 1}"


def alertmanager_process(config: Path, data_dir: Path, host: str, port: int, log_path: Path,
                         peers: tuple[str, ...] = (), key: str = "alertmanager") -> ManagedProcess:
    """``peers``: the web addresses of the other Alertmanagers of its cluster (none: gossip off).

    In a cluster, each sends a notification only after the members before it in the cluster's
    order have had ``--cluster.peer-timeout`` (15 s) per place to send it and gossip that they
    did: the first sends at once, and with it gone the next sends 15 s later. Alerts reach
    every member (every Prometheus sends to all), so each can stand in."""
    gossip = ["--cluster.listen-address="]
    if peers:
        own = gossip_address(f"{host}:{port}")
        gossip = [f"--cluster.listen-address={own}", f"--cluster.advertise-address={own}",
                  *(f"--cluster.peer={gossip_address(p)}" for p in peers)]
    argv = [alertmanager_binary(), f"--config.file={config}", f"--storage.path={data_dir}",
            f"--web.listen-address={host}:{port}", *gossip, f"--web.external-url=http://{host}:{port}"]
    return ManagedProcess(f"Alertmanager (:{port})", argv, log_path=log_path,
                          health_url=f"http://{host}:{port}/-/ready", key=key)
