"""GPUs at fleet scale, through promtool: stragglers among a model's GPUs, links that degrade
before they fail, clocks held down, and XIDs by the action NVIDIA's catalog gives them.
Each alert has its healthy timelines beside the one that fires it."""

from __future__ import annotations

import numpy as np
import pytest

from inferwatch.alerts.spec import DEFAULT
from inferwatch.alerts.stragglers import DEFICIT, PEERS_MEAN, PEERS_STDDEV
from inferwatch.exporters.xid_catalog import ACTIONS, LOOK_UP, XID_ACTIONS, codes_of
from tests.alerts.promtool import GPU, Scenario, promtool_doc, run_promtool, selector

T = DEFAULT.thresholds
H100 = "NVIDIA H100 80GB HBM3"
MHZ = 1e6


def gpu(name: str, **labels: str) -> str:
    return selector(name, {**GPU, **labels})


def card(i: int, host: str = "node1") -> dict[str, str]:
    return {**GPU, "instance": f"{host}:9400", "gpu": str(i), "uuid": f"GPU-{host}-{i}", "name": H100,
            "pci_bus_id": f"00000000:{i + 1:02x}:00.0"}


def serving(model: str, host: str = "node1") -> dict[str, str]:
    """vLLM on ``host`` serving ``model``: what attributes the host's GPUs to it (alerts/cost.py)."""
    return {selector("vllm:num_requests_running", {"job": "vllm", "instance": f"{host}:8000", "model": model}): "4x60"}


def fleet(clocks: list[list[float]], utilization: float, power: float = 600.0, host: str = "node1") -> dict[str, str]:
    """One host's GPUs: each one's SM clock per minute (MHz), the same utilization and power."""
    out = {}
    for i, per_minute in enumerate(clocks):
        out[selector("inferwatch_gpu_sm_clock_hertz", card(i, host))] = " ".join(f"{c * MHZ:.0f}" for c in per_minute)
        out[selector("inferwatch_gpu_utilization_ratio", card(i, host))] = f"{utilization}x60"
        out[selector("inferwatch_gpu_power_watts", card(i, host))] = f"{power}x60"
        out[selector("inferwatch_gpu_info", card(i, host))] = "1x60"
    return out


PEER_CLOCKS = [1980.0, 1940.0, 2000.0, 1960.0, 1990.0, 1950.0, 1970.0]  # mean 1970, within ±1.6 %
SLOW = 1970.0 * 0.85  # 15 % below its peers' mean


def straggler_labels(i: int) -> dict[str, str]:
    c = card(i)
    return {"host": "node1", "uuid": c["uuid"], "gpu": c["gpu"], "name": H100, "model": "m1", "signal": "sm_clock",
            "severity": "warning"}


# pending from the first evaluation that has the host's model (alerts/cost.py's group, which
# promtool may run before or after this one): firing at 10m or 11m
STRAGGLER = Scenario("one GPU 15 % slow among 8 busy ones", "GPUStraggler",
                     {**serving("m1"), **fleet([[c] * 61 for c in [*PEER_CLOCKS, SLOW]], utilization=0.9)},
                     quiet_at=("5m", "9m"), fires_at="12m", labels=straggler_labels(7), value="15%")


def test_a_gpu_15_percent_slow_among_8_is_ticketed_naming_it_and_its_model(tmp_path):
    doc = promtool_doc([STRAGGLER])
    # the recorded peers' mean and deviation are numpy's over the other seven (population deviation)
    checks = {PEERS_MEAN: float(np.mean(PEER_CLOCKS)) * MHZ, PEERS_STDDEV: float(np.std(PEER_CLOCKS)) * MHZ,
              DEFICIT: 0.15}
    doc["tests"][0]["promql_expr_test"] = [
        {"expr": f'abs({name}{{gpu="7",signal="sm_clock"}} - {want!r}) < bool {abs(want) * 1e-9 + 1e-9!r}',
         "eval_time": "12m",
         "exp_samples": [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in straggler_labels(7).items()
                                                   if k != "severity") + "}", "value": 1}]}
        for name, want in checks.items()]
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _quiet(name: str, series: dict[str, str], alert: str, at: tuple[str, ...], interval: str = "1m") -> dict:
    return {"name": name, "interval": interval, "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in at]}


def _jitter(seed: int, n: int = 8, share: float = 0.05) -> list[list[float]]:
    """Each GPU's clock drawn every minute within ±``share`` of 1970 MHz, independently."""
    rng = np.random.default_rng(seed)
    return [list(1970.0 * (1 + rng.uniform(-share, share, 61))) for _ in range(n)]


def test_normal_jitter_and_an_idle_model_are_never_ticketed(tmp_path):
    idle = [[c] * 61 for c in [*PEER_CLOCKS, 1970.0 * 0.5]]  # an idle GPU may sit at half its peers' clock
    tests = [_quiet(f"clocks jitter ±5 % every minute (seed {seed})", {**serving("m1"), **fleet(_jitter(seed), 0.9)},
                    "GPUStraggler", ("15m", "30m", "45m", "60m")) for seed in range(3)]
    tests.append(_quiet("an idle model's GPUs drop their clocks unevenly", {**serving("m1"), **fleet(idle, 0.05)},
                        "GPUStraggler", ("15m", "30m", "60m")))
    # a slow GPU on a host of two models has no peers to be compared with (alerts/cost.py)
    shared = {**serving("m1"), **serving("m2"), **fleet([[c] * 61 for c in [*PEER_CLOCKS, SLOW]], 0.9)}
    tests.append(_quiet("a host serving two models compares no GPU", shared, "GPUStraggler", ("15m", "30m")))
    result = run_promtool({**promtool_doc([]), "tests": tests}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _per_5m(values: list[int]) -> str:
    return " ".join(map(str, values))


def nvlink(link: str, kind: str) -> str:
    return gpu("inferwatch_gpu_nvlink_errors_total", link=link, type=kind)


DAY = 288  # 5-minute steps
STEPS = DAY + 48
# a healthy link's trickle: one CRC error every 30 minutes, for a day and four hours
TRICKLE = [i // 6 for i in range(STEPS)]
# the same for a day, then 5 more every 5 minutes for two hours, then none
ONSET, RISE = DAY, 24
RISING = [i // 6 for i in range(ONSET)] + [ONSET // 6 + 5 * (i + 1) for i in range(RISE)]
RISING += [RISING[-1]] * (STEPS - len(RISING))


def _at(step: int) -> str:
    return f"{step * 5}m"


def every_5m(doc: dict) -> dict:
    """Day-long timelines evaluated every 5 minutes: what they check needs no finer step."""
    return {**doc, "evaluation_interval": "5m"}


NVLINK = Scenario("NVLink recovery errors rise over a day's trickle", "GPUNVLinkErrorsRising",
                  {nvlink("3", "recovery"): _per_5m(RISING), nvlink("2", "crc_flit"): _per_5m(TRICKLE),
                   nvlink("1", "replay"): f"0x{STEPS}"},
                  interval="5m", quiet_at=(_at(ONSET - 1), _at(ONSET)), fires_at=_at(ONSET + 12),
                  labels={**GPU, "link": "3", "type": "recovery", "severity": "warning"}, value="60",
                  resolved_at=_at(ONSET + RISE + 12))
DEGRADATION = [
    Scenario("a PCIe link below its generation while the GPU is busy", "GPUPCIeLinkDegraded",
             {gpu("inferwatch_gpu_pcie_link_generation"): "3x60", gpu("inferwatch_gpu_pcie_link_generation_max"): "5x60",
              gpu("inferwatch_gpu_utilization_ratio"): "0.9x60",
              # idle: the generation drops to save power, and that is no fault
              gpu("inferwatch_gpu_pcie_link_generation", gpu="1"): "1x60",
              gpu("inferwatch_gpu_pcie_link_generation_max", gpu="1"): "5x60",
              gpu("inferwatch_gpu_utilization_ratio", gpu="1"): "0x60",
              # busy at its maximum
              gpu("inferwatch_gpu_pcie_link_generation", gpu="2"): "5x60",
              gpu("inferwatch_gpu_pcie_link_generation_max", gpu="2"): "5x60",
              gpu("inferwatch_gpu_utilization_ratio", gpu="2"): "0.9x60"},
             quiet_at=("29m",), fires_at="31m",
             labels={**GPU, "link_property": "generation", "severity": "warning"}, value="3"),
    Scenario("a PCIe link on half its lanes", "GPUPCIeLinkDegraded",
             {gpu("inferwatch_gpu_pcie_link_width"): "16x10 8x40 16x10", gpu("inferwatch_gpu_pcie_link_width_max"): "16x60",
              gpu("inferwatch_gpu_pcie_link_width", gpu="1"): "16x60",
              gpu("inferwatch_gpu_pcie_link_width_max", gpu="1"): "16x60"},
             quiet_at=("10m", "39m"), fires_at="41m",
             labels={**GPU, "link_property": "width", "severity": "warning"}, value="8", resolved_at="52m"),
    Scenario("one GPU's NVML queries take seconds while the others take milliseconds", "GPUNVMLSlow",
             {gpu("inferwatch_gpu_nvml_duration_seconds"): "0.003x5 1.5x30",
              gpu("inferwatch_gpu_nvml_duration_seconds", gpu="1"): "0.003x40"},
             quiet_at=("5m", "9m"), fires_at="11m", labels={**GPU, "severity": "warning"}, value="1.5s"),
    Scenario("a call on one GPU hangs", "GPUNVMLSlow",
             {gpu("inferwatch_gpu_nvml_duration_seconds"): "0.003x40",
              # the watchdog's series appears once the call has run a second, and grows
              gpu("inferwatch_gpu_nvml_call_seconds", query="nvmlDeviceGetTemperature"): "_x5 60+60x30"},
             quiet_at=("4m", "9m"), fires_at="12m", labels={**GPU, "severity": "warning"}, value="8m 0s"),
    Scenario("a GPU its device plugin stops offering", "GPUNotAllocatable",
             {gpu("inferwatch_gpu_allocatable"): "1x5 0x20 1x10", gpu("inferwatch_gpu_allocatable", gpu="1"): "1x40"},
             quiet_at=("5m", "15m"), fires_at="17m", labels={**GPU, "severity": "warning"}, value="0",
             resolved_at="27m"),
    Scenario("clocks held down by application clocks set low", "GPUThrottled",
             {gpu("inferwatch_gpu_throttle_active", reason="applications_clocks_setting"): "0x5 1x40",
              gpu("inferwatch_gpu_throttle_active", reason="gpu_idle"): "1x60",
              gpu("inferwatch_gpu_throttle_active", reason="sw_power_cap"): "1x60"},
             quiet_at=("5m", "19m"), fires_at="21m",
             labels={"instance": GPU["instance"], "gpu": GPU["gpu"], "uuid": GPU["uuid"],
                     "reason": "applications_clocks_setting", "severity": "warning"}, value="1"),
]


def test_degrading_links_and_held_clocks_are_ticketed_and_healthy_ones_never(tmp_path):
    result = run_promtool(promtool_doc(DEGRADATION), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    quiet = _quiet("idle and power-capped clocks", {gpu("inferwatch_gpu_throttle_active", reason=r): "1x60"
                                                    for r in ("gpu_idle", "sw_power_cap")}, "GPUThrottled", ("30m", "60m"))
    result = run_promtool({**promtool_doc([]), "tests": [quiet]}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_nvlink_errors_rising_against_the_last_day_are_ticketed_and_a_steady_trickle_never(tmp_path):
    trickle = _quiet("a link with a steady trickle of CRC errors", {nvlink("2", "crc_flit"): _per_5m(TRICKLE)},
                     "GPUNVLinkErrorsRising", tuple(_at(s) for s in (DAY, DAY + 30, STEPS - 1)), interval="5m")
    doc = every_5m(promtool_doc([NVLINK]))
    doc["tests"].append(trickle)
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


XID_CASES = {"reboot_node": 79, "reset_gpu": 48, "reset_gpu_at_maintenance": 63, "restart_app": 94,
             "check_app": 13, "none": 45, "look_up": 999}
XID_NAMES = {"critical": "GPUFatalXID", "warning": "GPUXIDError", "info": "GPUXIDError"}


def xid_scenario(action: str) -> Scenario:
    known = ACTIONS.get(action, LOOK_UP)
    code = str(XID_CASES[action])
    return Scenario(f"XID {code}: {action}", XID_NAMES[known.severity],
                    {gpu("inferwatch_gpu_xid_errors_total", xid=code): "_ _ _ 1x20"},
                    quiet_at=("2m",), fires_at="4m",
                    labels={**GPU, "xid": code, "action": action, "severity": known.severity}, value="1",
                    resolved_at="14m")


XID_SCENARIOS = [xid_scenario(a) for a in XID_CASES]


def test_every_xid_action_has_a_case_of_its_own_code():
    assert set(XID_CASES) == set(ACTIONS) | {LOOK_UP.name}
    for action, code in XID_CASES.items():
        assert (XID_ACTIONS.get(code, LOOK_UP.name)) == action
        assert action == LOOK_UP.name or code in codes_of(action)


def test_each_xid_alerts_with_the_action_of_its_code_and_pages_only_to_take_a_gpu_out(tmp_path):
    result = run_promtool(promtool_doc(XID_SCENARIOS), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    paging = {a for a in XID_CASES if ACTIONS.get(a, LOOK_UP).severity == "critical"}
    assert paging == {"reboot_node", "reset_gpu"}


@pytest.mark.parametrize("field", ["straggler_stddevs", "straggler_deficit", "straggler_min_utilization"])
def test_the_straggler_thresholds_come_from_the_settings(field):
    from inferwatch.alerts.spec import build
    from inferwatch.config.settings import Settings
    changed = Settings.model_validate({"alerts": {"thresholds": {field: 0.37}}})
    rule = next(a for a in build(changed).alerts if a.name == "GPUStraggler")
    assert "0.37" in rule.expr and "0.37" not in next(a for a in DEFAULT.alerts if a.name == "GPUStraggler").expr


# every scenario here that fires an alert: tests/alerts/test_rules_promtool.py counts them
FIRING = [STRAGGLER, NVLINK, *DEGRADATION, *XID_SCENARIOS]


def test_the_xid_runbooks_list_every_code_with_its_action():
    from inferwatch.alerts.generate import RULES_DIR
    runbooks = RULES_DIR.parent / "runbooks"
    for code, action in XID_ACTIONS.items():
        name = XID_NAMES[ACTIONS[action].severity]
        rows = [line for line in (runbooks / f"{name}.md").read_text().splitlines() if line.startswith(f"| {code} | ")]
        assert len(rows) == 1 and f"| `{action}` |" in rows[0], (code, name, rows)


def test_on_kubernetes_a_node_of_two_models_compares_each_pods_gpus_with_their_own(tmp_path):
    """Off Kubernetes such a node has no peers (above); with the pods the kubelet names, the
    GPUs of m1's pod are compared among themselves, and m2's among theirs."""
    peers = [1980.0, 1940.0, 2000.0]
    clocks = [*peers, float(np.mean(peers)) * 0.85, *[1970.0] * 4]
    series = fleet([[c] * 61 for c in clocks], utilization=0.9)
    for model, pod, instance, gpus in (("m1", "vllm-a", "node1:8000", range(4)), ("m2", "vllm-b", "node1:8001", range(4, 8))):
        series[selector("vllm:num_requests_running", {"job": "vllm", "instance": instance, "model": model,
                                                      "namespace": "serving", "pod": pod})] = "4x60"
        for i in gpus:
            series[selector("inferwatch_gpu_pod_info", {
                **card(i), "namespace": "serving", "pod": pod, "container": "vllm", "resource": "nvidia.com/gpu",
                "device": card(i)["uuid"], "shared": "false"})] = "1x60"
    scenario = Scenario("GPU 3 of m1's pod 15 % slow on a node that also serves m2", "GPUStraggler", series,
                        quiet_at=("5m",), fires_at="12m", labels=straggler_labels(3), value="15%")
    result = run_promtool(promtool_doc([scenario]), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
