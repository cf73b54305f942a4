"""The cost rules (alerts/cost.py) through promtool, on series shaped as vLLM and the GPU
exporter export them and as each deployment labels them: numbers checked against values
worked out by hand, and no per-model number where a host served several models.

Every input moves at a steady rate, sampled each minute, and is read at 10m: the 5m window
then holds six samples from its start to its end, so a rate is the exact slope."""

from __future__ import annotations

import pytest

from inferwatch.alerts import cost
from inferwatch.alerts.generate import RULES_DIR, render, rule_files
from inferwatch.alerts.spec import build
from inferwatch.config.errors import SettingsInvalid
from inferwatch.config.load import parse
from tests.alerts.promtool import run_promtool, selector

COST_RULES = RULES_DIR / "cost.yml"
AT = "10m"
H100 = "NVIDIA H100 80GB HBM3"


def vllm(name: str, instance: str, model: str, **target: str) -> str:
    """A vLLM series: vLLM's own labels (``model_name``, ``engine``), its target's (``job``,
    ``instance`` and whatever the scrape config adds) and ``model``, relabelled from
    ``model_name``."""
    return selector(name, {"job": "vllm", "instance": instance, **target, "model_name": model, "engine": "0",
                           "model": model})


def serving(model: str, instance: str, output_per_s: float, prompt_per_s: float = 0, **target: str) -> dict:
    """A vLLM serving ``model`` at steady token rates, with requests running."""
    return {vllm("vllm:generation_tokens_total", instance, model, **target): f"0+{60 * output_per_s:g}x30",
            vllm("vllm:prompt_tokens_total", instance, model, **target): f"0+{60 * prompt_per_s:g}x30",
            vllm("vllm:num_requests_running", instance, model, **target): "3x30"}


def gpu_labels(instance: str, index: int, **target: str) -> dict[str, str]:
    """An exporter's per-GPU labels (exporters/metrics.py GPU_LABELS) and its target's."""
    return {"job": "inferwatch-exporter", "instance": instance, **target, "gpu": str(index),
            "uuid": f"GPU-{instance.split(':')[0]}-{index}", "name": H100,
            "pci_bus_id": f"00000000:{index + 1:02X}:00.0"}


def gpus(instance: str, *readings: tuple[float, float], **target: str) -> dict:
    """The exporter of one host: a (watts, utilization) per GPU, steady."""
    out = {}
    for index, (watts, utilization) in enumerate(readings):
        labels = gpu_labels(instance, index, **target)
        out |= {selector("inferwatch_gpu_info", labels): "1x30",
                selector("inferwatch_gpu_energy_joules_total", labels): f"0+{60 * watts:g}x30",
                selector("inferwatch_gpu_utilization_ratio", labels): f"{utilization:g}x30"}
    return out


def check(record: str, expected: dict[str, float], at: str = AT, matchers: str = "") -> dict:
    """``record`` (to 0.001) is exactly ``expected`` (labels as promtool writes them -> value)."""
    return {"expr": f"round({record}{{{matchers}}}, 0.001)", "eval_time": at,
            "exp_samples": [{"labels": labels, "value": value} for labels, value in expected.items()]}


def none(record: str, matchers: str = "", at: str = AT) -> dict:
    return check(record, {}, at, matchers)


def run(tmp_path, name: str, series: dict, checks: list[dict], rules=COST_RULES) -> None:
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m",
           "tests": [{"name": name, "interval": "1m",
                      "input_series": [{"series": k, "values": v} for k, v in series.items()],
                      "promql_expr_test": checks}]}
    result = run_promtool(doc, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


M1 = '{model="m1"}'
# `inferwatch up`: vLLM and the exporter scraped at the same address, no host label
LOCAL = {**serving("m1", "127.0.0.1:8000", output_per_s=100, prompt_per_s=200),
         **gpus("127.0.0.1:9400", (300, 0.9), (200, 0.5))}


def test_one_model_on_a_host_gets_all_its_gpus(tmp_path):
    """100 output tokens/s on two GPUs drawing 300 W and 200 W, busy 90% and 50% of the time:
    50 tokens/s per GPU; 2 GPU-seconds per 100 tokens, 20 per 1k; 500 J/s per 100 tokens,
    5,000 J per 1k; at $2 per GPU-hour, 2 x 2 / 3600 $/s per 100 tokens, $11.111 per 1M; idle
    10% and 50% of the time, 30% on average."""
    local = 'host="127.0.0.1"'
    run(tmp_path, "inferwatch up: one vLLM, one exporter, both at 127.0.0.1", LOCAL, [
        check(cost.TOKENS_PER_GPU_SECOND, {M1: 50}),
        check(cost.GPU_SECONDS_PER_1K, {M1: 20}),
        check(cost.JOULES_PER_1K, {M1: 5000}),
        check(cost.DOLLARS_PER_1M, {M1: 11.111}),
        check(cost.MODEL_GPU_IDLE, {M1: 0.3}),
        check(cost.MODEL_GPUS, {M1: 2}),
        check(cost.MODEL_OUTPUT, {M1: 100}),
        check(cost.MODEL_PROMPT, {M1: 200}),
        check(cost.MODEL_ENERGY, {M1: 500}),
        check(cost.GPU_HOUR_PRICE, {"{}": 2}),
        check(cost.HOST_TOKENS_PER_GPU_SECOND, {f"{{{local}}}": 50}),
        check(cost.GPU_IDLE, {selector("", {**gpu_labels("127.0.0.1:9400", 0), "host": "127.0.0.1"}): 0.1,
                              selector("", {**gpu_labels("127.0.0.1:9400", 1), "host": "127.0.0.1"}): 0.5}),
        none(cost.SHARED_GPUS),
    ])


def test_a_host_of_two_models_gives_no_per_model_number(tmp_path):
    """10.0.0.2 serves m1 and m2 on its 4 GPUs: neither gets a number from it. m1 also runs
    alone on 10.0.0.1 (1 GPU, 40 tokens/s): its numbers are that host's only, tokens and GPUs
    alike. 10.0.0.2 is counted as 4 GPUs shared, and its blend recorded per host only."""
    series = {**serving("m1", "10.0.0.1:8000", output_per_s=40), **gpus("10.0.0.1:9400", (250, 0.8)),
              **serving("m1", "10.0.0.2:8000", output_per_s=300), **serving("m2", "10.0.0.2:8001", output_per_s=100),
              **gpus("10.0.0.2:9400", (400, 1), (400, 1), (400, 1), (400, 1))}
    run(tmp_path, "two vLLMs of two models on one host", series, [
        check(cost.TOKENS_PER_GPU_SECOND, {M1: 40}),
        check(cost.MODEL_GPUS, {M1: 1}),
        check(cost.JOULES_PER_1K, {M1: 6250}),  # 1000 x 250 W / 40 tokens/s
        check(cost.MODEL_GPU_IDLE, {M1: 0.2}),
        *(none(record, 'model="m2"') for record in (
            cost.TOKENS_PER_GPU_SECOND, cost.GPU_SECONDS_PER_1K, cost.JOULES_PER_1K, cost.DOLLARS_PER_1M,
            cost.MODEL_GPU_IDLE, cost.MODEL_GPUS, cost.MODEL_OUTPUT)),
        check(cost.SHARED_GPUS, {'{host="10.0.0.2"}': 4}),
        check(cost.HOST_TOKENS_PER_GPU_SECOND, {'{host="10.0.0.1"}': 40, '{host="10.0.0.2"}': 100}),
        check(cost.HOST_MODELS, {'{host="10.0.0.1"}': 1, '{host="10.0.0.2"}': 2}),
    ])


def gateway_tokens(name: str, per_s: float, **labels: str) -> dict:
    """A gateway counter of output tokens moving at ``per_s``."""
    return {selector(name, {"job": "inferwatch-gateway", "instance": "127.0.0.1:8080", **labels}): f"0+{60 * per_s:g}x30"}


def test_tenants_and_adapters_pay_their_share_of_their_models_tokens(tmp_path):
    """m1 costs $11.111 per 1M output tokens (as above). Tenant search takes 60 tokens/s of
    it, chat 40 of which 30 go to the LoRA adapter m1-lora (counted under its base, m1, as
    vLLM counts it): $666.667, $444.444 and $333.333 per 1M seconds. Over the 10 minutes
    there are, search's 36,000 tokens cost $0.4 and chat's 24,000 $0.267."""
    series = {**LOCAL,
              **gateway_tokens("inferwatch_gateway_tenant_output_tokens_total", 60, tenant="search", model="m1"),
              **gateway_tokens("inferwatch_gateway_tenant_output_tokens_total", 40, tenant="chat", model="m1"),
              **gateway_tokens("inferwatch_gateway_adapter_output_tokens_total", 30, model="m1", adapter="m1-lora")}
    def per_million_seconds(record: str, expected: dict[str, float]) -> dict:
        return {**check(record, expected), "expr": f"round(1e6 * {record}, 0.001)"}

    run(tmp_path, "tenant and adapter dollars", series, [
        per_million_seconds(cost.TENANT_DOLLARS, {'{model="m1",tenant="search"}': 666.667,
                                                  '{model="m1",tenant="chat"}': 444.444}),
        per_million_seconds(cost.ADAPTER_DOLLARS, {'{adapter="m1-lora",model="m1"}': 333.333}),
        check(cost.TENANT_DOLLARS_DAY, {'{tenant="search"}': 0.4, '{tenant="chat"}': 0.267}),
    ])


def served(model: str, variant: str, name: str, gateway: str) -> str:
    return selector("inferwatch_gateway_variant_served_model_info",
                    {"job": "inferwatch-gateway", "instance": gateway, "model": model, "variant": variant,
                     "served_model": name})


def test_each_ab_variant_on_gpus_of_its_own_gets_its_served_names_number(tmp_path):
    """chat's control (served as llama) runs alone on 10.0.0.1 (2 GPUs, 120 tokens/s), its
    canary (llama-awq) alone on 10.0.0.2 (1 GPU, 45 tokens/s): 60 and 45 tokens per
    GPU-second, one series each however many gateways say so. chat2's two variants share one
    engine (one served name): neither gets a number."""
    series = {**serving("llama", "10.0.0.1:8000", output_per_s=120), **gpus("10.0.0.1:9400", (300, 1), (300, 1)),
              **serving("llama-awq", "10.0.0.2:8000", output_per_s=45), **gpus("10.0.0.2:9400", (200, 1)),
              **serving("tiny", "10.0.0.3:8000", output_per_s=10), **gpus("10.0.0.3:9400", (50, 1)),
              **{served("chat", "stable", "llama", gw): "1x30" for gw in ("10.0.1.1:8080", "10.0.1.2:8080")},
              **{served("chat", "canary", "llama-awq", gw): "1x30" for gw in ("10.0.1.1:8080", "10.0.1.2:8080")},
              served("chat2", "a", "tiny", "10.0.1.1:8080"): "1x30",
              served("chat2", "b", "tiny", "10.0.1.1:8080"): "1x30"}
    run(tmp_path, "A/B variants", series, [
        check(cost.VARIANT_TOKENS_PER_GPU_SECOND, {'{model="chat", variant="stable"}': 60,
                                                   '{model="chat", variant="canary"}': 45}),
    ])


def test_kubernetes_joins_pods_by_the_node_they_run_on(tmp_path):
    """Pod addresses say nothing of the node: the monitors label vLLM's and the exporter's
    series with it (``host``). Two replicas of m1 on one node share its 2 GPUs (60 + 20
    tokens/s); the GPUs of a node without vLLM go to no model, and are idle."""
    def pod(name: str, node: str) -> dict[str, str]:
        return {"namespace": "inferwatch", "pod": name, "service": "vllm-m1", "host": node}

    exporter = {"namespace": "inferwatch", "node": "gpu-node-1", "host": "gpu-node-1"}
    idle_node = {"namespace": "inferwatch", "node": "gpu-node-2", "host": "gpu-node-2"}
    series = {**serving("m1", "10.1.2.3:8000", output_per_s=60, **pod("vllm-m1-a", "gpu-node-1")),
              **serving("m1", "10.1.2.4:8000", output_per_s=20, **pod("vllm-m1-b", "gpu-node-1")),
              **gpus("10.1.9.1:9400", (350, 1), (350, 1), **exporter),
              **gpus("10.1.9.2:9400", (60, 0), **idle_node)}
    run(tmp_path, "Kubernetes: two replicas of one model on a node, an idle node", series, [
        check(cost.TOKENS_PER_GPU_SECOND, {M1: 40}),
        check(cost.GPU_SECONDS_PER_1K, {M1: 25}),  # 1000 x 2 / 80
        check(cost.JOULES_PER_1K, {M1: 8750}),  # 1000 x 700 / 80
        check(cost.MODEL_GPU_IDLE, {M1: 0}),
        check(cost.GPU_IDLE, {selector("", {**gpu_labels("10.1.9.2:9400", 0, **idle_node)}): 1},
              matchers='host="gpu-node-2"'),
        check(cost.HOST_GPUS, {'{host="gpu-node-1"}': 2, '{host="gpu-node-2"}': 1}),
    ])


def test_compose_joins_its_containers_by_the_target_files_host(tmp_path):
    """vllm:8000 and exporter:9400 are two containers of one machine: the target files give
    both ``host: compose``."""
    from inferwatch.deploy.monitoring import COMPOSE_HOST, COMPOSE_TARGETS, target_groups

    groups = target_groups(COMPOSE_TARGETS)
    assert groups["vllm"][0]["labels"]["host"] == groups["inferwatch-exporter"][0]["labels"]["host"] == COMPOSE_HOST
    host = {"host": COMPOSE_HOST}
    series = {**serving("m1", "vllm:8000", output_per_s=30, **host), **gpus("exporter:9400", (90, 0.6), **host)}
    run(tmp_path, "compose", series, [check(cost.TOKENS_PER_GPU_SECOND, {M1: 30}),
                                      check(cost.DOLLARS_PER_1M, {M1: 18.519})])  # 1e6 x 2 / 3600 / 30


def test_a_vllm_without_gpus_of_its_host_and_a_model_generating_nothing(tmp_path):
    """vLLM's CPU build (no exporter on its host, or one without GPUs) gets no number; a model
    that generates nothing costs its GPUs all the same: 0 tokens per GPU-second, its GPUs
    idle, and no cost per token (a division by zero is not one)."""
    series = {**serving("cpu-model", "10.0.0.9:8000", output_per_s=5),
              **gpus("10.0.0.8:9400", (70, 0)), **serving("quiet", "10.0.0.8:8000", output_per_s=0)}
    quiet = '{model="quiet"}'
    run(tmp_path, "no GPUs, no tokens", series, [
        *(none(record, 'model="cpu-model"') for record in (cost.TOKENS_PER_GPU_SECOND, cost.MODEL_GPUS)),
        check(cost.TOKENS_PER_GPU_SECOND, {quiet: 0}),
        check(cost.MODEL_GPU_IDLE, {quiet: 1}),
        *(none(record, 'model="quiet"') for record in (cost.GPU_SECONDS_PER_1K, cost.JOULES_PER_1K,
                                                       cost.DOLLARS_PER_1M)),
    ])


def test_a_model_that_replaces_another_is_attributed_once_the_window_holds_it_alone(tmp_path):
    """vLLM restarted with another model at 5m: for the next 5 minutes the window holds both,
    and the host goes to neither."""
    instance = "10.0.0.3:8000"
    series = {vllm("vllm:generation_tokens_total", instance, "old"): "0+600x5 _x25",
              vllm("vllm:num_requests_running", instance, "old"): "1x5 _x25",
              vllm("vllm:generation_tokens_total", instance, "new"): "_x6 0+1200x24",
              vllm("vllm:num_requests_running", instance, "new"): "_x6 1x24",
              **gpus("10.0.0.3:9400", (100, 0.5))}
    run(tmp_path, "model switch", series, [
        check(cost.TOKENS_PER_GPU_SECOND, {'{model="old"}': 10}, at="5m"),
        none(cost.TOKENS_PER_GPU_SECOND, at="9m"),
        check(cost.SHARED_GPUS, {'{host="10.0.0.3"}': 1}, at="9m"),
        check(cost.TOKENS_PER_GPU_SECOND, {'{model="new"}': 20}, at="12m"),
    ])


def _cost_rules(tmp_path, settings_text: str):
    path = tmp_path / "cost.yml"
    path.write_text(render(rule_files(build(parse(settings_text)))["cost.yml"]))
    return path


def test_the_price_per_gpu_hour_is_a_setting(tmp_path):
    """cost.gpu_hour_price 3.60: 2 GPUs for 100 tokens/s cost 2 x 3.6 / 3600 $/s, $20 per 1M tokens."""
    path = _cost_rules(tmp_path, "cost:\n  gpu_hour_price: 3.60\n")
    run(tmp_path, "price 3.60", LOCAL, [check(cost.DOLLARS_PER_1M, {M1: 20}),
                                         check(cost.GPU_HOUR_PRICE, {"{}": 3.6})], rules=path)


def test_gpus_of_another_model_cost_their_own_price(tmp_path):
    """Two hosts of m1: one of two H100 at $4/h, one of one other GPU at the default $1.5/h.
    $9.5/h for 100 + 100 tokens/s: 9.5 / 3600 / 200 x 1e6 = $13.194 per 1M tokens."""
    other = {k.replace(H100, "NVIDIA L4"): v for k, v in gpus("10.0.0.2:9400", (70, 0.5), host="b").items()}
    series = {**serving("m1", "10.0.0.1:8000", output_per_s=100, host="a"),
              **gpus("10.0.0.1:9400", (300, 0.9), (200, 0.5), host="a"),
              **serving("m1", "10.0.0.2:8000", output_per_s=100, host="b"), **other}
    path = _cost_rules(tmp_path, f"cost:\n  gpu_hour_price: 1.5\n  gpu_hour_prices:\n    {H100}: 4\n")
    run(tmp_path, "prices per GPU model", series, [
        check(cost.HOST_DOLLARS, {'{host="a"}': 8, '{host="b"}': 1.5}),
        check(cost.MODEL_DOLLARS, {M1: 9.5}),
        check(cost.DOLLARS_PER_1M, {M1: round(9.5 / 3600 / 200 * 1e6, 3)})], rules=path)


@pytest.mark.parametrize("text", ["abc", "0", "-2", ".nan", ".inf"])
def test_a_price_that_is_no_price_is_refused_with_the_field_named(text):
    with pytest.raises(SettingsInvalid, match=r"inferwatch.yaml:2:\d+: cost.gpu_hour_price"):
        parse(f"cost:\n  gpu_hour_price: {text}\n")


def test_the_instance_host_regex_takes_the_host_part_of_any_address(tmp_path):
    """host:port, [IPv6]:port and a bare name, through Prometheus's own label_replace."""
    addresses = {"10.0.0.1:9400": "10.0.0.1", "[fd00::1]:9400": "[fd00::1]", "gpu-box": "gpu-box",
                 "node.example.com:8000": "node.example.com"}
    series = {selector("probe", {"instance": address}): "1x10" for address in addresses}
    expr = f'label_replace(probe, "host", "$1", "instance", "{cost.INSTANCE_HOST}")'
    run(tmp_path, "host of instance", series, [{
        "expr": expr, "eval_time": "5m",
        "exp_samples": [{"labels": selector("probe", {"instance": a, "host": h}), "value": 1}
                        for a, h in addresses.items()]}])


def test_pods_and_namespaces_pay_for_the_gpus_they_hold_alone(tmp_path):
    """One node, four GPUs at $2 an hour: serving/vllm-a holds GPUs 0 and 1 and makes 500
    tokens/s, serving/vllm-b holds GPU 2 and makes 100, batch/x and batch/y share GPU 3
    (time-slicing). vllm-a: $4/h over 500 tokens/s = $2.222 per 1M; vllm-b: $2/h over 100 =
    $5.556; serving: $6/h over 600 = $2.778. batch's shared GPU is counted, priced to nobody."""
    node = {"host": "node-a"}
    series = gpus("10.0.0.7:9400", *[(300, 0.9)] * 4, **node)

    def held(index: int, namespace: str, pod: str, shared: str) -> tuple[str, str]:
        labels = {**gpu_labels("10.0.0.7:9400", index, **node), "namespace": namespace, "pod": pod,
                  "container": "vllm", "resource": "nvidia.com/gpu", "device": f"GPU-10.0.0.7-{index}",
                  "shared": shared}
        return selector("inferwatch_gpu_pod_info", labels), "1x30"

    series |= dict([held(0, "serving", "vllm-a", "false"), held(1, "serving", "vllm-a", "false"),
                    held(2, "serving", "vllm-b", "false"), held(3, "batch", "x", "true"), held(3, "batch", "y", "true")])
    series |= serving("m1", "10.1.0.4:8000", output_per_s=500, namespace="serving", pod="vllm-a", **node)
    series |= serving("m2", "10.1.0.5:8000", output_per_s=100, namespace="serving", pod="vllm-b", **node)
    a, b = '{namespace="serving", pod="vllm-a"}', '{namespace="serving", pod="vllm-b"}'
    run(tmp_path, "pods holding GPUs", series, [
        check(cost.POD_GPUS, {a: 2, b: 1}),
        check(cost.NAMESPACE_GPUS, {'{namespace="serving"}': 3}),
        check(cost.NAMESPACE_SHARED_GPUS, {'{namespace="batch"}': 1}),
        check(cost.POD_DOLLARS, {a: 4, b: 2}),
        check(cost.POD_DOLLARS_PER_1M, {a: 2.222, b: 5.556}),
        check(cost.NAMESPACE_DOLLARS_PER_1M, {'{namespace="serving"}': 2.778}),
    ])
