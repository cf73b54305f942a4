"""The ``inferwatch`` command: one entry point for every part of the stack."""

from __future__ import annotations

import logging
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import typer

if TYPE_CHECKING:
    from inferwatch.config.settings import Settings
    from inferwatch.serving.settings import GatewaySettings
    from inferwatch.serving.workers import WorkerSlot

T = TypeVar("T")

app = typer.Typer(help="inferwatch: observability and drift monitoring for LLMs served by vLLM.",
                  no_args_is_help=True, add_completion=False)
model_app = typer.Typer(help="The tiny local model used when no real model is given.", no_args_is_help=True)
app.add_typer(model_app, name="model")
drift_app = typer.Typer(help="The drift service and its report.", no_args_is_help=True)
app.add_typer(drift_app, name="drift")
dashboards_app = typer.Typer(help="The generated Grafana dashboards.", no_args_is_help=True)
app.add_typer(dashboards_app, name="dashboards")
experiment_app = typer.Typer(help="A/B experiments at the gateway (its admin endpoint).", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")

DEFAULT_RUN_DIR = Path(".run")


def _tune_gc() -> None:
    """For the request-serving processes, once everything is imported and built: move the
    long-lived objects (modules, app, metric children) out of the collector's sight and
    enlarge the young generation. Fewer, shorter pauses: the gateway's p99 at 32 concurrent
    requests fell from ~36 ms to ~8 ms with it (bench/gateway_overhead.py). A young
    generation this large is only cheap because requests leave no cycles for it
    (tests/serving/test_no_cycles.py): with one per request, its pauses were the p99 at one
    request at a time (1.1–2.3 ms, against 0.37 ms without)."""
    import gc

    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def _settings(cls: type[T], what: str, **flags: object) -> T:
    """One settings object from flags given on the command line (unset ones fall back to the
    environment and defaults); invalid values exit 2 with pydantic's per-field message, and
    an unreadable ``*_FILE`` secret with the file it names."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        _fail(f"Invalid {what} settings:\n{exc}")
    except SettingsError as exc:
        _fail(f"Invalid {what} settings: {exc}")


def _fail(message: str) -> NoReturn:
    typer.secho(message, err=True, fg=typer.colors.RED)
    raise typer.Exit(2)


ConfigOption = Annotated[Path | None, typer.Option(
    "--config", envvar="INFERWATCH_CONFIG", help="A team's settings (inferwatch.yaml); default: the defaults, "
                                                  "which make the repository's committed files.")]


def _checked_settings(config: Path | None) -> Settings:
    """The settings of ``config`` checked as a whole (each field, then what only the built spec
    can tell); every problem printed as FILE:LINE:COLUMN: field.path: message, then exit 2."""
    from inferwatch.alerts.spec import build
    from inferwatch.config.errors import ConfigError, SettingsInvalid
    from inferwatch.config.load import locate, read
    from inferwatch.config.settings import Settings

    if config is None:
        return Settings()
    try:
        settings, text = read(config)
        build(settings)
    except SettingsInvalid as exc:
        _fail(str(exc))
    except ConfigError as exc:
        _fail(str(locate(exc, text, str(config))))
    return settings


@app.command()
def validate(config: Annotated[Path, typer.Argument(help="The settings file (inferwatch.yaml).")]) -> None:
    """Check a settings file: each problem with its line, column and field; exit 2 if any."""
    _checked_settings(config)
    typer.echo(f"{config}: valid")


@app.command()
def generate(
    config: ConfigOption = None,
    out: Annotated[Path, typer.Option(help="Folder to write into, in the repository's layout (alerts/rules, "
                                           "dashboards/json, deploy/...).")] = Path("generated"),
) -> None:
    """Write every generated file (rules, Prometheus and Alertmanager configs, dashboards, the
    Kubernetes tree, the settings' JSON Schema) from a settings file. Files no longer made are
    removed from the generated folders; unchanged files are left as they are."""
    from inferwatch.generate import artifacts, write

    files = artifacts(_checked_settings(config))
    changed = write(files, out)
    for path in changed:
        typer.echo(f"{'wrote' if path in files else 'removed'} {out / path}", err=True)
    typer.echo(f"{len(files)} generated files in {out}, {len(changed)} changed", err=True)


@app.command()
def schema() -> None:
    """Print the JSON Schema of inferwatch.yaml (for an editor's completion and checks)."""
    from inferwatch.config.load import schema_text

    typer.echo(schema_text(), nl=False)


@model_app.command("build")
def model_build(
    cache_dir: Annotated[Path | None, typer.Option(
        help="Cache root (default $INFERWATCH_CACHE_DIR or ~/.cache/inferwatch).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if an identical build exists.")] = False,
) -> None:
    """Build the seeded tiny Llama (random weights, local tokenizer) and print its folder. No download."""
    from inferwatch.serving.tiny_model import build_tiny_model

    typer.echo(build_tiny_model(cache_dir, force=force))


def _vllm_args(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        _fail(f"--vllm-args / INFERWATCH_VLLM_ARGS cannot be split into arguments ({exc}): {text[:200]!r}")


def _tiny_adapter(model: str) -> tuple[tuple[str, str], ...]:
    """The tiny model's LoRA adapter, served beside it (``model`` resolved: 'tiny', or the
    tiny model's folder) so the stack shows adapters; none for any other model, whose adapters
    are the user's to give with --vllm-args."""
    from inferwatch.serving.tiny_model import ADAPTER_NAME, build_tiny_adapter, is_built

    if not is_built(Path(model)):
        return ()
    return ((ADAPTER_NAME, str(build_tiny_adapter(Path(model)))),)


def _resolve_model(model: str) -> str:
    if model != "tiny":
        return model
    from inferwatch.serving.tiny_model import build_tiny_model

    return str(build_tiny_model())


@app.command()
def vllm(
    model: Annotated[str, typer.Option(help="Model folder or id; 'tiny' builds and serves the local tiny model.")] = "tiny",
    served_model_name: Annotated[str, typer.Option("--name", help="Model name clients use.")] = "tiny-llama",
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int = 512,
    dtype: Annotated[str, typer.Option(help="vLLM --dtype (bfloat16 on the CPU build).")] = "auto",
    otlp_endpoint: Annotated[str | None, typer.Option(help="OTLP traces endpoint for vLLM's llm_request spans.")] = None,
    startup_timeout: Annotated[float, typer.Option(help="Seconds to wait for /health.")] = 300.0,
    vllm_args: Annotated[str, typer.Option(
        envvar="INFERWATCH_VLLM_ARGS", help="More arguments for vLLM, in one string (e.g. '--enforce-eager': "
                                            "no torch.compile, a start about twice as fast on the CPU).")] = "",
    run_dir: Annotated[Path, typer.Option(help="Folder for logs.")] = DEFAULT_RUN_DIR,
    log_file: Annotated[str | None, typer.Option(
        help="vLLM's log; '-' passes its output through to this process's (a container's log). "
             "Default: <run-dir>/vllm.log.")] = None,
) -> None:
    """Run vLLM's OpenAI server (CPU or CUDA build) in the foreground until Ctrl-C."""
    from inferwatch.local_stack import StackError, supervise
    from inferwatch.serving.vllm_launcher import VLLMConfig, vllm_process

    cfg = VLLMConfig(_resolve_model(model), served_model_name, host, port, max_model_len, dtype,
                     otlp_traces_endpoint=otlp_endpoint, startup_timeout_s=startup_timeout,
                     extra_args=_vllm_args(vllm_args))
    log_path = None if log_file == "-" else Path(log_file) if log_file else run_dir / "vllm.log"
    try:
        supervise([(vllm_process(cfg, log_path), startup_timeout)], urls={"vLLM": cfg.base_url})
    except StackError as exc:
        _fail(str(exc))


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Listen address [INFERWATCH_GATEWAY_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [INFERWATCH_GATEWAY_PORT].")] = None,
    upstream_url: Annotated[str | None, typer.Option(
        help="vLLM base URL; several replicas comma-separated [INFERWATCH_GATEWAY_UPSTREAM_URL].")] = None,
    variant: Annotated[str | None, typer.Option(help="Model version label [INFERWATCH_GATEWAY_VARIANT].")] = None,
    otlp_endpoint: Annotated[str | None, typer.Option(help="OTLP endpoint; none disables tracing.")] = None,
    otlp_protocol: Annotated[str | None, typer.Option(help="http/protobuf or grpc.")] = None,
    trace_sample_ratio: Annotated[float | None, typer.Option(help="Share of new traces sampled, 0..1.")] = None,
    drift_url: Annotated[list[str] | None, typer.Option(
        help="Drift service base URL for feature records and ratings; repeat it for a drift pair, each gets "
             "everything [INFERWATCH_GATEWAY_DRIFT_URL, INFERWATCH_GATEWAY_DRIFT_URLS].")] = None,
    limits_file: Annotated[Path | None, typer.Option(
        help="YAML limits per API key and model, re-read when it changes [INFERWATCH_GATEWAY_LIMITS_FILE].")] = None,
    experiment_file: Annotated[Path | None, typer.Option(
        help="YAML experiments: variants and weights per public model [INFERWATCH_GATEWAY_EXPERIMENT_FILE].")] = None,
    config: Annotated[Path | None, typer.Option(
        help="inferwatch.yaml, whose SLOs goodput is judged by; their defaults without one "
             "[INFERWATCH_GATEWAY_CONFIG_FILE].")] = None,
    redis_url: Annotated[str | None, typer.Option(
        help="Redis shared by the gateway's replicas: weights, feedback memory, limits "
             "[INFERWATCH_GATEWAY_REDIS_URL]; none keeps them in this process.")] = None,
    workers: Annotated[int | None, typer.Option(
        help="Processes serving the port, one core each, one /metrics for all; above 1 needs --redis-url "
             "[INFERWATCH_GATEWAY_WORKERS].")] = None,
    log_level: str = "warning",
) -> None:
    """Run the instrumented OpenAI-compatible gateway. Every setting also reads INFERWATCH_GATEWAY_*."""
    from inferwatch.serving import workers as worker_processes
    from inferwatch.serving.settings import GatewaySettings

    settings = _settings(GatewaySettings, "gateway", host=host, port=port, upstream_url=upstream_url,
                         variant=variant, otlp_endpoint=otlp_endpoint, otlp_protocol=otlp_protocol,
                         trace_sample_ratio=trace_sample_ratio, drift_urls=drift_url or None, limits_file=limits_file,
                         experiment_file=experiment_file, config_file=config, redis_url=redis_url, workers=workers)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.workers == 1:
        raise typer.Exit(_serve_gateway(settings, log_level))
    try:
        worker_processes.check_port(settings.host, settings.port)
    except OSError as exc:
        _fail(f"gateway: cannot listen on {settings.host}:{settings.port}: {exc}")

    def serve_worker(slot: WorkerSlot) -> int:
        try:
            return _serve_gateway(settings, log_level, slot)
        except typer.Exit as exc:  # _fail in a worker: its message is printed, its code is the worker's
            return exc.exit_code

    raise typer.Exit(worker_processes.run(settings.workers, serve_worker))


def _serve_gateway(settings: GatewaySettings, log_level: str, worker: WorkerSlot | None = None) -> int:
    """One gateway process to its end: the only one, or ``worker`` of several."""
    import socket

    import uvicorn

    from inferwatch.config.errors import SettingsInvalid
    from inferwatch.serving.admission import PolicyError
    from inferwatch.serving.gateway import create_app
    from inferwatch.serving.server import uvicorn_options
    from inferwatch.serving.split import ExperimentError
    from inferwatch.serving.workers import reuse_port_socket

    try:
        app = create_app(settings, worker=worker)
    except (OSError, PolicyError) as exc:
        _fail(f"gateway: cannot use the limits or experiment file: {exc}")
    except ExperimentError as exc:
        _fail(f"gateway: cannot use the experiment file: {exc}")
    except SettingsInvalid as exc:
        _fail(f"gateway: cannot use the settings file (its SLOs are goodput's objectives):\n{exc}")
    _tune_gc()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                            **uvicorn_options(app.state.gateway.proxy, settings.limit_concurrency))
    sockets: list[socket.socket] | None = None
    if worker is not None:
        sockets = [reuse_port_socket(settings.host, settings.port)]
    server = uvicorn.Server(config)
    server.run(sockets=sockets)
    return 0 if server.started else 3  # as uvicorn.run: 3 when it never listened


GatewayOption = Annotated[str, typer.Option(envvar="INFERWATCH_GATEWAY_URL", help="The gateway's base URL.")]
TokenOption = Annotated[str, typer.Option(envvar="INFERWATCH_GATEWAY_ADMIN_TOKEN", show_default=False,
                                          help="The gateway's admin token.")]


def _admin_call(method: str, url: str, token: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One admin request; an error answer exits 2 with the gateway's message."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        _fail(f"{method} {url}: {exc.code}: {message}")
    except OSError as exc:
        _fail(f"{method} {url}: {exc}")


def _print_experiment(exp: dict[str, Any]) -> None:
    typer.echo(f"{exp['model']}: experiment {exp['experiment']} (control {exp['control']})")
    for v in exp["variants"]:
        typer.echo(f"  {v['name']:<16} {v['weight'] * 100:7.2f} %  {v['model']} at {v['upstream_url']}")


def _weight(pair: str) -> tuple[str, float]:
    name, sep, value = pair.partition("=")
    if not sep or not name:
        raise typer.BadParameter(f"{pair!r}: write VARIANT=WEIGHT, e.g. canary=5% or canary=0.05")
    try:
        number = float(value[:-1]) if value.endswith("%") else float(value)
    except ValueError:
        raise typer.BadParameter(f"{pair!r}: the weight must be a number (0..1) or a percentage") from None
    if not math.isfinite(number) or (number == 0 and any(c in "123456789" for c in value.partition("e")[0])):
        # nan and inf are not weights; 1e-400 would silently be 0, a rollback nobody asked for
        raise typer.BadParameter(f"{pair!r}: the weight must be a finite number (0..1) or a percentage, and not "
                                 "too small to tell from 0")
    return name, number / 100 if value.endswith("%") else number


@experiment_app.command("show")
def experiment_show(gateway_url: GatewayOption = "http://127.0.0.1:8080", token: TokenOption = "") -> None:
    """Print every experiment with its current weights."""
    for exp in _admin_call("GET", f"{gateway_url.rstrip('/')}/admin/experiments", token)["experiments"]:
        _print_experiment(exp)


@experiment_app.command("set-weights")
def experiment_set_weights(
    model: Annotated[str, typer.Argument(help="The public model name.")],
    weights: Annotated[list[str], typer.Argument(help="VARIANT=WEIGHT (0..1, or a percentage like 5%); one variant "
                                                      "may be left out and gets the rest.")],
    gateway_url: GatewayOption = "http://127.0.0.1:8080",
    token: TokenOption = "",
) -> None:
    """Change an experiment's weights at run time: a ramp step (canary=5%) or a rollback (canary=0)."""
    pairs = [_weight(p) for p in weights]
    given = dict(pairs)
    if len(given) < len(pairs):
        twice = sorted({n for n, _ in pairs if sum(1 for m, _ in pairs if m == n) > 1})
        raise typer.BadParameter(f"a variant given twice: {', '.join(twice)} (give each one weight)")
    url = f"{gateway_url.rstrip('/')}/admin/experiments/{model}/weights"
    _print_experiment(_admin_call("PUT", url, token, {"weights": given}))


@app.command("check-secrets")
def check_secrets(
    required: Annotated[list[str], typer.Argument(help="VAR=PATH: a secret file that must hold a value.")],
    optional: Annotated[list[str] | None, typer.Option(
        help="VAR=PATH: a secret file that may be empty (left unset).")] = None,
) -> None:
    """Check secret files before anything uses them: every one readable UTF-8 text, the
    required ones not empty. The compose stack runs it first, so a bad secret stops `up`
    before any service starts; VAR is the setting that names the file on the host."""
    from pydantic_settings import SettingsError

    from inferwatch.common.secret_files import read_secret

    problems = []
    for pair, is_optional in [(p, False) for p in required] + [(p, True) for p in optional or []]:
        var, sep, path = pair.partition("=")
        if not sep or not var or not path:
            _fail(f"{pair!r}: expected VAR=PATH")
        try:
            read_secret(var, path, optional=is_optional)
        except SettingsError as exc:
            problems.append(str(exc))
    if problems:
        _fail("\n".join(problems) + "\n(`make secrets` writes a random value into each default file under "
              "deploy/secrets/ that is missing or empty; each must be readable by the container's user)")
    typer.echo(f"{len(required) + len(optional or [])} secrets readable")


@app.command("key-id")
def key_id_command(key: Annotated[str, typer.Argument(help="An API key of the gateway.")]) -> None:
    """Print the id a limits file and the logs use for an API key (never the key itself)."""
    from inferwatch.serving.admission import key_id

    typer.echo(key_id(key))


@app.command()
def exporter(
    host: Annotated[str | None, typer.Option(help="Listen address [INFERWATCH_EXPORTER_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [INFERWATCH_EXPORTER_PORT], default 9400.")] = None,
    interval: Annotated[float | None, typer.Option(help="Seconds between NVML samples, default 1.")] = None,
    slow_interval: Annotated[float | None, typer.Option(help="Seconds between process-list samples, default 10.")] = None,
    processes: Annotated[bool | None, typer.Option("--processes/--no-processes",
                                                      help="Export GPU memory per process (pid label).")] = None,
    gpm: Annotated[bool | None, typer.Option("--gpm/--no-gpm", help="GPM metrics on Hopper+, default on.")] = None,
    pod_resources_socket: Annotated[str | None, typer.Option(
        help="The kubelet's pod-resources socket, for which pod uses which GPU; absent, no pod series "
             "[INFERWATCH_EXPORTER_POD_RESOURCES_SOCKET], default /var/lib/kubelet/pod-resources/kubelet.sock.")] = None,
    log_level: str = "info",
) -> None:
    """Run the NVML GPU exporter (USE metrics, XID errors). Without a GPU it serves inferwatch_nvml_up 0."""
    from inferwatch.exporters.server import ExporterSettings, ListenError, serve

    settings = _settings(ExporterSettings, "exporter", host=host, port=port, interval_s=interval,
                         slow_interval_s=slow_interval, processes=processes, gpm=gpm,
                         pod_resources_socket=pod_resources_socket)
    if not isinstance(logging.getLevelName(log_level.upper()), int):
        _fail(f"Unknown --log-level {log_level!r}: use debug, info, warning, error or critical.")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(settings)
    except ListenError as exc:
        _fail(str(exc))


@drift_app.command("serve")
def drift_serve(
    host: Annotated[str | None, typer.Option(help="Listen address [INFERWATCH_DRIFT_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [INFERWATCH_DRIFT_PORT], default 8090.")] = None,
    db_path: Annotated[str | None, typer.Option(help="SQLite file [INFERWATCH_DRIFT_DB_PATH].")] = None,
    window: Annotated[float | None, typer.Option(help="Current window length, seconds (default 3600).")] = None,
    prometheus_url: Annotated[str | None, typer.Option(help="Prometheus for fleet-wide drift.")] = None,
    log_level: str = "warning",
) -> None:
    """Run the drift service: ingest feature records, serve drift as JSON, /metrics and /report."""
    import uvicorn

    from inferwatch.drift.service.app import DriftSettings, create_app

    settings = _settings(DriftSettings, "drift", host=host, port=port, db_path=db_path, window_s=window,
                         prometheus_url=prometheus_url)
    app = create_app(settings)
    _tune_gc()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False)


@drift_app.command("report")
def drift_report(
    url: Annotated[str, typer.Option(help="Drift service base URL.")] = "http://127.0.0.1:8090",
    out: Annotated[Path, typer.Option(help="Where to write the HTML report.")] = Path("drift-report.html"),
    model: Annotated[str | None, typer.Option(help="Only this model.")] = None,
    variant: Annotated[str | None, typer.Option(help="Only this variant.")] = None,
) -> None:
    """Fetch the drift report (reference vs current per feature, with scores) as an HTML file."""
    import urllib.error
    import urllib.parse
    import urllib.request

    query = urllib.parse.urlencode({k: v for k, v in {"model": model, "variant": variant}.items() if v})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/report?{query}", timeout=30) as resp:
            out.write_bytes(resp.read())
    except (urllib.error.URLError, OSError) as exc:
        _fail(f"Could not fetch the report from {url}: {exc}")
    typer.echo(out.resolve())


@dashboards_app.command("preview")
def dashboards_preview(
    prometheus: Annotated[str, typer.Option(help="Prometheus that scrapes the stack.")] = "http://127.0.0.1:9090",
    out: Annotated[Path, typer.Option(help="Folder for one PNG per dashboard.")] = Path("dashboards/previews"),
    minutes: Annotated[float, typer.Option(min=1, help="Time range, ending now.")] = 60.0,
    scrape_interval: Annotated[float, typer.Option(min=0.1, help="Prometheus's scrape interval, seconds.")] = 10.0,
) -> None:
    """Draw every dashboard from a live Prometheus into a PNG, laid out as in Grafana."""
    import requests

    from inferwatch.dashboards.generate import dashboards
    from inferwatch.dashboards.preview import render_all

    try:
        paths = render_all(dashboards(), prometheus.rstrip("/"), out, minutes, scrape_interval)
    except (requests.RequestException, LookupError, ValueError) as exc:  # before OSError: a subclass of it
        _fail(f"Cannot draw the dashboards from {prometheus}: {exc}")
    except OSError as exc:
        _fail(f"Cannot write the previews to {out}: {exc}")
    for path in paths:
        typer.echo(path)


@app.command()
def pager(
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port (Alertmanager posts to /hooks/<receiver>).")] = 9097,
) -> None:
    """Run the local pager: logs each page, ticket and resolution readably; serves them at /events."""
    import uvicorn

    from inferwatch.alerts.pager import create_app

    logging.basicConfig(level="WARNING", format="%(asctime)s %(message)s")
    uvicorn.run(create_app(), host=host, port=port, log_level="warning", access_log=False)


@app.command("slow-relay", hidden=True)
def slow_relay(
    upstream: Annotated[str, typer.Option(help="host:port of vLLM.")],
    host: str = "127.0.0.1",
    port: int = 8001,
    delay: Annotated[float, typer.Option(min=0, max=30, help="Seconds each request is held back.")] = 0.3,
) -> None:
    """The demo's slow canary: vLLM behind a TCP relay that delays what clients send."""
    import asyncio

    from inferwatch.demo.relay import serve

    where, _, number = upstream.rpartition(":")
    if not where or not number.isdigit():
        _fail(f"--upstream must be host:port, got {upstream!r}")
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(host, port, (where, int(number)), delay))
    except OSError as exc:
        _fail(f"slow-relay: cannot listen on {host}:{port}: {exc}")
    except KeyboardInterrupt:
        pass


def _local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


@app.command()
def demo(
    scenario: Annotated[list[str] | None, typer.Option(
        help="Run only these, in the demo's order (repeat it): steady, burst, outage, canary, drift.")] = None,
    pace: Annotated[float, typer.Option(min=0.05, max=10, help="Scales each scenario's traffic phase "
                                                                "(0.5: half as long).")] = 1.0,
    max_requests: Annotated[int, typer.Option(min=1, max=100_000, help="Requests the whole demo may send.")] = 5000,
    gateway_url: str = _local_url(8080),
    vllm_url: str = _local_url(8000),
    prometheus_url: str = _local_url(9090),
    pager_url: str = _local_url(9097),
    drift_url: str = _local_url(8090),
    model: Annotated[str, typer.Option(help="The model steady traffic asks for.")] = "tiny-llama",
    ab_model: Annotated[str | None, typer.Option(help="The public model of the canary's experiment "
                                                          "(default: MODEL-ab, as `inferwatch up` sets it).")] = None,
    admin_token: Annotated[str | None, typer.Option(
        envvar="INFERWATCH_GATEWAY_ADMIN_TOKEN", show_default=False,
        help="The gateway's admin token (default: <run-dir>/gateway_admin_token, written by `inferwatch up`).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="INFERWATCH_DEMO_API_KEY", show_default=False,
                                                   help="An API key of the gateway, if it requires one.")] = None,
    run_dir: Annotated[Path, typer.Option(help="The run folder of `inferwatch up`.")] = DEFAULT_RUN_DIR,
    allow_remote: Annotated[bool, typer.Option(help="Allow URLs off this machine's loopback (the demo floods "
                                                    "and breaks what it targets).")] = False,
) -> None:
    """Drive the local stack (`make up`) through scenarios a newcomer can watch: steady traffic,
    a burst, a vLLM outage, a slow canary in an A/B experiment, a prompt-length drift. Each is
    announced with where its effect shows and checked for it; exit 1 if one was not seen."""
    import requests

    from inferwatch.demo.run import run
    from inferwatch.demo.scenarios import SCENARIOS, Demo
    from inferwatch.demo.stack import DemoError, Stack
    from inferwatch.demo.traffic import Budget, Load

    unknown = sorted(set(scenario or ()) - set(SCENARIOS))
    if unknown:
        raise typer.BadParameter(f"unknown scenario {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}",
                                 param_hint="--scenario")
    chosen = [sc for name, sc in SCENARIOS.items() if not scenario or name in scenario]
    if admin_token is None and (run_dir / "gateway_admin_token").is_file():
        admin_token = (run_dir / "gateway_admin_token").read_text().strip()
    stack = Stack(gateway_url.rstrip("/"), vllm_url.rstrip("/"), prometheus_url.rstrip("/"), pager_url.rstrip("/"),
                  drift_url.rstrip("/"), model, ab_model or f"{model}-ab", admin_token, api_key)
    for name, url in stack.urls().items():
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 (it parses the port)
        except ValueError:
            _fail(f"--{name}-url has no valid port: {url!r}")
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
            _fail(f"--{name}-url must be an http(s) URL, got {url!r}")
    if stack.remote() and not allow_remote:
        _fail("The demo floods what it targets, kills vLLM and changes experiment weights: it runs against "
              f"this machine only. Not on loopback: {', '.join(stack.remote())}. Pass --allow-remote to "
              "target them anyway.")
    down = []
    for name, url in (("gateway", f"{stack.gateway}/health"), ("Prometheus", f"{stack.prometheus}/-/ready")):
        try:
            requests.get(url, timeout=5).raise_for_status()
        except requests.RequestException as exc:
            down.append(f"{name} at {url}: {exc}")
    if down:
        _fail("The stack does not answer (is `make up` running?):\n  " + "\n  ".join(down))
    if any(sc.name == "canary" for sc in chosen):  # before any traffic, not after the outage
        try:
            stack.experiment()
        except (DemoError, requests.RequestException) as exc:
            _fail(f"The canary scenario cannot run: {exc}\n(--scenario picks the others)")
    # the tenants `inferwatch up` declares (and requests without a key): each takes its turn
    tenant_keys = run_dir / "demo_tenant_keys"
    keys: tuple[str | None, ...] = ()
    if api_key is None and tenant_keys.is_file():
        keys = (*tenant_keys.read_text().split(), None)
    load = Load(stack.gateway, Budget(max_requests), api_key, api_keys=keys)
    try:
        results = run(Demo(stack, load, pace, say=typer.echo), chosen)
    except KeyboardInterrupt:
        typer.echo("\nInterrupted. The canary is back at 0 % if it had been ramped; a killed vLLM is restarted by "
                   "`inferwatch up` on its own.")
        raise typer.Exit(130) from None
    if not all(s.seen for _, seen in results for s in seen):
        raise typer.Exit(1)


@app.command()
def up(
    model: Annotated[str, typer.Option(help="Model folder or id; 'tiny' builds the local tiny model.")] = "tiny",
    served_model_name: Annotated[str, typer.Option("--name", help="Model name clients use.")] = "tiny-llama",
    vllm_port: int = 8000,
    gateway_port: int = 8080,
    exporter_port: Annotated[int, typer.Option(help="NVML GPU exporter port; 0 leaves the exporter out.")] = 9400,
    drift_port: Annotated[int, typer.Option(help="Drift service port; 0 leaves it out.")] = 8090,
    prometheus_port: Annotated[int, typer.Option(help="Prometheus port; 0 leaves Prometheus, Alertmanager and the "
                                                      "pager out.")] = 9090,
    alertmanager_port: int = 9093,
    pager_port: Annotated[int, typer.Option(help="Local pager (Alertmanager's webhook receiver).")] = 9097,
    supervisor_port: Annotated[int, typer.Option(help="The supervisor's own /metrics (restarts).")] = 9098,
    canary_port: Annotated[int, typer.Option(
        help="The demo's slow canary: vLLM behind a relay on this port, the 'canary' variant (weight 0) of the "
             "experiment MODEL-ab next to 'stable'; 0 leaves both out.")] = 8001,
    canary_delay: Annotated[float, typer.Option(min=0, max=30, help="Seconds the canary holds each request.")] = 0.3,
    host: str = "127.0.0.1",
    dtype: str = "auto",
    max_model_len: int = 512,
    vllm_args: Annotated[str, typer.Option(
        envvar="INFERWATCH_VLLM_ARGS", help="More arguments for vLLM, in one string (e.g. '--enforce-eager': "
                                            "no torch.compile, a start about twice as fast on the CPU).")] = "",
    otlp_endpoint: Annotated[str | None, typer.Option(help="OTLP endpoint for gateway and vLLM spans.")] = None,
    pagerduty_routing_key_file: Annotated[Path | None, typer.Option(
        envvar="INFERWATCH_PAGERDUTY_ROUTING_KEY_FILE", help="Also page PagerDuty (Events v2) with this key.")] = None,
    heartbeat_url: Annotated[str | None, typer.Option(
        envvar="INFERWATCH_HEARTBEAT_URL",
        help="The dead man's switch: where the always-firing Watchdog goes every minute, on another host "
             "(a healthchecks.io ping URL, a PagerDuty or Opsgenie heartbeat); the local pager by default.")] = None,
    rules_dir: Annotated[Path | None, typer.Option(
        help="Alert rule files (default: the packaged rules, written to <run-dir>/rules).")] = None,
    fast_alerting: Annotated[bool, typer.Option(help="For tests and demos: 1s scrape and evaluation, "
                                                     "short Alertmanager waits.")] = False,
    startup_timeout: float = 300.0,
    run_dir: Annotated[Path, typer.Option(help="Folder for logs and Prometheus/Alertmanager data.")] = DEFAULT_RUN_DIR,
    monitoring_only: Annotated[bool, typer.Option(
        help="Start only Prometheus, Alertmanager and the local pager; they scrape vLLM, the gateway, exporter "
             "and drift service run apart (e.g. `inferwatch gateway`) at the ports given.")] = False,
    config: ConfigOption = None,
    ha: Annotated[bool, typer.Option(
        "--ha", help="Paging that survives losing a monitor: two Prometheus servers with the same rules and targets "
                     "(the second at --prometheus-port + 100) and two Alertmanagers in a gossip cluster (the second "
                     "at --alertmanager-port + 100; each gossips on its port + 1), so a page is sent once with "
                     "either half gone.")] = False,
) -> None:
    """Run the local stack until Ctrl-C: vLLM, drift service, gateway, GPU exporter, then Prometheus,
    Alertmanager and the local pager. A child that crashes is restarted with backoff."""

    if monitoring_only and not prometheus_port:
        _fail("--monitoring-only with --prometheus-port 0 leaves nothing to start.")
    if ha and not prometheus_port:
        _fail("--ha doubles Prometheus and Alertmanager, which --prometheus-port 0 leaves out.")
    if pagerduty_routing_key_file is not None:
        try:
            key = pagerduty_routing_key_file.read_text().strip()
        except OSError as exc:
            _fail(f"Cannot read the PagerDuty routing key file: {exc}")
        if not key:
            _fail(f"The PagerDuty routing key file {pagerduty_routing_key_file} is empty.")
    if heartbeat_url is not None and (urlsplit(heartbeat_url).scheme not in ("http", "https")
                                      or not urlsplit(heartbeat_url).netloc):
        _fail(f"--heartbeat-url must be an http(s) URL, got {heartbeat_url!r}.")
    settings = _checked_settings(config)

    from inferwatch.local_stack import StackError, StackOptions, run

    resolved = model if monitoring_only else _resolve_model(model)
    options = StackOptions(
        resolved, served_model_name, vllm_port, gateway_port, exporter_port,
        drift_port, prometheus_port, alertmanager_port, pager_port, supervisor_port, canary_port, canary_delay, host,
        dtype, max_model_len, _vllm_args(vllm_args), otlp_endpoint, pagerduty_routing_key_file, heartbeat_url,
        rules_dir, fast_alerting, startup_timeout, run_dir, monitoring_only, config,
        () if monitoring_only else _tiny_adapter(resolved), ha)
    try:
        run(options, settings)
    except StackError as exc:
        _fail(str(exc))


