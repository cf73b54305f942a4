"""`inferwatch up`: the local stack as processes this one supervises. vLLM, the drift
service, the gateway and the GPU exporter, then Prometheus, Alertmanager and the local pager,
each started once the one before is healthy and restarted with backoff when it exits; the
monitoring configured by the same functions as deploy/ (rules and routes regenerated from the
settings into the run folder). The CLI (cli.py) checks the options and calls ``run``."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from inferwatch.common.supervise import ManagedProcess
    from inferwatch.config.settings import Settings
    from inferwatch.deploy.monitoring import Targets


# `--ha`: the second Prometheus and Alertmanager listen this far above the first's ports.
HA_PORT_OFFSET = 100


class StackError(Exception):
    """What keeps the stack from starting or running, said to the user as it is."""


@dataclass(frozen=True)
class StackOptions:
    """`inferwatch up`'s options, checked (cli.py says what each is)."""

    model: str  # resolved: a model folder or a Hugging Face id
    served_model_name: str
    vllm_port: int
    gateway_port: int
    exporter_port: int  # 0: no exporter
    drift_port: int  # 0: no drift service
    prometheus_port: int  # 0: no Prometheus, Alertmanager or pager
    alertmanager_port: int
    pager_port: int
    supervisor_port: int
    canary_port: int  # 0: no slow canary
    canary_delay: float
    host: str
    dtype: str
    max_model_len: int
    vllm_args: tuple[str, ...]
    otlp_endpoint: str | None
    pagerduty_routing_key_file: Path | None
    heartbeat_url: str | None
    rules_dir: Path | None
    fast_alerting: bool
    startup_timeout: float
    run_dir: Path
    monitoring_only: bool
    config: Path | None = None  # inferwatch.yaml: the gateway judges goodput by its SLOs
    lora_modules: tuple[tuple[str, str], ...] = ()  # LoRA adapters vLLM serves beside the model: (name, folder)
    ha: bool = False  # two Prometheus servers and two Alertmanagers in a cluster (HA_PORT_OFFSET)


def run(o: StackOptions, settings: Settings) -> None:
    """Start everything ``o`` asks for and keep it running until Ctrl-C or SIGTERM."""
    from inferwatch.common.supervise import ManagedProcess
    from inferwatch.serving.vllm_launcher import VLLMConfig, vllm_process

    run_dir = o.run_dir.resolve()
    canary_port = o.canary_port  # 0 when an experiment file of the user's is set
    cli = [sys.executable, "-m", "inferwatch"]

    def child(name: str, key: str, argv: list[str], port: int, health: str = "/health",
              env: dict[str, str] | None = None) -> ManagedProcess:
        return ManagedProcess(f"{name} (:{port})", cli + argv, log_path=run_dir / f"{key}.log",
                              health_url=f"http://{o.host}:{port}{health}", key=key,
                              env={**os.environ, **env} if env else None)

    children: list[tuple[ManagedProcess, float]] = []
    urls: dict[str, Any] = {}
    if not o.monitoring_only:
        cfg = VLLMConfig(o.model, o.served_model_name, o.host, o.vllm_port, o.max_model_len, o.dtype,
                         otlp_traces_endpoint=o.otlp_endpoint, startup_timeout_s=o.startup_timeout,
                         extra_args=o.vllm_args, lora_modules=o.lora_modules)
        gw_argv = ["gateway", "--host", o.host, "--port", str(o.gateway_port), "--upstream-url", cfg.base_url]
        if o.otlp_endpoint:
            gw_argv += ["--otlp-endpoint", o.otlp_endpoint]
        if o.config is not None:
            gw_argv += ["--config", str(o.config.resolve())]
        children.append((vllm_process(cfg, run_dir / "vllm.log"), o.startup_timeout))
        gw_env = {**(_admin_token_env(run_dir) or {}), **(_tenants_env(run_dir) or {})} or None
        if canary_port and os.environ.get("INFERWATCH_GATEWAY_EXPERIMENT_FILE"):
            typer.echo("INFERWATCH_GATEWAY_EXPERIMENT_FILE is set: the gateway runs those experiments, without the "
                       "demo's slow canary")
            canary_port = 0
        if canary_port:
            relay_url = f"http://{o.host}:{canary_port}"
            experiments = _demo_experiment(run_dir, o.served_model_name, cfg.base_url, relay_url)
            gw_argv += ["--experiment-file", str(experiments)]
            children.append((child("slow canary (demo)", "canary", [
                "slow-relay", "--host", o.host, "--port", str(canary_port), "--upstream", f"{o.host}:{o.vllm_port}",
                "--delay", str(o.canary_delay)], canary_port), 30.0))
        if o.drift_port:
            gw_argv += ["--drift-url", f"http://{o.host}:{o.drift_port}"]
            children.append((child("drift service", "drift", ["drift", "serve", "--host", o.host, "--port",
                                                               str(o.drift_port), "--db-path",
                                                               str(run_dir / "drift.sqlite3")], o.drift_port), 30.0))
        children.append((child("gateway", "gateway", gw_argv, o.gateway_port, env=gw_env), 30.0))
        gw_url = f"http://{o.host}:{o.gateway_port}"
        urls.update({
            "OpenAI endpoint (gateway)": f"{gw_url}/v1",
            "gateway /metrics": f"{gw_url}/metrics",
            "vLLM /metrics": f"{cfg.base_url}/metrics",
        })
        if canary_port:
            urls[f"slow canary of {o.served_model_name}-ab (demo)"] = f"http://{o.host}:{canary_port}"
        if o.drift_port:
            urls["drift report"] = f"http://{o.host}:{o.drift_port}/report"
            urls["drift /metrics"] = f"http://{o.host}:{o.drift_port}/metrics"
        if o.exporter_port:
            children.append((child("GPU exporter", "exporter", ["exporter", "--host", o.host, "--port",
                                                                 str(o.exporter_port)], o.exporter_port,
                                   env={"INFERWATCH_EXPORTER_WATCH_PATHS": ",".join(_watched(run_dir))}), 30.0))
            urls["GPU exporter /metrics"] = f"http://{o.host}:{o.exporter_port}/metrics"
    if o.prometheus_port:
        from inferwatch.deploy.monitoring import Targets

        def at(port: int) -> str:
            return f"{o.host}:{port}"

        halves = (0, HA_PORT_OFFSET) if o.ha else (0,)
        targets = Targets(prometheus=tuple(at(o.prometheus_port + d) for d in halves),
                          alertmanager=tuple(at(o.alertmanager_port + d) for d in halves),
                          gateway=(at(o.gateway_port),), vllm=((at(o.vllm_port), o.served_model_name),),
                          exporter=(at(o.exporter_port),) if o.exporter_port else (),
                          drift=(at(o.drift_port),) if o.drift_port else (), supervisor=(at(o.supervisor_port),))
        pager = child("local pager", "pager", ["pager", "--host", o.host, "--port", str(o.pager_port)], o.pager_port)
        children += _monitoring_children(run_dir, targets, pager, o.pagerduty_routing_key_file, o.heartbeat_url,
                                         o.rules_dir, settings, o.fast_alerting)
        urls["Prometheus"] = " ".join(f"http://{t}" for t in targets.prometheus)
        urls["Prometheus alerts"] = lambda: _alerts_page(f"http://{o.host}:{o.prometheus_port}")
        urls["Alertmanager"] = " ".join(f"http://{t}" for t in targets.alertmanager)
        urls["local pager (pages as JSON)"] = f"http://{o.host}:{o.pager_port}/events"
    urls["supervisor /metrics"] = f"http://{o.host}:{o.supervisor_port}/metrics"
    urls["logs"] = str(run_dir)
    supervise(children, urls, (o.host, o.supervisor_port))


def _admin_token_env(run_dir: Path) -> dict[str, str] | None:
    """The gateway's admin endpoints on (the demo and `inferwatch experiment` use them): a
    random token in <run-dir>/gateway_admin_token, readable by this user only, unless the
    environment already gives one."""
    import secrets

    if os.environ.get("INFERWATCH_GATEWAY_ADMIN_TOKEN") or os.environ.get("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE"):
        return None
    path = run_dir / "gateway_admin_token"
    run_dir.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or not path.read_text().strip():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return {"INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE": str(path)}


DEMO_TENANTS = ("search", "support-bot", "research")


def _tenants_env(run_dir: Path) -> dict[str, str] | None:
    """Three demo tenants, one key each (<run-dir>/demo_tenant_keys, this user's only), in a
    limits file of their own: search is critical with a daily token budget, support-bot has
    a monthly dollar budget, research none; requests without a key stay served (anonymous).
    Not when the environment gives the gateway keys or a limits file of its own."""
    import secrets

    from inferwatch.serving.admission import key_id

    if any(os.environ.get(f"INFERWATCH_GATEWAY_{name}") for name in ("API_KEYS", "API_KEYS_FILE", "LIMITS_FILE")):
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    keys_path = run_dir / "demo_tenant_keys"
    keys = keys_path.read_text().split() if keys_path.is_file() else []
    if len(keys) != len(DEMO_TENANTS):
        keys_path.touch(mode=0o600)
        keys = [f"sk-demo-{tenant}-{secrets.token_urlsafe(12)}" for tenant in DEMO_TENANTS]
        keys_path.write_text("\n".join(keys) + "\n")
    keys_path.chmod(0o600)
    ids = dict(zip(DEMO_TENANTS, (key_id(k) for k in keys)))
    limits = run_dir / "limits.yaml"
    limits.write_text(f"""# written by `inferwatch up`: the demo's tenants (docs/tenants.md); keys in demo_tenant_keys
default_price: {{input: 0.2, output: 0.6}}
tenants:
  search: {{keys: [{ids['search']}], critical: true, budget: {{tokens: 5000000, period: day}}}}
  support-bot: {{keys: [{ids['support-bot']}], budget: {{dollars: 5, period: month}}}}
  research: {{keys: [{ids['research']}]}}
""")
    return {"INFERWATCH_GATEWAY_API_KEYS_FILE": str(keys_path), "INFERWATCH_GATEWAY_ALLOW_ANONYMOUS": "true",
            "INFERWATCH_GATEWAY_LIMITS_FILE": str(limits)}


def _demo_experiment(run_dir: Path, served: str, stable_url: str, canary_url: str) -> Path:
    """The A/B experiment the demo's canary scenario ramps: MODEL-ab split between vLLM
    ('stable', all traffic) and vLLM behind the slow relay ('canary', none until ramped)."""
    import yaml

    path = run_dir / "experiments.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"experiments": {f"{served}-ab": {"name": "demo-canary", "variants": [
        {"name": "stable", "upstream_url": stable_url, "model": served, "weight": 1.0},
        {"name": "canary", "upstream_url": canary_url, "model": served, "weight": 0.0}]}}}, sort_keys=False))
    return path


def _alerts_page(prometheus_url: str) -> str:
    """Prometheus's alerts page: /alerts, or /classic/alerts in builds without the new UI
    (Debian's package)."""
    from inferwatch.common.supervise import http_ok

    return next((f"{prometheus_url}{p}" for p in ("/alerts", "/classic/alerts") if http_ok(f"{prometheus_url}{p}")),
                f"{prometheus_url}/alerts")


def _watched(run_dir: Path) -> list[str]:
    """What can fill up under the local stack, for the disk alerts: the run folder (Prometheus's
    TSDB and the drift database), the model cache, and Hugging Face's cache where it exists."""
    from inferwatch.serving.tiny_model import default_cache_dir

    hf = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return [str(run_dir)] + [str(p) for p in (default_cache_dir(), hf) if p.is_dir()]


def _monitoring_children(run_dir: Path, targets: Targets, pager: ManagedProcess, pagerduty_key: Path | None,
                         heartbeat_url: str | None, rules_dir: Path | None, settings: Settings,
                         fast: bool) -> list[Any]:
    """The local pager, Alertmanager and Prometheus, configured by the same functions as deploy/,
    from the settings (rules and routes regenerated into the run folder)."""
    from inferwatch.alerts.generate import rule_files, write
    from inferwatch.alerts.routing import Receivers
    from inferwatch.alerts.spec import build
    from inferwatch.deploy.monitoring import (
        FAST_HA_INTERVALS,
        FAST_INTERVALS,
        Intervals,
        alertmanager_process,
        prometheus_process,
        replica_names,
        write_local_configs,
    )

    assert pager.health_url is not None  # child() gives every process one
    hooks = pager.health_url.removesuffix("/health") + "/hooks"
    heartbeat_url = heartbeat_url or settings.routing.heartbeat_url
    receivers = Receivers(f"{hooks}/pager", f"{hooks}/ticket", heartbeat_url or f"{hooks}/deadman",
                          str(pagerduty_key.resolve()) if pagerduty_key else None)
    intervals = (FAST_HA_INTERVALS if len(targets.prometheus) > 1 else FAST_INTERVALS) if fast else Intervals()
    if rules_dir is None:  # the shipped rules, without absent() guards for parts left out
        rules_dir = run_dir / "rules"
        write(rule_files(build(settings), jobs=targets.jobs()), rules_dir)
    prom_cfgs, am_cfg = write_local_configs(run_dir, targets, receivers, intervals, rules_dir, settings.routing)
    children: list[Any] = [(pager, 30.0)]
    for i, address in enumerate(targets.alertmanager):
        host, _, port = address.rpartition(":")
        key = "alertmanager" if i == 0 else f"alertmanager-{chr(ord('a') + i)}"
        peers = tuple(a for a in targets.alertmanager if a != address)
        children.append((alertmanager_process(am_cfg, run_dir / key / "data", host, int(port), run_dir / f"{key}.log",
                                              peers, key), 60.0))
    for replica, address, config in zip(replica_names(targets), targets.prometheus, prom_cfgs):
        host, _, port = address.rpartition(":")
        key = "prometheus" if replica in (None, "a") else f"prometheus-{replica}"
        children.append((prometheus_process(config, config.parent / "data", host, int(port), run_dir / f"{key}.log",
                                            intervals, key=key), 60.0))
    return children


def supervise(children: list[Any], urls: dict[str, Any], metrics_at: tuple[str, int] | None = None) -> None:
    """Start children in order (each healthy before the next), print URLs, then keep them
    running: a child that exits is restarted with backoff while the others carry on.
    Ctrl-C or SIGTERM stops all, in reverse order."""
    from prometheus_client import CollectorRegistry, start_http_server

    from inferwatch.common.supervise import StartupError, Supervisor, port_taken

    taken = [f"{proc.name}: {proc.health_url}" for proc, _ in children if proc.health_url and port_taken(proc.health_url)]
    if taken:
        raise StackError("These ports are in use (another `inferwatch up`?); stop it or choose other ports:\n  "
                         + "\n  ".join(taken))
    started = []
    stopping = False
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, say=lambda line: typer.secho(line, err=True, fg=typer.colors.YELLOW))

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if metrics_at:
        try:
            start_http_server(metrics_at[1], addr=metrics_at[0], registry=registry)
        except OSError as exc:
            raise StackError(f"Cannot serve the supervisor's metrics on {metrics_at[0]}:{metrics_at[1]}: {exc} "
                             "(is another `inferwatch up` running? --supervisor-port picks another port)") from exc
    try:
        for proc, timeout in children:
            typer.echo(f"starting {proc.name} (log: {proc.log_path or 'stdout'}) ...")
            proc.start()
            started.append(proc)
            took = proc.wait_healthy(timeout, cancelled=lambda: stopping)
            if took is None:
                return
            typer.echo(f"  {proc.name} healthy after {took:.1f}s")
            supervisor.adopt(proc)
        width = max(len(k) for k in urls)
        typer.echo("\ninferwatch is up:")
        for label, url in urls.items():
            typer.echo(f"  {label:<{width}}  {url() if callable(url) else url}")
        typer.echo("\nCtrl-C stops everything.")
        while not stopping:
            supervisor.poll()
            time.sleep(0.5)
    except StartupError as exc:
        raise StackError(str(exc)) from exc
    finally:
        for proc in reversed(started):
            typer.echo(f"stopping {proc.name} ...")
            proc.stop()
