"""Every generated file, from a team's settings: ``inferwatch generate`` (and ``make generate``,
which is that command on the repository's ``inferwatch.yaml``).

The alert rules, the dcgm-exporter compatibility rules, the compose stack's Prometheus and
Alertmanager configs, the dashboards' JSON, the Kubernetes manifests that wrap those, and the
settings' JSON Schema: :func:`artifacts` computes them all in memory (relative path -> text),
so the golden test compares exactly what ``make generate`` writes with what is committed, and
the manifests wrap the texts just generated rather than whatever is on disk. Paths are the
repository's layout, also under another ``--out``. Writing is the thin edge in :func:`write`.

Generation needs the settings, the specs and the metric declarations, never the services: it
imports neither FastAPI, OpenTelemetry, aiohttp nor vLLM (a test runs it with them unimportable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from inferwatch.alerts import dcgm, generate as rules
from inferwatch.alerts.spec import build
from inferwatch.config.load import schema_text
from inferwatch.config.settings import Settings
from inferwatch.dashboards import generate as dashboards
from inferwatch.deploy import manifests, monitoring

# The package's folders and the repository folders they are (pyproject.toml's package-dir).
_PACKAGE_FOLDERS = {
    "alerts": rules.RULES_DIR.parent,
    "dashboards": dashboards.JSON_DIR.parent,
    "deploy": monitoring.DEPLOY_DIR,
}
SCHEMA = Path("inferwatch.schema.json")


def relative(path: Path) -> Path:
    """A generator's path (in the package) as a path of the repository's layout."""
    for folder, package_dir in _PACKAGE_FOLDERS.items():
        if path.is_relative_to(package_dir):
            return Path(folder) / path.relative_to(package_dir)
    raise ValueError(f"{path} is in no generated folder")


# Folders that hold generated files only: a file there that generation no longer makes is stale.
OWNED_DIRS = tuple(relative(p) for p in (rules.RULES_DIR, dcgm.OUT.parent, dashboards.JSON_DIR, manifests.K8S_DIR,
                                          monitoring.DEPLOY_DIR / "prometheus" / "targets"))


def artifacts(settings: Settings = Settings()) -> dict[Path, str]:
    """Every generated file, relative path -> text; committed with the default settings.
    Raises ConfigError for settings that are only wrong as a whole (``alerts.spec.build``)."""
    spec = build(settings)
    rule_files = rules.files(spec)
    compat_rules = dcgm.files()
    dashboard_files = dashboards.files(spec)
    made = {
        **rule_files,
        **compat_rules,
        **dashboard_files,
        **monitoring.compose_files((path.name for path in rule_files), settings.routing),
        **manifests.kubernetes_files(rule_files, compat_rules, dashboard_files, settings),
    }
    return {SCHEMA: schema_text(), **{relative(path): text for path, text in made.items()}}


def stale(files: Mapping[Path, str], out: Path, folders: Iterable[Path] = OWNED_DIRS) -> list[Path]:
    """Files in the generated-only ``folders`` under ``out`` that ``files`` does not include:
    left over from a dashboard, rule file or job since removed."""
    return sorted(path.relative_to(out) for folder in folders if (out / folder).is_dir()
                  for path in (out / folder).rglob("*") if path.is_file() and path.relative_to(out) not in files)


def write(files: Mapping[Path, str], out: Path, folders: Iterable[Path] = OWNED_DIRS) -> list[Path]:
    """Write ``files`` under ``out`` where they differ from what is there and remove the stale
    ones of ``folders``; return the relative paths changed. Unchanged files keep their
    modification time."""
    changed = []
    for path, text in files.items():
        target = out / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    for path in stale(files, out, folders):
        (out / path).unlink()
        changed.append(path)
    return changed
