"""The Kubernetes manifests (``deploy/kubernetes/``), a kustomize tree written by ``make
generate``: the workloads, their scrape objects, the rules and dashboards just generated
(wrapped, nothing re-derived, so what the tests prove is what the cluster runs), the paging
route, NetworkPolicies and autoscaling. deploy/kube/ builds it; this is its entry point.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from inferwatch.config.settings import Settings
from inferwatch.deploy.kube import layout
from inferwatch.deploy.kube.settings import from_config
from inferwatch.deploy.monitoring import DEPLOY_DIR

K8S_DIR = DEPLOY_DIR / "kubernetes"
COLLECTOR_CONFIG = DEPLOY_DIR / "otel-collector" / "config.yml"


def _by_name(files: Mapping[Path, str]) -> list[str]:
    return [files[path] for path in sorted(files, key=lambda p: p.name)]


def kubernetes_files(rules: Mapping[Path, str], compat_rules: Mapping[Path, str],
                     dashboards: Mapping[Path, str], settings: Settings) -> dict[Path, str]:
    """The manifests, path -> text, from the generated files (path -> text) they wrap: the
    rule files, the dcgm-exporter compatibility rules and the dashboards' JSON."""
    tree = layout.tree(_by_name(rules), _by_name(compat_rules), dashboards, COLLECTOR_CONFIG.read_text(),
                       from_config(settings))
    return {K8S_DIR / path: text for path, text in tree.items()}
