"""The package as a user installs it: the wheel built from the checkout has one import root,
`inferwatch`, carries the files its commands read at run time and no test doubles; installed
into a fresh venv outside the checkout, its `inferwatch up --monitoring-only` starts
Prometheus (with the packaged rules), Alertmanager and the pager, and its gateway answers.

Everything runs from a folder outside the checkout, so a path looked up relative to the source
tree fails here. The fresh venv has no pip and no dependencies of its own: a ``.pth`` line adds
the project venv's site-packages after its own, and since ``.pth`` files are processed only in
site folders, the project's editable-install hook stays inert and ``inferwatch`` resolves only
to the wheel's copy. vLLM, torch and transformers, which the project venv has, are made
unimportable there: what the fresh venv runs is what a venv without the engine runs.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.support.sockets import free_ports
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
# What the build must not see: the same things a fresh clone lacks (.gitignore) plus caches.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv", ".venv-*", "__pycache__", "*.egg-info", ".pytest_cache",
                                        ".hypothesis", ".cache", ".run", "build", "dist", ".env")
# Folders whose every file the commands read at run time (source folder -> data folders in it).
RUN_TIME_DATA = {
    "alerts": ("rules", "templates", "runbooks", "compat"),
    "dashboards": ("json", "provisioning"),
    "deploy": ("alertmanager", "kubernetes", "otel-collector", "prometheus"),
}
TIMEOUT_S = 60
ENGINE = ("vllm", "torch", "transformers")
NO_ENGINE = f"""import importlib.abc, sys


class NoEngine(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {ENGINE!r}:
            raise ImportError(f"{{name}}: not in this venv (tests/inferwatch/test_wheel.py)")
        return None


sys.meta_path.insert(0, NoEngine())
"""


def package_dirs() -> dict[str, str]:
    """Import name -> source folder, as pyproject.toml maps them."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def expected_wheel_files() -> set[str]:
    """Every module of the mapped folders, every run-time data file, and the compose secrets'
    empty placeholders: the wheel must hold exactly these (besides its dist-info)."""
    files = set()
    for package, folder in package_dirs().items():
        files |= {f"{package.replace('.', '/')}/{p.relative_to(REPO / folder)}"
                  for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    for folder, data_dirs in RUN_TIME_DATA.items():
        for data in data_dirs:
            found = [p for p in (REPO / folder / data).rglob("*") if p.is_file()]
            assert found, f"{folder}/{data} is empty in the checkout"
            files |= {f"inferwatch/{p.relative_to(REPO)}" for p in found}
    files |= {f"inferwatch/{p.relative_to(REPO)}" for p in (REPO / "deploy" / "secrets").glob("*.empty")}
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the working tree, so setuptools' build/ leftovers can neither leak
    into the wheel nor land in the checkout."""
    tree = tmp_path_factory.mktemp("tree") / "inferwatch"
    shutil.copytree(REPO, tree, ignore=NOT_IN_A_CLONE)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", str(out), str(tree)],
                           capture_output=True, text=True, timeout=TIMEOUT_S * 2)
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = out.glob("inferwatch-*.whl")
    return built


@dataclass(frozen=True)
class Fresh:
    """A venv with the wheel installed, and a working folder outside the checkout."""

    root: Path
    site_packages: Path
    cwd: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def inferwatch(self) -> str:
        return str(self.root / "bin" / "inferwatch")

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _environment(venv: Path) -> dict[str, str]:
    """This environment without anything that points back into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("INFERWATCH_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(REPO))]
    return {**env, "PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv),
            "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> Fresh:
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=TIMEOUT_S)
    # installed before the dependencies are visible, so pip sees no other inferwatch to replace
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    assert install.returncode == 0, install.stdout + install.stderr
    site_packages = Path(subprocess.run([str(root / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        capture_output=True, text=True, check=True, timeout=TIMEOUT_S).stdout.strip())
    (site_packages / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (site_packages / "no_engine.py").write_text(NO_ENGINE)
    (site_packages / "zz-no-engine.pth").write_text("import no_engine\n")  # after the line above: .pth files by name
    cwd = tmp_path_factory.mktemp("elsewhere")
    assert not cwd.is_relative_to(REPO)
    return Fresh(root, site_packages, cwd, _environment(root))


@contextmanager
def running(fresh: Fresh, log: Path, *argv: str) -> Iterator[subprocess.Popen]:
    """An installed command in the background from outside the checkout; SIGTERM at the end
    (``up`` then stops its children in order), SIGKILL if that takes too long."""
    with open(log, "w") as out:
        proc = subprocess.Popen([fresh.inferwatch, *argv], cwd=fresh.cwd, env=fresh.env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=TIMEOUT_S / 2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def answers(url: str) -> requests.Response | None:
    try:
        return requests.get(url, timeout=2)
    except requests.ConnectionError:
        return None


def running_still(proc: subprocess.Popen, log: Path) -> bool:
    """For a wait on a background command: its exit fails the wait at once, with its log."""
    assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text()}"
    return True


def test_the_wheel_holds_one_import_root_its_run_time_data_and_no_test_doubles(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[0] for n in names - dist_info} == {"inferwatch"}
    assert {n.split("/")[0] for n in dist_info} == {wheel.name.split("-py3")[0] + ".dist-info"}
    top_level = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/top_level.txt").decode()
    assert top_level.split() == ["inferwatch"]

    shipped = names - dist_info
    expected = expected_wheel_files()
    assert not expected - shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert not shipped - expected, f"in the wheel but not meant to ship: {sorted(shipped - expected)}"
    assert not [n for n in shipped if "fake_nvml" in n or {"tests", "bench", "support"} & set(n.split("/"))]
    for needed in ("alerts/rules/alerts.yml", "alerts/rules/slos.yml", "alerts/templates/inferwatch.tmpl",
                   "alerts/runbooks/Watchdog.md", "dashboards/json/inferwatch-serving.json",
                   "dashboards/provisioning/dashboards/inferwatch.yml", "deploy/prometheus/prometheus.yml",
                   "deploy/prometheus/targets/vllm.yml", "deploy/alertmanager/alertmanager.yml",
                   "deploy/kubernetes/base/prometheus-rules.yaml"):
        assert f"inferwatch/{needed}" in shipped, needed


def test_the_installed_package_resolves_into_the_fresh_venv_with_its_data(fresh):
    probe = fresh.run(fresh.python, "-c", """if True:
        import importlib.util, json
        import inferwatch, inferwatch.serving.gateway
        from inferwatch.alerts.generate import RULES_DIR
        from inferwatch.alerts.routing import TEMPLATES_DIR
        from inferwatch.dashboards.generate import JSON_DIR
        from inferwatch.deploy.monitoring import DEPLOY_DIR

        def importable(name):
            try:
                return importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:
                return False

        print(json.dumps({"modules": [inferwatch.__file__, inferwatch.serving.gateway.__file__],
                          "data": {str(d): sorted(p.name for p in d.iterdir())
                                   for d in (RULES_DIR, TEMPLATES_DIR, JSON_DIR, DEPLOY_DIR / "prometheus")},
                          "doubles": [m for m in ("inferwatch.exporters.fake_nvml", "tests.support.fake_nvml")
                                      if importable(m)]}))
    """)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    for path in [*found["modules"], *found["data"]]:
        assert Path(path).is_relative_to(fresh.site_packages), path
    assert all(found["data"].values()), found["data"]
    assert "targets" in found["data"][str(fresh.site_packages / "inferwatch" / "deploy" / "prometheus")]
    assert found["doubles"] == []

    helped = fresh.run(fresh.inferwatch, "up", "--help")  # the console script the wheel declares
    assert helped.returncode == 0 and "--monitoring-only" in helped.stdout, helped.stderr
    nothing = fresh.run(fresh.inferwatch, "up", "--monitoring-only", "--prometheus-port", "0")
    assert nothing.returncode == 2 and "leaves nothing to start" in nothing.stderr, nothing.stderr


@pytest.fixture(scope="module")
def gateway(fresh, tmp_path_factory) -> Iterator[int]:
    """The installed gateway, in front of a vLLM that is not there."""
    port, upstream = free_ports(2)
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with running(fresh, log, "gateway", "--host", "127.0.0.1", "--port", str(port),
                 "--upstream-url", f"http://127.0.0.1:{upstream}") as proc:
        eventually(lambda: running_still(proc, log) and answers(f"http://127.0.0.1:{port}/health"),
                   timeout_s=TIMEOUT_S)
        yield port


def test_the_installed_gateway_answers_health_and_metrics(gateway):
    url = f"http://127.0.0.1:{gateway}"
    assert requests.get(f"{url}/health", timeout=5).json() == {"status": "ok"}
    ready = requests.get(f"{url}/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "not ready"
    metrics = requests.get(f"{url}/metrics", timeout=5)
    assert metrics.status_code == 200 and "# TYPE inferwatch_gateway_" in metrics.text


def test_up_monitoring_only_runs_prometheus_alertmanager_and_pager_from_the_installed_package(fresh, gateway,
                                                                                             tmp_path_factory):
    names = ("vllm", "prometheus", "alertmanager", "pager", "supervisor")
    ports = dict(zip(names, free_ports(len(names))), gateway=gateway)
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    rules_dir = fresh.site_packages / "inferwatch" / "alerts" / "rules"
    run_dir = tmp_path_factory.mktemp("up")
    log = run_dir / "up.log"
    with running(fresh, log, "up", "--monitoring-only", "--fast-alerting", "--rules-dir", str(rules_dir),
                 "--run-dir", str(run_dir), "--exporter-port", "0", "--drift-port", "0",
                 *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port)))) as proc:
        eventually(lambda: running_still(proc, log) and "Ctrl-C stops everything" in log.read_text(),
                   timeout_s=TIMEOUT_S)
        assert not (run_dir / "vllm.log").exists() and not (run_dir / "gateway.log").exists()

        groups = requests.get(f"{url['prometheus']}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {Path(g["file"]).parent for g in groups} == {rules_dir}
        packaged = {rule["alert"] for f in rules_dir.glob("*.yml") for g in yaml.safe_load(f.read_text())["groups"]
                    for rule in g["rules"] if "alert" in rule}
        assert {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"} == packaged
        assert requests.get(f"{url['alertmanager']}/-/ready", timeout=5).status_code == 200
        templates = yaml.safe_load((run_dir / "alertmanager" / "alertmanager.yml").read_text())["templates"]
        assert [Path(t).parent for t in templates] == [fresh.site_packages / "inferwatch" / "alerts" / "templates"]
        assert glob.glob(templates[0]), templates
        assert requests.get(f"{url['pager']}/health", timeout=5).json()["status"] == "ok"

        def scraped() -> dict[str, str]:
            targets = requests.get(f"{url['prometheus']}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return {t["labels"]["job"]: t["health"] for t in targets}

        # the gateway run apart is scraped; the whole path, Prometheus -> Alertmanager -> pager, delivers
        eventually(lambda: scraped().get("inferwatch-gateway") == "up", timeout_s=20)
        eventually(lambda: requests.get(f"{url['pager']}/events", params={"alertname": "Watchdog"},
                                        timeout=5).json()["events"], timeout_s=20)
    assert proc.returncode == 0, log.read_text()
    assert not [name for name in ("prometheus", "alertmanager", "pager") if answers(url[name])], log.read_text()


def test_the_installed_package_validates_and_generates_without_the_engine_or_a_checkout(fresh):
    """``inferwatch validate`` and ``generate`` from the wheel, in a venv where vLLM, torch and
    transformers cannot be imported: the default settings make exactly the committed files."""
    for name in ENGINE:
        probe = fresh.run(fresh.python, "-c", f"import {name}")
        assert probe.returncode != 0 and "not in this venv" in probe.stderr, name
    settings = fresh.cwd / "inferwatch.yaml"
    settings.write_text("slos:\n  - {name: availability, sli: availability, objective: 0.995, period: 28d}\n")
    checked = fresh.run(fresh.inferwatch, "validate", str(settings))
    assert checked.returncode == 0 and "valid" in checked.stdout, checked.stderr
    made = fresh.run(fresh.inferwatch, "generate", "--config", str(settings), "--out", "team")
    assert made.returncode == 0, made.stderr
    assert "objective: 0.995" not in made.stderr and (fresh.cwd / "team" / "alerts" / "rules" / "slos.yml").is_file()
    assert "vector(0.005)" in (fresh.cwd / "team" / "alerts" / "rules" / "slos.yml").read_text()
    made = fresh.run(fresh.inferwatch, "generate", "--out", "defaults")
    assert made.returncode == 0, made.stderr
    out = fresh.cwd / "defaults"
    generated = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert len(generated) > 40
    differ = [p for p in generated if (out / p).read_text() != (REPO / p).read_text()]
    assert differ == [], "the wheel's defaults make other files than the committed ones"
    schema = fresh.run(fresh.inferwatch, "schema")
    assert json.loads(schema.stdout) == json.loads((REPO / "inferwatch.schema.json").read_text())


def test_up_with_a_settings_file_runs_the_rules_and_routes_generated_from_it(fresh, gateway, tmp_path_factory):
    """``inferwatch up --config``: the team's rules and routes, regenerated into the run folder,
    are what Prometheus and Alertmanager load."""
    names = ("vllm", "prometheus", "alertmanager", "pager", "supervisor")
    ports = dict(zip(names, free_ports(len(names))), gateway=gateway)
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    run_dir = tmp_path_factory.mktemp("up-config")
    (run_dir / "slack").write_text("https://hooks.slack.com/services/T0/B0/X\n")
    settings = run_dir / "team.yaml"
    settings.write_text(f"slos:\n  - {{name: availability, sli: availability, objective: 0.995, period: 28d}}\n"
                        f"alerts:\n  disabled: [GPUPowerCapped]\n"
                        f"routing:\n  receivers:\n    slack: {{api_url_file: {run_dir}/slack, channel: '#oncall'}}\n")
    log = run_dir / "up.log"
    with running(fresh, log, "up", "--monitoring-only", "--fast-alerting", "--config", str(settings),
                 "--run-dir", str(run_dir), "--exporter-port", "0", "--drift-port", "0",
                 *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port)))) as proc:
        eventually(lambda: running_still(proc, log) and "Ctrl-C stops everything" in log.read_text(),
                   timeout_s=TIMEOUT_S)
        groups = requests.get(f"{url['prometheus']}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {Path(g["file"]).parent for g in groups} == {run_dir / "rules"}
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert rules["inferwatch_slo:error_budget:ratio"]["query"] == "vector(0.005)"
        assert {g["name"] for g in groups} >= {"inferwatch-slo-availability"} and \
            not any(g["name"].startswith("inferwatch-slo-ttft") for g in groups)
        assert "GPUPowerCapped" not in rules
        routes = yaml.safe_load((run_dir / "alertmanager" / "alertmanager.yml").read_text())
        assert next(r for r in routes["receivers"] if r["name"] == "pager")["slack_configs"][0]["channel"] == "#oncall"
        assert requests.get(f"{url['alertmanager']}/-/ready", timeout=5).status_code == 200
    assert proc.returncode == 0, log.read_text()
