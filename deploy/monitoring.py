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

    prometheus: str
    alertmanager: str
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


def prometheus_config(targets: Targets, rule_files: list[str], cluster: str, targets_dir: str,
                      intervals: Intervals = Intervals()) -> dict:
    static = [{"job_name": job, "static_configs": [{"targets": [address]}]}
              for job, address in (("prometheus", targets.prometheus), (spec.JOB_ALERTMANAGER, targets.alertmanager))]
    jobs = static + [_discovered_job(job, targets_dir) for job in target_groups(targets)]
    return {
        "global": {"scrape_interval": intervals.scrape, "evaluation_interval": intervals.evaluation,
                   "external_labels": {"cluster": cluster}},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [targets.alertmanager]}]}]},
        "scrape_configs": jobs,
    }


# The compose project's machine: its vLLM and exporter containers have addresses of their own.
COMPOSE_HOST = "compose"
COMPOSE_TARGETS = Targets(prometheus="localhost:9090", alertmanager="alertmanager:9093", gateway=("gateway:8080",),
                          vllm=(("vllm:8000", None),), exporter=("exporter:9400",),
                          drift=("drift:8090", "drift-b:8090"), host=COMPOSE_HOST)
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
        DEPLOY_DIR / "alertmanager" / "alertmanager.yml": render(
            alertmanager_config(receivers, "/etc/alertmanager/templates", policy), HEADER),
        DEPLOY_DIR / "alertmanager" / "alertmanager-pagerduty.yml": render(
            alertmanager_config(with_pagerduty, "/etc/alertmanager/templates", policy), HEADER),
    }
    for job, groups in target_groups(COMPOSE_TARGETS).items():
        files[DEPLOY_DIR / "prometheus" / "targets" / f"{job}.yml"] = TARGETS_HEADER + yaml.safe_dump(
            groups, sort_keys=False)
    return files


def write_local_configs(run_dir: Path, targets: Targets, receivers: Receivers,
                        intervals: Intervals = Intervals(), rules_dir: Path = RULES_DIR,
                        policy: Routing = Routing()) -> tuple[Path, Path]:
    """Render both configs for a local stack into ``run_dir``; return their paths."""
    prom_dir, am_dir = run_dir / "prometheus", run_dir / "alertmanager"
    for d in (prom_dir, am_dir):
        d.mkdir(parents=True, exist_ok=True)
    rules = [str(f) for f in sorted(rules_dir.glob("*.yml"))]
    targets_dir = prom_dir / "targets"
    targets_dir.mkdir(exist_ok=True)
    for job, groups in target_groups(targets).items():
        (targets_dir / f"{job}.yml").write_text(yaml.safe_dump(groups, sort_keys=False))
    prom = prom_dir / "prometheus.yml"
    prom.write_text(yaml.safe_dump(prometheus_config(targets, rules, "local", str(targets_dir), intervals),
                                   sort_keys=False))
    am = am_dir / "alertmanager.yml"
    am.write_text(yaml.safe_dump(alertmanager_config(receivers, TEMPLATES_DIR, policy, page=intervals.page,
                                                     ticket=intervals.ticket, deadman=intervals.deadman),
                                 sort_keys=False))
    return prom, am


def prometheus_binary() -> str:
    return shutil.which("prometheus") or "prometheus"


def alertmanager_binary() -> str:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "alertmanager"


def prometheus_process(config: Path, data_dir: Path, host: str, port: int, log_path: Path,
                       intervals: Intervals = Intervals(), retention: str = "35d") -> ManagedProcess:
    """``retention`` must outlast the SLO period (30d) for the error budget to be whole."""
    argv = [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--rules.alert.resend-delay={intervals.resend_delay}",
            f"--web.listen-address={host}:{port}", "--enable-feature=exemplar-storage",
            f"--storage.tsdb.retention.time={retention}", "--web.enable-lifecycle"]
    return ManagedProcess(f"Prometheus (:{port})", argv, log_path=log_path,
                          health_url=f"http://{host}:{port}/-/ready", key="prometheus")


def alertmanager_process(config: Path, data_dir: Path, host: str, port: int, log_path: Path) -> ManagedProcess:
    argv = [alertmanager_binary(), f"--config.file={config}", f"--storage.path={data_dir}",
            f"--web.listen-address={host}:{port}", "--cluster.listen-address=",
            f"--web.external-url=http://{host}:{port}"]
    return ManagedProcess(f"Alertmanager (:{port})", argv, log_path=log_path,
                          health_url=f"http://{host}:{port}/-/ready", key="alertmanager")
