"""The release workflow (.github/workflows/release.yml): valid for GitHub (its published
workflow schema, shipped with check-jsonschema), and it pushes the images the generated
Kubernetes tree pulls, built from targets the Dockerfile has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from inferwatch.config.settings import Settings
from inferwatch.deploy.kube.settings import DEFAULT as KUBE

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def test_the_workflow_is_valid_for_github():
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                             str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_refuses_a_broken_workflow(tmp_path):
    broken = tmp_path / "release.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "run-on:"))
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                             str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0


def test_it_pushes_the_images_the_kubernetes_tree_pulls_from_the_dockerfiles_targets():
    doc = yaml.safe_load(WORKFLOW.read_text())
    matrix = doc["jobs"]["images"]["strategy"]["matrix"]["include"]
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert {m["target"] for m in matrix} <= targets
    pushed = {m["image"] for m in matrix}
    deployment = Settings().deployment
    pulled = {KUBE.image, *(m.image for m in KUBE.models)}
    ours = {image for image in pulled if image.startswith(f"{deployment.registry}/")}
    assert {image.removeprefix(f"{deployment.registry}/").rsplit(":", 1)[0] for image in ours} == pushed
    assert all(image.endswith(f":{deployment.tag}") for image in ours)
    assert deployment.tag == re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
