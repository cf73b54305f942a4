"""Every alert, through promtool: silent when healthy, fires with its labels and annotations,
resolves; SLO burn rates at their thresholds and the traffic floor."""

from __future__ import annotations

import yaml

from inferwatch.alerts.meta import META_ALERTS
from inferwatch.common.durations import seconds
from tests.alerts.promtool import BASE, GPU, RULE_FILES, Scenario, expected, promtool_doc, run_promtool, selector
from tests.alerts.test_gpu_fleet_promtool import FIRING as GPU_FLEET

GW = {"job": "inferwatch-gateway", "instance": "gw:8080"}
VLLM = {"job": "vllm", "instance": "vllm:8000", "model": "m1"}
CHAT = {**GW, "model": "m1", "variant": "v1", "route": "/v1/chat/completions"}


def req(status_class: str) -> str:
    return selector("inferwatch_gateway_requests_total", {**CHAT, "status_class": status_class})


def gpu(name: str, **labels: str) -> str:
    return selector(name, {**GPU, **labels})


def crit(**labels: str) -> dict[str, str]:
    return {**labels, "severity": "critical"}


def warn(**labels: str) -> dict[str, str]:
    return {**labels, "severity": "warning"}


GPU_ALERT = {k: GPU[k] for k in GPU}
K8S_UPSTREAM = "http://vllm-m1:8000"
K8S_VLLM_POD = {"job": "vllm", "instance": "10.1.2.3:8000", "model": "m1", "service": "vllm-m1",
                "namespace": "inferwatch"}
AB = {"model": "m1", "control": "v1", "treatment": "v2"}
BUDGET = {"tenant": "search", "unit": "tokens", "period": "day"}


def ab(name: str, **labels: str) -> str:
    return selector(name, {"job": "inferwatch-drift", "instance": "d:8090", **AB, **labels})


def weight(variant: str) -> str:
    """The gateway's live weight of one of AB's variants."""
    return selector("inferwatch_gateway_experiment_weight_ratio",
                    {**GW, "model": AB["model"], "experiment": "e1", "variant": variant})

SCENARIOS = [
    Scenario("vLLM misses two scrapes, then is back", "VLLMDown", {selector("up", VLLM): "1 1 0 0 0 0 0 1 1"},
             quiet_at=("1m", "2m"), fires_at="3m", labels=crit(**VLLM), value="2", resolved_at="7m"),
    Scenario("vLLM restarted within 30s still pages, then resolves a clean minute later", "VLLMDown",
             {selector("up", VLLM): "1x6 0x1 1x13"}, interval="10s",
             quiet_at=("1m",), fires_at="2m", labels=crit(**VLLM), value="2", resolved_at="3m"),
    Scenario("a vLLM that never becomes ready pages once the startup grace has passed", "VLLMDown",
             {selector("up", VLLM): "0x120"}, interval="10s",
             quiet_at=("1m", "14m50s"), fires_at="15m", labels=crit(**VLLM), value="0"),
    Scenario("gateway target down", "GatewayDown", {selector("up", GW): "1 1 0 0 0 0 1 1"},
             quiet_at=("1m", "2m"), fires_at="4m", labels=crit(**GW), value="0", resolved_at="7m"),
    Scenario("gateway cannot reach a vLLM that Prometheus reaches", "GatewayUpstreamDown",
             {selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://vllm:8000"}): "1 1 0 0 0 0 1",
              selector("up", VLLM): "1x10",
              # a second gateway whose vLLM is down: that is VLLMDown's page, not this one
              selector("inferwatch_gateway_upstream_up", {**GW, "instance": "gw2:8080",
                                                          "upstream": "https://vllm-b:8000/"}): "1 1 0x10",
              selector("up", {**VLLM, "instance": "vllm-b:8000"}): "1 1 0x10"},
             quiet_at=("1m", "2m"), fires_at="4m", labels=crit(**GW, upstream="http://vllm:8000", address="vllm:8000",
                                                          vllm_service="vllm"),
             value="0", resolved_at="6m"),
    Scenario("gateway reaches no replica of a list while Prometheus reaches them", "GatewayUpstreamDown",
             {selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://vllm-c:8000,http://vllm-d:8000"}):
                  "1 1 0x10",
              selector("up", {**VLLM, "instance": "vllm-c:8000"}): "1x12",
              # another gateway's list whose replicas are down: VLLMDown's page, not this one
              selector("inferwatch_gateway_upstream_up", {**GW, "instance": "gw2:8080",
                                                          "upstream": "http://vllm-e:8000/,http://vllm-f:8000"}): "1 1 0x10",
              selector("up", {**VLLM, "instance": "vllm-e:8000"}): "1 1 0x10"},
             quiet_at=("2m",), fires_at="4m",
             labels=crit(**GW, upstream="http://vllm-c:8000,http://vllm-d:8000", address="vllm-c:8000",
                         vllm_service="vllm-c"), value="0"),
    Scenario("an upstream without traffic share pages only once a variant routed there gets some",
             "GatewayUpstreamDown",
             {selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://canary:8001"}): "1 1 0x10",
              # a rolled-back canary: nothing goes there until it is ramped again at 5m
              selector("inferwatch_gateway_upstream_weight_ratio", {**GW, "upstream": "http://canary:8001"}):
                  "0x4 0.05x8"},
             quiet_at=("2m", "4m", "5m"), fires_at="6m",
             labels=crit(**GW, upstream="http://canary:8001", address="canary:8001", vllm_service="canary"),
             value="0"),
    # Kubernetes: the gateway resolves a Service; Prometheus scrapes the pods behind it
    Scenario("gateway cannot reach a vLLM Service whose pods Prometheus reaches", "GatewayUpstreamDown",
             {selector("inferwatch_gateway_upstream_up", {**GW, "upstream": K8S_UPSTREAM}): "1 1 0x10",
              selector("up", K8S_VLLM_POD): "1x12",
              # another model's Service, its only pod down: VLLMDown's page, not this one
              selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://vllm-b:8000"}): "1 1 0x10",
              selector("up", {**K8S_VLLM_POD, "instance": "10.1.2.4:8000", "service": "vllm-b"}): "1 1 0x10"},
             quiet_at=("2m",), fires_at="4m",
             labels=crit(**GW, upstream=K8S_UPSTREAM, address="vllm-m1:8000", vllm_service="vllm-m1"), value="0"),
    Scenario("a child restarts three times within 15m", "InferwatchCrashLooping",
             {selector("inferwatch_supervisor_restarts_total", {"job": "inferwatch-supervisor", "instance": "h:9098",
                                                                "child": "vllm"}): "0 0 1 2 3 3 3 3x20"},
             quiet_at=("3m",), fires_at="4m",
             labels=crit(job="inferwatch-supervisor", instance="h:9098", child="vllm"), value="3", resolved_at="20m"),
    Scenario("fatal XID appears as a new series", "GPUFatalXID",
             {gpu("inferwatch_gpu_xid_errors_total", xid="79"): "_ _ _ _ _ 1 1x20",
              gpu("inferwatch_gpu_xid_errors_total", xid="13"): "0 0 0 0 0 5 5x20"},
             quiet_at=("4m",), fires_at="5m", labels=crit(**GPU, xid="79", action="reboot_node"), value="1",
             resolved_at="16m"),
    Scenario("fatal XID counted again", "GPUFatalXID",
             {gpu("inferwatch_gpu_xid_errors_total", xid="48"): "1x30 2x20"},
             quiet_at=("25m",), fires_at="32m", labels=crit(**GPU, xid="48", action="reset_gpu"), value="1",
             resolved_at="45m"),
    Scenario("application XID is a ticket", "GPUXIDError",
             {gpu("inferwatch_gpu_xid_errors_total", xid="13"): "0 0 0 0 0 5 5x20",
              gpu("inferwatch_gpu_xid_errors_total", xid="79"): "_ _ _ _ _ _ _ _ 1x20"},
             quiet_at=("4m",), fires_at="6m", labels=warn(**GPU, xid="13", action="check_app"), value="5",
             resolved_at="17m"),
    Scenario("GPU stops answering NVML", "GPUDeviceFailed",
             {gpu("inferwatch_gpu_device_failed"): "0 0 1 1 1 1 0"},
             quiet_at=("1m", "2m"), fires_at="4m", labels=crit(**GPU), value="1", resolved_at="6m"),
    Scenario("uncorrectable ECC errors", "GPUUncorrectableECC",
             {gpu("inferwatch_gpu_ecc_errors_total", type="uncorrected", scope="volatile"): "0 0 2 2x20",
              gpu("inferwatch_gpu_ecc_errors_total", type="corrected", scope="volatile"): "0+50x22"},
             quiet_at=("1m",), fires_at="3m", labels=crit(**GPU, type="uncorrected", scope="volatile"), value="2",
             resolved_at="14m"),
    Scenario("row remap failed", "GPURowRemapFailure", {gpu("inferwatch_gpu_row_remap_failure"): "0 0 1 1 0"},
             quiet_at=("1m",), fires_at="2m", labels=crit(**GPU), value="1", resolved_at="4m"),
    Scenario("the segment's verdict flags a feature for 15m", "DriftDetected",
             {selector("inferwatch_drift_feature_detected", {**BASE, "model": "m1", "variant": "v1",
                                                             "feature": feature}): values
              for feature, values in (("prompt_tokens", "0 1x30 0x10"), ("ttft_s", "0x40"))}
             | {selector("inferwatch_drift_feature_detected", {**BASE, "model": "m2", "variant": "v1",
                                                               "feature": "prompt_tokens"}): "1x40",
                selector("inferwatch_drift_window_records", {**BASE, "model": "m1", "variant": "v1"}): "500x40",
                selector("inferwatch_drift_window_records", {**BASE, "model": "m2", "variant": "v1"}): "60x40"},
             quiet_at=("10m",), fires_at="20m", labels=warn(model="m1", variant="v1", feature="prompt_tokens"),
             value="1", resolved_at="33m"),
    Scenario("canary worse on TTFT while it takes 25% of traffic pages", "ABCanaryHurtingUsers",
             {ab("inferwatch_ab_guardrail_worse", metric="ttft"): "0 1x10 0x5",
              ab("inferwatch_ab_guardrail_worse", metric="completion_tokens"): "1x16",
              weight("v2"): "0.25x16"},
             quiet_at=("2m",), fires_at="4m", labels=crit(**AB, metric="ttft"), value="1", resolved_at="14m"),
    # the verdict reads the last hour's records, so it stays "worse" (and the records' share
    # high) long after a rollback; the gateway's live weight is what clears the page
    Scenario("a rollback clears the page while the window still finds the canary worse", "ABCanaryHurtingUsers",
             {ab("inferwatch_ab_guardrail_worse", metric="error_rate"): "0 1x30",
              ab("inferwatch_ab_treatment_share_ratio"): "0.25x30",
              weight("v2"): "0.25x5 0x25", weight("v1"): "0.75x5 1x25"},
             quiet_at=("2m",), fires_at="4m", labels=crit(**AB, metric="error_rate"), value="1", resolved_at="6m"),
    Scenario("canary worse on answer length is a ticket after 5m", "ABCanaryWorse",
             {ab("inferwatch_ab_guardrail_worse", metric="completion_tokens"): "0 1x10 0x5",
              ab("inferwatch_ab_guardrail_worse", metric="error_rate"): "0x16",
              ab("inferwatch_ab_treatment_share_ratio"): "0.05x16"},
             quiet_at=("5m",), fires_at="7m", labels=warn(**AB, metric="completion_tokens"), value="1",
             resolved_at="13m"),
    Scenario("KV cache full with requests waiting", "VLLMKVCacheSaturated",
             {selector("vllm:kv_cache_usage_perc", {**VLLM, "model_name": "m1", "engine": "0"}): "0.5 0.95x30",
              selector("vllm:num_requests_waiting", {**VLLM, "model_name": "m1", "engine": "0"}): "0 3x20 0x10"},
             quiet_at=("8m",), fires_at="15m", labels=warn(model="m1", instance="vllm:8000"), value="95%",
             resolved_at="23m"),
    Scenario("thermal throttling for 15m", "GPUThrottled",
             {gpu("inferwatch_gpu_throttle_active", reason="hw_thermal_slowdown"): "0 1x20 0",
              gpu("inferwatch_gpu_throttle_active", reason="sw_power_cap"): "1x22"},
             quiet_at=("10m",), fires_at="17m",
             labels=warn(**{k: GPU[k] for k in ("instance", "gpu", "uuid")}, reason="hw_thermal_slowdown"),
             value="1", resolved_at="22m"),
    Scenario("power cap for 30m informs", "GPUPowerCapped",
             {gpu("inferwatch_gpu_throttle_active", reason="sw_power_cap"): "1x40 0"},
             quiet_at=("20m",), fires_at="35m", labels={**GPU, "reason": "sw_power_cap", "severity": "info"},
             value="1", resolved_at="41m"),
    Scenario("correctable ECC rising", "GPUCorrectableECCRising",
             {gpu("inferwatch_gpu_ecc_errors_total", type="corrected", scope="volatile"): "0+1x30 30+5x60 330x70"},
             quiet_at=("30m",), fires_at="91m", labels=warn(**GPU, type="corrected", scope="volatile"), value="300",
             resolved_at="160m"),
    Scenario("feature records dropped", "GatewayFeatureRecordsDropped",
             {selector("inferwatch_gateway_feature_records_total", {**GW, "outcome": "dropped_full"}): "0+60x30 1800x20",
              selector("inferwatch_gateway_feature_records_total", {**GW, "outcome": "sent"}): "0+600x50"},
             quiet_at=("5m",), fires_at="25m", labels=warn(instance="gw:8080"), value="1", resolved_at="45m"),
    Scenario("gateway replicas route by different weights", "GatewayReplicasDisagreeOnWeights",
             {selector("inferwatch_gateway_experiment_weight_ratio",
                       {**GW, "instance": f"gw{i}:8080", "model": "m1", "experiment": "e1", "variant": "v2"}): series
              for i, series in enumerate(("0.1x2 0.5x6 0.9x12", "0.1x3 0.5x5 0.9x12", "0.1x2 0.5x15 0.9x5"))},
             # a replica one scrape behind a change (3m) is no disagreement; one that misses the
             # next change for 9 minutes (10m-18m) is
             quiet_at=("4m", "6m", "11m"), fires_at="13m", labels=warn(model="m1", experiment="e1", variant="v2"),
             value="0.4", resolved_at="20m"),
    Scenario("one vLLM replica out of rotation", "GatewayUpstreamReplicaOut",
             {**{selector("inferwatch_gateway_upstream_endpoint_up",
                          {**GW, "instance": gw, "upstream": "http://vllm:8000", "endpoint": "10.0.0.1:8000"}): series
                 for gw, series in (("gw:8080", "1x3 0x5 1x2 0x15 1x3"), ("gw2:8080", "1x3 0x5 1x3 0x14 1x3"))},
              selector("inferwatch_gateway_upstream_endpoint_up",
                       {**GW, "upstream": "http://vllm:8000", "endpoint": "10.0.0.2:8000"}): "1x32",
              selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://vllm:8000"}): "1x32",
              # the only replica of another upstream is out: that is GatewayUpstreamDown's page, not this
              selector("inferwatch_gateway_upstream_endpoint_up",
                       {**GW, "upstream": "http://solo:8000", "endpoint": "10.0.1.1:8000"}): "0x32",
              selector("inferwatch_gateway_upstream_up", {**GW, "upstream": "http://solo:8000"}): "0x32"},
             # out 6 minutes, back, then out again on both gateways from 14m (one gateway saw it from 13m)
             quiet_at=("5m", "9m", "12m", "23m"), fires_at="25m",
             labels=warn(upstream="http://vllm:8000", endpoint="10.0.0.1:8000"), value="0", resolved_at="31m"),
    Scenario("gateway without its shared state", "GatewaySharedStateDown",
             {selector("inferwatch_gateway_shared_state_up", GW): "1x3 0x3 1x2 0x10 1x3"},
             quiet_at=("5m", "9m", "14m"), fires_at="17m", labels=warn(**GW), value="0", resolved_at="23m"),
    # two replicas report the fleet's spend as each last learned it: the latest (largest) counts
    Scenario("a tenant spends 80 % of its budget: a ticket, not a page", "TenantBudgetSpent",
             {**{selector("inferwatch_gateway_tenant_budget_limit", {**GW, "instance": f"gw{i}:8080", **BUDGET,
                                                                      "critical": "false"}): "1000x20"
                 for i in (0, 1)},
              selector("inferwatch_gateway_tenant_budget_used", {**GW, "instance": "gw0:8080", **BUDGET}):
                  "0+100x20",
              selector("inferwatch_gateway_tenant_budget_used", {**GW, "instance": "gw1:8080", **BUDGET}):
                  "0 0+100x19"},
             quiet_at=("7m",), fires_at="8m", labels=warn(**BUDGET), value="80%"),
    Scenario("a critical tenant spends all of its budget: a page, with its ticket", "TenantBudgetSpent",
             {selector("inferwatch_gateway_tenant_budget_limit", {**GW, **BUDGET, "critical": "true"}): "1000x20",
              selector("inferwatch_gateway_tenant_budget_used", {**GW, **BUDGET}): "0+100x9 1000x10 0x1"},
             quiet_at=("7m",), fires_at="10m", labels=crit(**BUDGET), value="100%",
             extra_firing=[expected("TenantBudgetSpent", warn(**BUDGET), "100%")]),
    Scenario("drift service ingests nothing", "DriftIngestStalled",
             {selector("inferwatch_gateway_feature_records_total", {**GW, "outcome": "queued"}): "0+60x40",
              selector("inferwatch_drift_ingested_records_total", {"job": "inferwatch-drift", "instance": "d:8090"}):
                  "0+60x5 300x35",
              selector("up", {"job": "inferwatch-drift", "instance": "d:8090"}): "1x40"},
             quiet_at=("5m", "12m"), fires_at="30m", labels=warn(), value="1"),
    Scenario("NVML down on a GPU host", "NVMLDown",
             {selector("inferwatch_nvml_up", {"job": "inferwatch-exporter", "instance": "n1"}): "1x5 0x20",
              selector("inferwatch_nvml_devices", {"job": "inferwatch-exporter", "instance": "n1"}): "8x25",
              selector("inferwatch_nvml_up", {"job": "inferwatch-exporter", "instance": "cpu-host"}): "0x25",
              selector("inferwatch_nvml_devices", {"job": "inferwatch-exporter", "instance": "cpu-host"}): "0x25"},
             quiet_at=("4m", "9m"), fires_at="12m", labels=warn(job="inferwatch-exporter", instance="n1"), value="0"),
    Scenario("exporter snapshot stuck", "GPUExporterSnapshotStale",
             {selector("inferwatch_nvml_snapshot_timestamp_seconds", {"job": "inferwatch-exporter", "instance": "n1"}):
                  "0+60x5 300x15",
              selector("inferwatch_nvml_snapshot_timestamp_seconds", {"job": "inferwatch-exporter", "instance": "n2"}):
                  "0+60x20"},
             quiet_at=("5m", "8m"), fires_at="13m", labels=warn(job="inferwatch-exporter", instance="n1"),
             value="8m 0s"),
    Scenario("drift service target down", "InferwatchTargetDown",
             {selector("up", {"job": "inferwatch-drift", "instance": "d:8090"}): "1 0x10 1",
              selector("up", {"job": "inferwatch-gateway", "instance": "gw:8080"}): "1x12"},
             quiet_at=("3m",), fires_at="7m", labels=warn(job="inferwatch-drift", instance="d:8090"), value="0",
             resolved_at="12m"),
    Scenario("vLLM preempts requests", "VLLMPreempting",
             {selector("vllm:num_preemptions_total", {**VLLM, "model_name": "m1", "engine": "0"}): "0+60x30 1800x20"},
             quiet_at=("10m",), fires_at="27m", labels={"model": "m1", "instance": "vllm:8000", "severity": "info"},
             value="1", resolved_at="48m"),
    Scenario("Watchdog always fires", "Watchdog", {selector("up", GW): "1"}, fires_at="0m",
             labels={"severity": "none"}, value="1"),
    Scenario("every replica of a model down, and for 30m after: inhibits its SLO alerts", "VLLMModelUnavailable",
             {selector("up", {**VLLM, "instance": "vllm-a:8000"}): "1x10 0x10 1x40",
              selector("up", {**VLLM, "instance": "vllm-b:8000"}): "1x10 0x10 1x40",
              selector("vllm:num_requests_running", {**VLLM, "instance": "vllm-a:8000"}): "0x10 _x10 0x40",
              selector("vllm:num_requests_running", {**VLLM, "instance": "vllm-b:8000"}): "0x10 _x10 0x40"},
             quiet_at=("10m",), fires_at="11m", labels={"model": "m1", "severity": "none"}, value="1",
             resolved_at="53m"),
    Scenario("requests queue while the KV cache has room", "VLLMQueueBuildingUp",
             {selector("vllm:num_requests_waiting", {**VLLM, "model_name": "m1", "engine": "0"}): "0x5 1+1x30 0x10",
              selector("vllm:kv_cache_usage_perc", {**VLLM, "model_name": "m1", "engine": "0"}): "0.4x45"},
             quiet_at=("14m",), fires_at="21m", labels=warn(model="m1", instance="vllm:8000"), value="1",
             resolved_at="40m"),
    # no GPU metrics at all: the exporter is expected too; no records delivered: the drift service is not
    Scenario("no vLLM target at all", "InferwatchTargetAbsent", {selector("up", GW): "1x20"},
             quiet_at=("5m",), fires_at="12m", labels=warn(job="vllm", metric="up"), value="1",
             extra_firing=[expected("InferwatchTargetAbsent", warn(job="inferwatch-exporter", metric="up"), "1")]),
    Scenario("gateway answers but exports no upstream_up", "InferwatchMetricAbsent",
             {selector("up", GW): "1x20", selector("up", {**GW, "instance": "gw2:8080"}): "1x20",
              selector("inferwatch_gateway_upstream_up", {**GW, "instance": "gw2:8080", "upstream": "http://v:8000"}):
                  "1x20",
              selector("up", GPU): "1x20", selector("inferwatch_nvml_up", GPU): "1x20",
              selector("up", VLLM): "1x20", selector("vllm:num_requests_running", VLLM): "0x20"},
             quiet_at=("5m",), fires_at="12m",
             labels=warn(job="inferwatch-gateway", instance="gw:8080", metric="inferwatch_gateway_upstream_up"),
             value="1"),
]


def burn(severity: str, slo: str = "availability", model: str = "m1") -> dict[str, str]:
    return {"model": model, "slo": slo, "severity": severity, "burn": "fast" if severity == "critical" else "slow"}


def availability(error_per_min: float, total_per_min: float, minutes: int) -> dict[str, str]:
    ok = total_per_min - error_per_min
    return {req("2xx"): f"0+{ok:g}x{minutes}", req("5xx"): f"0+{error_per_min:g}x{minutes}"}


# How burns behave over whole incidents (detection and reset times, floors, one identity) is
# tests/alerts/test_paging_timelines.py; these check what each SLO counts as bad.
SLO_SCENARIOS = [
    Scenario("ttft: 20% of first tokens later than 1s pages", "SLOErrorBudgetBurn",
             {selector("inferwatch_gateway_time_to_first_token_seconds_count", CHAT): "0+100x30",
              selector("inferwatch_gateway_time_to_first_token_seconds_bucket", {**CHAT, "le": "1.0"}): "0+80x30",
              selector("inferwatch_gateway_time_to_first_token_seconds_bucket", {**CHAT, "le": "+Inf"}): "0+100x30"},
             quiet_at=("0m",), fires_at="15m", labels=burn("critical", slo="ttft"), value="20%",
             extra_firing=[expected("SLOErrorBudgetBurn", burn("warning", slo="ttft"), "20%")]),
    Scenario("e2e latency: 20% of successful requests over 30s page; 5xx do not count", "SLOErrorBudgetBurn",
             {selector("inferwatch_gateway_request_duration_seconds_count", {**CHAT, "status_class": "2xx"}): "0+100x30",
              selector("inferwatch_gateway_request_duration_seconds_bucket",
                       {**CHAT, "status_class": "2xx", "le": "30.0"}): "0+80x30",
              selector("inferwatch_gateway_request_duration_seconds_count", {**CHAT, "status_class": "5xx"}): "0+100x30",
              selector("inferwatch_gateway_request_duration_seconds_bucket",
                       {**CHAT, "status_class": "5xx", "le": "30.0"}): "0x30"},
             quiet_at=("0m",), fires_at="15m", labels=burn("critical", slo="e2e_latency"), value="20%",
             extra_firing=[expected("SLOErrorBudgetBurn", burn("warning", slo="e2e_latency"), "20%")]),
]


def _quiet(name: str, series: dict[str, str], at: str, alert: str = "SLOErrorBudgetBurn",
           interval: str = "1m") -> dict:
    return {"name": name, "interval": interval, "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": []}]}


SLO_QUIET = [
    _quiet("availability: a healthy model pages nobody", availability(0.5, 1000, 130), "2h"),
    _quiet("4xx are the client's errors, not the SLO's", {req("2xx"): "0+500x60", req("4xx"): "0+500x60"}, "50m"),
]

def _discovered(job: str, n: int) -> tuple[str, str]:
    return (selector("prometheus_sd_discovered_targets", {"job": "prometheus", "instance": "localhost:9090",
                                                          "config": job, "name": "scrape"}), f"{n}x20")


MONITORING_BESIDE_A_VLLM = dict([
    _discovered("vllm", 1), _discovered("inferwatch-gateway", 0), _discovered("inferwatch-drift", 0),
    _discovered("inferwatch-exporter", 0), (selector("up", VLLM), "1x20"),
    (selector("vllm:num_requests_running", VLLM), "0x20")])

def _operator_discovered(kind: str, job: str, n: int) -> tuple[str, str]:
    """The Prometheus Operator names a monitor's scrape config <kind>/<namespace>/<name>/<n>."""
    return (selector("prometheus_sd_discovered_targets", {"job": "prometheus", "instance": "localhost:9090",
                                                          "config": f"{kind}/monitoring/{job}/0", "name": "scrape"}),
            f"{n}x20")


OTHER_QUIET = [
    _quiet("monitors that select no targets under the Prometheus Operator open no absent() tickets",
           dict([_operator_discovered("serviceMonitor", "inferwatch-gateway", 0),
                 _operator_discovered("podMonitor", "vllm", 0),
                 (selector("inferwatch_gpu_info", {"job": "dcgm-exporter", "instance": "n1:9400",
                                                    "gpu": "0"}), "1x20"),
                 # its discovery's metrics come from scraping itself
                 (selector("up", {"job": "prometheus", "instance": "localhost:9090"}), "1x20")]),
           "15m", "InferwatchTargetAbsent"),
    # the Operator's discovery finds every pod of the namespace; relabelling keeps none
    _quiet("a monitor whose selector keeps none of the pods it discovers opens no absent() ticket",
           dict([_operator_discovered("podMonitor", "inferwatch-exporter", 3),
                 (selector("prometheus_target_scrape_pool_targets", {
                     "job": "prometheus", "instance": "localhost:9090",
                     "scrape_job": "podMonitor/monitoring/inferwatch-exporter/0"}), "0x20"),
                 _operator_discovered("serviceMonitor", "vllm", 0), (selector("up", GW), "1x20")]),
           "15m", "InferwatchTargetAbsent"),
    _quiet("a vLLM that is down is VLLMDown's page, not a metric-absent ticket",
           {selector("up", VLLM): "1x5 0x20", selector("vllm:num_requests_running", VLLM): "0x5 _x20"},
           "20m", "InferwatchMetricAbsent"),
    _quiet("one vLLM replica of two down: the model is not unavailable, its SLO pages are not inhibited",
           {selector("up", {**VLLM, "instance": "vllm-a:8000"}): "1x5 0x20",
            selector("up", {**VLLM, "instance": "vllm-b:8000"}): "1x25",
            selector("vllm:num_requests_running", {**VLLM, "instance": "vllm-a:8000"}): "0x5 _x20",
            selector("vllm:num_requests_running", {**VLLM, "instance": "vllm-b:8000"}): "0x25"},
           "20m", "VLLMModelUnavailable"),
    _quiet("a canary worse on TTFT at 5% of traffic is a ticket, not a page",
           {ab("inferwatch_ab_guardrail_worse", metric="ttft"): "1x15",
            weight("v2"): "0.05x15", weight("v1"): "0.95x15"}, "10m", "ABCanaryHurtingUsers"),
    _quiet("jobs configured with no targets open no absent() tickets", MONITORING_BESIDE_A_VLLM, "15m",
           "InferwatchTargetAbsent"),
    _quiet("nor metric-absent ones", MONITORING_BESIDE_A_VLLM, "15m", "InferwatchMetricAbsent"),
    _quiet("one failed vLLM scrape pages nobody", {selector("up", VLLM): "1x6 0 1x12"}, "2m", "VLLMDown",
           interval="10s"),
    _quiet("two restarts are not a crash loop, however the samples fall",
           {selector("inferwatch_supervisor_restarts_total", {"job": "inferwatch-supervisor", "instance": "h:9098",
                                                              "child": "vllm"}): "0x180 1x12 2x200"},
           "35m5s", "InferwatchCrashLooping", interval="10s"),
    _quiet("a gateway answering only 4xx queues no records: no stalled-ingest ticket",
           {req("4xx"): "0+60x40", selector("up", {"job": "inferwatch-drift", "instance": "d:8090"}): "1x40",
            selector("inferwatch_drift_ingested_records_total", {"job": "inferwatch-drift", "instance": "d:8090"}):
                "0x40"},
           "30m", "DriftIngestStalled"),
]


def test_gateways_delivering_records_to_an_unscraped_drift_service_open_a_ticket(tmp_path):
    doc = promtool_doc([Scenario(
        "records sent, no drift target", "InferwatchTargetAbsent",
        {selector("up", GW): "1x20",
         selector("inferwatch_gateway_feature_records_total", {**GW, "outcome": "sent"}): "0+60x20",
         selector("inferwatch_gpu_info", GPU): "1x20",
         selector("up", VLLM): "1x20", selector("vllm:num_requests_running", VLLM): "0x20"},
        quiet_at=("5m",), fires_at="12m", labels=warn(job="inferwatch-drift", metric="up"), value="1")])
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_target_labelled_with_its_model_is_known_before_vllm_has_served(tmp_path):
    """`inferwatch up` labels its vLLM target with the model: a vLLM that dies at Prometheus's
    second scrape, before it exported anything, still makes its model unavailable at once."""
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    unavailable = selector("ALERTS", {"alertname": "VLLMModelUnavailable", "alertstate": "firing", "model": "m1",
                                      "severity": "none"})
    doc["tests"] = [{"name": "labelled target down before it served", "interval": "10s",
                     "input_series": [{"series": selector("up", VLLM), "values": "1 0x30"}],
                     "promql_expr_test": [{"expr": 'ALERTS{alertname="VLLMModelUnavailable",alertstate="firing"}',
                                           "eval_time": t, "exp_samples": [{"labels": unavailable, "value": 1}]}
                                          for t in ("20s", "1m", "4m")]}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_model_failing_after_its_vllm_is_back_lifts_the_outage_shadow(tmp_path):
    """A short outage, then a broken model whose requests keep failing (a bad rollout): after
    a minute of being served again, its failures are a new incident's and its SLO pages must
    not stay inhibited for the rest of the 30 minutes."""
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    unavailable = selector("ALERTS", {"alertname": "VLLMModelUnavailable", "alertstate": "firing", "model": "m1",
                                      "severity": "none"})
    query = 'ALERTS{alertname="VLLMModelUnavailable",alertstate="firing"}'
    doc["tests"] = [{"name": "outage, then failing", "interval": "10s",
                     "input_series": [{"series": selector("up", VLLM), "values": "1x59 0x4 1x100"},
                                      {"series": selector("vllm:num_requests_running", VLLM),
                                       "values": "0x59 _x4 0x100"},
                                      {"series": req("2xx"), "values": "0+100x59 5900x104"},
                                      {"series": req("5xx"), "values": "0x59 0+100x104"}],
                     "promql_expr_test": [{"expr": query, "eval_time": t,
                                           "exp_samples": [{"labels": unavailable, "value": 1}] if on else []}
                                          for t, on in (("10m20s", True), ("11m", True), ("14m", False),
                                                        ("20m", False))]}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_missed_scrape_of_the_only_replica_inhibits_for_that_evaluation_not_for_30_minutes(tmp_path):
    """A busy vLLM whose /metrics times out once must not hold its model's SLO pages back
    for 30 minutes: the shadow follows only an outage of VLLMDown's count of failed scrapes."""
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    firing = {"exp_labels": {"model": "m1", "severity": "none"}}
    [rule] = [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
              if r.get("alert") == "VLLMModelUnavailable"]
    firing["exp_annotations"] = {k: v.replace("{{ $labels.model }}", "m1") for k, v in rule["annotations"].items()}
    doc["tests"] = [{"name": "one missed scrape", "interval": "10s",
                     "input_series": [{"series": selector("up", VLLM), "values": "1x30 0 1x59"},
                                      {"series": selector("vllm:num_requests_running", VLLM), "values": "0x30 _ 0x59"}],
                     "alert_rule_test": [{"eval_time": "5m10s", "alertname": "VLLMModelUnavailable",
                                          "exp_alerts": [firing]}]
                     + [{"eval_time": t, "alertname": "VLLMModelUnavailable", "exp_alerts": []}
                        for t in ("5m", "5m20s", "5m30s", "8m")]}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_three_hour_vllm_outage_is_one_alert_identity_from_start_to_end(tmp_path):
    """VLLMDown keeps its `model` however long vLLM exports nothing (a second identity would
    page again and lapse its inhibitions); the model is unavailable for the whole outage and
    30 minutes after."""
    target = {"job": "vllm", "instance": "vllm:8000"}
    series = {selector("up", target): "1x60 0x1080 1x240",
              selector("vllm:num_requests_running", {**target, "model": "m1"}): "0x60 _x1080 0x240"}
    down = selector("ALERTS", {"alertname": "VLLMDown", "alertstate": "firing", **target, "model": "m1",
                               "severity": "critical"})
    unavailable = selector("ALERTS", {"alertname": "VLLMModelUnavailable", "alertstate": "firing", "model": "m1",
                                      "severity": "none"})
    minutes = range(15, 230, 5)  # the outage is 10m..3h10m at 10s samples; the input ends at 3h50m

    def at(minute: int, query: str, firing: bool) -> dict:
        return {"expr": query, "eval_time": f"{minute}m", "exp_samples": [{"labels": q, "value": 1} for q in
                                                                            ([query_labels[query]] if firing else [])]}

    query_labels = {'ALERTS{alertname="VLLMDown",alertstate="firing"}': down,
                    'ALERTS{alertname="VLLMModelUnavailable",alertstate="firing"}': unavailable}
    [down_q, unavailable_q] = query_labels
    checks = [at(t, down_q, 11 <= t < 191) for t in (*minutes, 9, 194, 200)]
    checks += [at(t, unavailable_q, 11 <= t < 221) for t in (*minutes, 9)]
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    doc["tests"] = [{"name": "3h outage", "interval": "10s",
                     "input_series": [{"series": k, "values": v} for k, v in series.items()],
                     "promql_expr_test": checks}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr


def test_vllm_loading_its_model_pages_nobody_and_a_long_outage_never_lapses(tmp_path):
    """The startup grace must not open a gap: a crash pages within two scrapes and the page
    holds past the grace, while a first start that takes 10 minutes pages nobody."""
    firing = [expected("VLLMDown", crit(**VLLM), "")]
    loading = {**VLLM, "instance": "vllm-b:8000"}
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    doc["tests"] = [
        {"name": "crash, then down for 40m", "interval": "10s",
         "input_series": [{"series": selector("up", VLLM), "values": "1x30 0x240"}],
         "alert_rule_test": [{"eval_time": t, "alertname": "VLLMDown", "exp_alerts": firing}
                             for t in ("5m20s", "6m", "19m50s", "20m", "20m10s", "30m", "45m")]
         + [{"eval_time": "5m10s", "alertname": "VLLMDown", "exp_alerts": []}]},
        {"name": "first start loads for 10m, then serves", "interval": "10s",
         "input_series": [{"series": selector("up", loading), "values": "0x60 1x120"}],
         "alert_rule_test": [{"eval_time": t, "alertname": "VLLMDown", "exp_alerts": []}
                             for t in ("2m", "9m50s", "10m10s", "10m30s", "11m", "20m", "29m")]},
        {"name": "crash within Prometheus's first minute", "interval": "10s",
         "input_series": [{"series": selector("up", VLLM), "values": "1x3 0x60"}],
         "alert_rule_test": [{"eval_time": "40s", "alertname": "VLLMDown", "exp_alerts": []},
                             {"eval_time": "50s", "alertname": "VLLMDown", "exp_alerts": firing},
                             {"eval_time": "3m", "alertname": "VLLMDown", "exp_alerts": firing}]},
        {"name": "crash 30s after the first start became ready", "interval": "10s",
         "input_series": [{"series": selector("up", VLLM), "values": "0x60 1x2 0x60"}],
         "alert_rule_test": [{"eval_time": "10m20s", "alertname": "VLLMDown", "exp_alerts": []}]
         + [{"eval_time": t, "alertname": "VLLMDown", "exp_alerts": firing} for t in ("10m40s", "11m40s", "20m")]},
    ]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_vllm_target_without_a_model_label_pages_with_the_model_it_served_last(tmp_path):
    """Compose and Kubernetes discover vLLM without a `model` target label: the page takes the
    model from vLLM's own series, so Alertmanager's inhibition of that model's SLO pages
    applies, and after a model change the newer model is named."""
    target = {"job": "vllm", "instance": "vllm:8000"}
    running = {**target, "engine": "0"}
    doc = {**promtool_doc([]), "evaluation_interval": "10s"}
    doc["tests"] = [{
        "name": "served m-old, then m-new, then crashed", "interval": "10s",
        "input_series": [
            {"series": selector("up", target), "values": "1x60 0x30"},
            {"series": selector("vllm:num_requests_running", {**running, "model_name": "m-old", "model": "m-old"}),
             "values": "0x20 _x70"},
            {"series": selector("vllm:num_requests_running", {**running, "model_name": "m-new", "model": "m-new"}),
             "values": "_x20 0x40 _x30"}],
        "alert_rule_test": [{"eval_time": "10m20s", "alertname": "VLLMDown",
                             "exp_alerts": [expected("VLLMDown", crit(**target, model="m-new"), "")]}]}, {
        "name": "never served: no model to name", "interval": "10s",
        "input_series": [{"series": selector("up", target), "values": "0x120"}],
        "alert_rule_test": [{"eval_time": "16m", "alertname": "VLLMDown",
                             "exp_alerts": [expected("VLLMDown", crit(**target), "")]}]}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_with_its_labels_and_resolves(tmp_path):
    doc = promtool_doc(SCENARIOS + SLO_SCENARIOS)
    doc["tests"] += SLO_QUIET + OTHER_QUIET
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_scenario_that_fires_it():
    rules = [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]
    # the meta alerts' scenarios are tests/alerts/test_meta_promtool.py's, the GPU fleet's test_gpu_fleet_promtool.py's
    fired = {s.alert for s in SCENARIOS + SLO_SCENARIOS + GPU_FLEET}
    assert {r["alert"] for r in rules} == fired | {a.name for a in META_ALERTS}


def test_burn_factors_follow_the_sre_workbook():
    from inferwatch.alerts.spec import DEFAULT

    assert [w.factor("30d") for t in DEFAULT.tiers for w in t.windows] == [14.4, 6.0, 3.0, 1.0]
    assert seconds("3d") == 3 * 86400


def test_error_budget_remaining_over_the_period(tmp_path):
    """0.05% of requests fail, steadily, against a 0.1% budget: half of it is left (the
    analytic value), computed from the hourly means of the 5-minute samples."""
    from inferwatch.alerts.generate import BUDGET_REMAINING

    doc = promtool_doc([])
    doc["tests"] = [{"name": "budget remaining", "interval": "1m",
                     "input_series": [{"series": k, "values": v} for k, v in availability(1, 2000, 300).items()],
                     "promql_expr_test": [{
                         "expr": f'round(1000 * last_over_time({BUDGET_REMAINING}{{slo="availability"}}[2h])) / 1000',
                         "eval_time": "4h",
                         "exp_samples": [{"labels": '{model="m1", slo="availability"}', "value": 0.5}]}]}]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
