"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the compose file
validates for every profile, mounts only files that exist, runs our CLI with flags it has,
health-checks paths the services serve; the Dockerfile lints and installs what the
Makefile installs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.alerts.pager import create_app as pager_app
from inferwatch.drift.service.app import DriftSettings, create_app as drift_app
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import AppServer, GatewayServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROFILES = ("monitoring", "serving", "gpu", "cpu", "nvml")
HA = ROOT / "deploy/compose/ha.yml"
OVERRIDES = (ROOT / "deploy/compose/ports.yml", ROOT / "deploy/compose/standins.yml", HA)
ENV = {k: v for k, v in os.environ.items() if not k.endswith("_FILE")}  # no .env: the defaults
DOC = yaml.safe_load(COMPOSE.read_text())
ONE_SHOTS = {name for name, svc in DOC["services"].items() if svc.get("restart") == "no"}
OURS = {name: svc for name, svc in DOC["services"].items()
        if svc.get("image", "").startswith("inferwatch") or "build" in svc}


def bin_path(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    assert Path(found).exists(), f"{name} is not installed (make install)"
    return found


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_file_validates_for_each_profile(profile):
    result = subprocess.run([bin_path("docker-compose"), "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
                            cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_compose_file_matches_the_compose_spec_schema():
    result = subprocess.run([bin_path("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_overrides_validate_with_the_compose_file():
    files = [a for f in (COMPOSE, *OVERRIDES) for a in ("-f", str(f))]
    result = subprocess.run([bin_path("docker-compose"), *files, "--profile", "monitoring", "--profile", "serving",
                             "config", "-q"], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_grafana_reads_its_password_from_a_secret_file_and_keeps_anonymous_off():
    grafana = DOC["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "grafana_admin_password" in grafana["secrets"]
    assert "false" in grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"]


def test_only_the_gateway_and_grafana_are_published_by_default():
    published = {name for name, svc in DOC["services"].items() if svc.get("ports")}
    assert published == {"gateway", "grafana"}
    for name in published:
        assert DOC["services"][name]["ports"][0].startswith(f"${{{name.upper()}_BIND:-127.0.0.1}}:"), name
    ports = yaml.safe_load(OVERRIDES[0].read_text())["services"]
    assert set(ports) == {n for n, svc in DOC["services"].items() if n not in published | ONE_SHOTS
                          and n != "redis"}, "ports.yml publishes every other service (Redis stays inside)"
    for name, svc in ports.items():
        assert all(re.match(r"\$\{\w+_BIND:-127\.0\.0\.1\}:", p) for p in svc["ports"]), name


def test_every_serving_and_monitoring_service_waits_for_its_profiles_secrets_check():
    for name, svc in DOC["services"].items():
        for profile in set(svc["profiles"]) & {"monitoring", "serving"}:
            if name not in ONE_SHOTS:
                assert svc["depends_on"][f"{profile}-secrets"] == {"condition": "service_completed_successfully"}, name
    for check in ONE_SHOTS:  # it mounts what every service of its profile mounts
        profile = DOC["services"][check]["profiles"][0]
        needed = {s for svc in DOC["services"].values() if profile in svc["profiles"] for s in svc.get("secrets", [])}
        assert set(DOC["services"][check]["secrets"]) == needed, check


def test_every_service_has_a_profile_healthcheck_and_restart_policy():
    """A one-shot (the secrets checks) is the exception: it runs once and exits."""
    for name, svc in DOC["services"].items():
        assert set(svc["profiles"]) <= set(PROFILES), name
        if name in ONE_SHOTS:
            assert svc["healthcheck"] == {"disable": True}, name
            continue
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert svc.get("restart") == "unless-stopped", name
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in ONE_SHOTS and cond == {"condition": "service_completed_successfully"}, (name, dep)


def test_every_mounted_file_exists():
    for name, svc in DOC["services"].items():
        for volume in svc.get("volumes", []):
            source = re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", volume).split(":")[0]  # a variable's default
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    generated = re.search(r"^COMPOSE_SECRETS := (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    for name, secret in DOC["secrets"].items():  # an optional one's empty default, or `make secrets` writes it
        default = re.search(r":-(\S+)}", secret["file"])[1]
        assert (ROOT / default).exists() if default.endswith(".empty") else default == f"./deploy/secrets/{name}", name
        assert default.endswith(".empty") or name in generated, name


def test_env_example_documents_every_variable_the_compose_files_read():
    used = {v for f in (COMPOSE, *OVERRIDES) for v in re.findall(r"\$\{(\w+)", f.read_text())}
    documented = set(re.findall(r"^(\w+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= documented, used - documented


@pytest.mark.parametrize("name", sorted(OURS))
def test_our_services_pass_only_flags_the_cli_has(name):
    argv = OURS[name]["command"]
    sub = [a for a in argv[:2] if not a.startswith("-") and "=" not in a]
    help_text = subprocess.run([sys.executable, "-m", "inferwatch", *sub, "--help"], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    for flag in (a for a in argv if a.startswith("--")):
        assert flag in help_text, f"{name}: `inferwatch {' '.join(sub)}` has no {flag}"
    for var in OURS[name].get("environment", {}):
        if var.startswith("INFERWATCH_GATEWAY_"):
            setting = var.removeprefix("INFERWATCH_GATEWAY_").lower()
            if setting.endswith("_file") and setting.removesuffix("_file") in GatewaySettings.SECRETS:
                setting = setting.removesuffix("_file")
            assert setting in GatewaySettings.model_fields, var


def _health_path(svc: dict) -> tuple[int, str]:
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)'", " ".join(svc["healthcheck"]["test"]))
    return int(url[1]), url[2]


def test_health_checks_hit_paths_the_services_serve():
    apps = {"pager": lambda: AppServer(pager_app()),
            "drift": lambda: AppServer(drift_app(DriftSettings(db_path=":memory:"))),
            "gateway": lambda: GatewayServer(GatewaySettings(upstream_url="http://127.0.0.1:9"))}
    for name, make in apps.items():
        port, path = _health_path(DOC["services"][name])
        assert port == int(re.search(r"--port\D+(\d+)", " ".join(DOC["services"][name]["command"]))[1])
        with make() as server:
            assert requests.get(f"{server.url}{path}", timeout=5).status_code == 200, name


@pytest.mark.vllm
def test_vllm_health_check_path_is_served_by_vllm(vllm_server):
    for name in ("vllm-gpu", "vllm-cpu"):
        _, path = _health_path(DOC["services"][name])
        assert requests.get(f"{vllm_server.url}{path}", timeout=10).status_code == 200


def _mounts(service: str, doc: dict = DOC) -> dict[str, Path]:
    """Container path → host path of a service's bind mounts, with .env.example's defaults."""
    out = {}
    for volume in doc["services"][service]["volumes"]:
        source, target = re.sub(r"\$\{\w+:-([^}]+)}", r"\1", volume).split(":")[:2]
        if source.startswith(("./", "/")):
            out[target] = ROOT / source
    return out


def _with_ha() -> dict:
    """The compose file as merged with deploy/compose/ha.yml (paths made absolute)."""
    result = subprocess.run([bin_path("docker-compose"), "-f", str(COMPOSE), "-f", str(HA), "--profile", "monitoring",
                             "config"], cwd=ROOT, env=ENV, capture_output=True, text=True, check=True)
    return yaml.safe_load(result.stdout)


def test_the_ha_override_pairs_prometheus_and_clusters_alertmanager():
    doc = _with_ha()
    configs = {name: _mounts(name, doc)["/etc/prometheus/prometheus.yml"].name for name in ("prometheus", "prometheus-b")}
    assert configs == {"prometheus": "prometheus-ha-a.yml", "prometheus-b": "prometheus-ha-b.yml"}
    peers = {name: [a for a in doc["services"][name]["command"] if a.startswith("--cluster.peer=")]
             for name in ("alertmanager", "alertmanager-b")}
    assert peers == {"alertmanager": ["--cluster.peer=alertmanager-b:9094"],
                     "alertmanager-b": ["--cluster.peer=alertmanager:9094"]}
    for name in ("prometheus-b", "alertmanager-b"):  # the second of each, as the first is run
        first = doc["services"][name.removesuffix("-b")]
        assert {k: v for k, v in doc["services"][name].items() if k not in ("volumes", "command")} == \
            {k: v for k, v in first.items() if k not in ("volumes", "command")}, name


@pytest.mark.parametrize("service", ["prometheus", "prometheus (HA)", "prometheus-b (HA)"])
def test_prometheus_config_passes_promtool_with_what_compose_mounts(tmp_path, service):
    """The full check (rule files and file_sd target files read), on the paths the container
    sees, mapped back through the compose mounts: a config that names a file no mount
    provides fails here."""
    name, ha = service.split(" ")[0], service.endswith("(HA)")
    mounts = _mounts(name, _with_ha() if ha else DOC)
    config = mounts.pop("/etc/prometheus/prometheus.yml").read_text()
    for target, source in mounts.items():
        config = config.replace(target + "/", f"{tmp_path / target.strip('/').replace('/', '_')}/")
        (tmp_path / target.strip("/").replace("/", "_")).symlink_to(source)
    (tmp_path / "prometheus.yml").write_text(config)
    result = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") >= 1 + len(list((ROOT / "alerts/rules").glob("*.yml"))), result.stdout
    assert "/etc/prometheus" not in config


def test_grafana_image_reads_the_dashboards_schema_version():
    """Dashboards of schemaVersion 42 (grafana-foundation-sdk 0.0.21) need a Grafana that knows it: 12.3 or later."""
    versions = {json.loads(f.read_text())["schemaVersion"] for f in (ROOT / "dashboards/json").glob("*.json")}
    assert versions == {42}
    env = dict(re.findall(r"^(\w+)=(.*)$", (ROOT / ".env.example").read_text(), re.M))
    for image in (env["GRAFANA_IMAGE"], re.search(r"GRAFANA_IMAGE:-([^}]+)}", COMPOSE.read_text())[1]):
        major, minor = map(int, re.search(r":(\d+)\.(\d+)\.", image).groups())
        assert (major, minor) >= (12, 3), image


def test_grafana_provisioning_has_the_fields_grafana_documents():
    ds = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/inferwatch.yml").read_text())
    assert ds["apiVersion"] == 1
    for d in ds["datasources"]:
        assert {"name", "type", "uid", "url", "access"} <= set(d) and d["access"] in ("proxy", "direct"), d
    prom = next(d for d in ds["datasources"] if d["type"] == "prometheus")
    trace_uids = {d["uid"] for d in ds["datasources"] if d["type"] in ("jaeger", "tempo")}
    assert {x["datasourceUid"] for x in prom["jsonData"]["exemplarTraceIdDestinations"]} <= trace_uids
    providers = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards/inferwatch.yml").read_text())
    assert providers["apiVersion"] == 1
    for p in providers["providers"]:
        assert p["type"] == "file" and p["options"]["path"], p
    # source:target[:ro], the source perhaps `${VAR:-default}`: the target is the last absolute path
    mounted = {m[2]: m[1] for v in DOC["services"]["grafana"]["volumes"]
               if (m := re.match(r"^(.*):(/[^:]+)(?::ro|:rw)?$", v))}
    assert mounted[providers["providers"][0]["options"]["path"]] == "${INFERWATCH_GENERATED:-.}/dashboards/json"


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/compose/standins/Dockerfile"])
def test_dockerfile_lints_clean(dockerfile):
    result = subprocess.run([bin_path("hadolint"), str(ROOT / dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_dockerfile_installs_what_the_makefile_installs():
    """The same pins and the same order: the engine first, then the project, which keeps
    what vLLM resolved (pyproject.toml says why), so the image runs what `make test` tests."""
    makefile, dockerfile = (ROOT / "Makefile").read_text(), (ROOT / "Dockerfile").read_text()
    for var in ("TORCH_VERSION", "VLLM_PACKAGE"):
        value = re.search(rf"^{var} \?= (\S+)", makefile, re.M)[1]
        assert f"ARG {var}={value}" in dockerfile, var
    make_steps = [makefile.index(step) for step in ('"torch==$(TORCH_VERSION)"', '"$(VLLM_PACKAGE)"',
                                                      "--yes torchvision torchaudio torchcodec", '-e ".[test]"')]
    engine = dockerfile[dockerfile.index("AS engine-build"):dockerfile.index("AS base")]
    image_steps = [engine.index(step) for step in ('"torch==${TORCH_VERSION}"', '"${VLLM_PACKAGE}"',
                                                   "--yes torchvision torchaudio torchcodec", "pip install --no-cache-dir .")]
    assert make_steps == sorted(make_steps) and image_steps == sorted(image_steps)
    assert re.search(r"^USER \d+$", dockerfile, re.M) and "HEALTHCHECK" in dockerfile


def test_engine_image_can_compile_what_vllm_compiles_on_the_cpu():
    """vLLM's CPU platform compiles with torch inductor, which needs a C++ compiler at run
    time; the image installs one and compiles once at build, so a missing one fails the build."""
    engine = (ROOT / "Dockerfile").read_text().split("AS vllm-cpu")[1]
    assert re.search(r"apt-get install .*\bg\+\+", engine) and "torch.compile(" in engine
    assert '"--log-file", "-"' in engine  # vLLM's output goes to `docker logs`


def test_volumes_of_our_services_are_writable_by_the_image_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for name, svc in OURS.items():
        for volume in svc.get("volumes", []):
            source, target = re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", volume).split(":")[:2]
            if not source.startswith("./"):
                assert f"mkdir -p {target} && chown 10001:10001 {target}" in dockerfile, (name, target)


def test_secrets_and_settings_stay_out_of_git_and_images():
    for ignore in (".gitignore", ".dockerignore"):
        text = (ROOT / ignore).read_text()
        assert ".env" in text.split() and any(line.startswith("deploy/secrets") for line in text.splitlines())
    tracked = subprocess.run(["git", "ls-files", "deploy/secrets", ".env"], cwd=ROOT, capture_output=True, text=True)
    assert tracked.stdout.split() == ["deploy/secrets/hf_token.empty", "deploy/secrets/pagerduty_routing_key.empty",
                                      "deploy/secrets/upstream_api_key.empty"]
    for name, svc in DOC["services"].items():  # secrets come as files, never as environment values
        assert not [v for v in svc.get("environment", {}) if re.search(r"TOKEN$|KEY$|SECRET", v)], name


def _make_secrets(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "secrets"], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_make_secrets_writes_each_missing_or_blank_secret_once_and_refuses_a_link(tmp_path):
    (tmp_path / "deploy/secrets").mkdir(parents=True)
    for empty in (ROOT / "deploy/secrets").glob("*.empty"):
        shutil.copy(empty, tmp_path / "deploy/secrets")
    secrets_dir = tmp_path / "deploy/secrets"
    (secrets_dir / "drift_token").write_text(" ,\n")  # no value: rewritten
    (secrets_dir / "gateway_admin_token").write_text("mine\n")  # a value: kept
    first = _make_secrets(tmp_path)
    assert first.returncode == 0, first.stderr
    generated = re.search(r"^COMPOSE_SECRETS := (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    written = {name: (secrets_dir / name).read_text() for name in generated}
    assert written["gateway_admin_token"] == "mine\n" and len(set(written.values())) == len(generated)
    assert all(len(v.strip()) >= 40 for n, v in written.items() if n != "gateway_admin_token")
    assert oct(secrets_dir.stat().st_mode & 0o777) == "0o700"
    assert {oct(f.stat().st_mode & 0o777) for f in secrets_dir.iterdir()} == {"0o644"}
    again = _make_secrets(tmp_path)
    assert again.returncode == 0 and again.stdout == ""
    assert {name: (secrets_dir / name).read_text() for name in generated} == written
    (secrets_dir / "drift_token").unlink()
    (secrets_dir / "drift_token").symlink_to(tmp_path / "elsewhere")
    linked = _make_secrets(tmp_path)
    assert linked.returncode != 0 and "drift_token is a link" in linked.stderr
    assert not (tmp_path / "elsewhere").exists()
