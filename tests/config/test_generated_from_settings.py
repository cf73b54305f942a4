"""Valid settings at their edges never make a file the tools refuse: promtool checks the rules,
amtool the Alertmanager configs (and routes a page), kustomize builds every overlay."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.config.load import parse
from inferwatch.generate import artifacts, write

EDGES = """
models:
  - name: meta-llama/Llama-3.1-8B-Instruct     # slash, dots, capitals: RE2 and PromQL escapes
    slos: [availability, itl]
  - name: "qwen2.5+coder-7b"
    slos: [availability, e2e]
    kubernetes:
      image: "{registry}/vllm-custom:{tag}"
      args: ["--model", "Qwen/Qwen2.5-Coder-7B", "--served-model-name", "qwen2.5+coder-7b"]
      resources: {requests: {cpu: "4", nvidia.com/gpu: "1"}, limits: {nvidia.com/gpu: "1"}}
      gpu: true
      min_replicas: 2
      max_replicas: 2
slos:
  - {name: availability, sli: availability, objective: 0.99999, period: 90d}
  - {name: e2e, sli: e2e_latency, objective: 0.9, period: 1d, threshold_s: 120}
  - {name: itl, sli: itl, objective: 0.95, threshold_s: 0.001}
burn_rate:
  tiers:
    - name: page
      severity: critical
      keep_firing_for: 1m
      windows: [{long: 30m, short: 5m, budget_share: 1}]
  min_events: 1
  min_bad_events: 1
alerts:
  disabled: [GPUPowerCapped, VLLMPreempting, DriftDetected]
  for: {GPUThrottled: 1h, GatewayDown: 30s}
  thresholds: {kv_cache_high: 0.5, queue_window: 1h, snapshot_stale_s: 10, drift_for: 1d}
routing:
  group_by: [alertname, cluster]
  page: {group_wait: 0s, group_interval: 1s, repeat_interval: 1w}
  receivers:
    webhook: {url: "https://hooks.example.com/path?x=1", tickets: false}
  inhibitions:
    - source_matchers: ['alertname="GatewayDown"']
      target_matchers: ['alertname=~"Gateway.+"', 'severity!="critical"', 'model!~"canary-.*"']
      equal: [instance]
  heartbeat_url: https://hc-ping.com/0000
cost:
  gpu_hour_price: 0.01
  gpu_hour_prices: {"NVIDIA A100-SXM4-80GB (MIG 1g.10gb)": 0.3, "NVIDIA H100 80GB HBM3": 5}
deployment:
  namespace: llm-prod
  registry: ""
  tag: v2.0.0-rc.1_build
  overlays: {prod: "qwen2.5+coder-7b"}
  drift_replicas: 1
"""


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edges")
    write(artifacts(parse(EDGES)), out)
    return out


def test_promtool_accepts_the_rules(out):
    rules = sorted((out / "alerts" / "rules").glob("*.yml"))
    result = subprocess.run(["promtool", "check", "rules", *map(str, rules)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {r.get("alert") for p in rules for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]}
    assert not names & {"GPUPowerCapped", "VLLMPreempting", "DriftDetected"}


def test_amtool_accepts_the_configs_and_routes_a_page(out):
    for name in ("alertmanager.yml", "alertmanager-pagerduty.yml"):
        config = out / "deploy" / "alertmanager" / name
        result = subprocess.run(["amtool", "check-config", str(config)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run(["amtool", "config", "routes", "test", f"--config.file={config}",
                             "--verify.receivers=pager", "severity=critical", "alertname=VLLMDown"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomize_builds_the_overlay_with_the_settings_names(out):
    built = subprocess.run(["kubectl", "kustomize", str(out / "deploy" / "kubernetes" / "overlays" / "prod")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    # BaseLoader: kubectl writes `matchType: =`, which PyYAML would read as its "value" tag
    docs = [d for d in yaml.load_all(built.stdout, Loader=yaml.BaseLoader) if d]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"llm-prod"}
    images = {c["image"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert {"inferwatch:v2.0.0-rc.1_build", "vllm-custom:v2.0.0-rc.1_build"} <= images
    assert not (out / "deploy" / "kubernetes" / "overlays" / "gpu").exists(), "only the overlays the settings name"
