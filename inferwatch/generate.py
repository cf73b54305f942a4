"""Every generated file of the repository, from one entry point (``make generate``).

The alert rules, the dcgm-exporter compatibility rules, the compose stack's Prometheus and
Alertmanager configs, the dashboards' JSON and the Kubernetes manifests that wrap those:
:func:`artifacts` computes them all in memory (path -> text), so the golden test compares
exactly what ``make generate`` writes with what is committed, and the manifests wrap the
texts just generated rather than whatever is on disk. Writing is the thin edge in
:func:`write`.

Generation needs the specs and the metric declarations, never the services: it imports
neither FastAPI, OpenTelemetry nor aiohttp (a test runs it with them unimportable).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from inferwatch.alerts import dcgm
from inferwatch.alerts import generate as rules
from inferwatch.dashboards import generate as dashboards
from inferwatch.deploy import manifests, monitoring

# Folders that hold generated files only: a file there that generation no longer makes is stale.
OWNED_DIRS = (rules.RULES_DIR, dcgm.OUT.parent, dashboards.JSON_DIR, manifests.K8S_DIR,
              monitoring.DEPLOY_DIR / "prometheus" / "targets")


def artifacts(options: rules.Options = rules.Options()) -> dict[Path, str]:
    """Every generated file, path -> text; committed with the default ``options``."""
    rule_files = rules.files(options)
    compat_rules = dcgm.files()
    dashboard_files = dashboards.files()
    return {
        **rule_files,
        **compat_rules,
        **dashboard_files,
        **monitoring.compose_files((path.name for path in rule_files), options.heartbeat_url),
        **manifests.kubernetes_files(rule_files, compat_rules, dashboard_files),
    }


def stale(files: Mapping[Path, str], folders: Iterable[Path] = OWNED_DIRS) -> list[Path]:
    """Files in the generated-only ``folders`` that ``files`` does not include: left over
    from a dashboard, rule file or job since removed."""
    return sorted(path for folder in folders if folder.is_dir()
                  for path in folder.rglob("*") if path.is_file() and path not in files)


def write(files: Mapping[Path, str], folders: Iterable[Path] = OWNED_DIRS) -> list[Path]:
    """Write ``files`` where they differ from what is there and remove the stale ones of
    ``folders``; return the paths changed. Unchanged files keep their modification time."""
    changed = []
    for path, text in files.items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    for path in stale(files, folders):
        path.unlink()
        changed.append(path)
    return changed


def main() -> None:
    """``make generate``: the deployment's links, optional objectives and GPU-hour price come
    from the environment (``INFERWATCH_GRAFANA_URL``, ``INFERWATCH_RUNBOOK_URL``,
    ``INFERWATCH_ITL_SLO_MODELS``, ``INFERWATCH_HEARTBEAT_URL``, ``INFERWATCH_GPU_HOUR_PRICE``)."""
    try:
        options = rules.Options.from_env()
    except ValueError as exc:
        sys.exit(f"make generate: {exc}")
    files = artifacts(options)
    changed = write(files)
    for path in changed:
        print(f"{'wrote' if path in files else 'removed'} {path}", file=sys.stderr)
    print(f"{len(files)} generated files, {len(changed)} changed", file=sys.stderr)


if __name__ == "__main__":
    main()
