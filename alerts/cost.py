"""What a model's tokens cost in GPU time, energy and money: recording rules, as data.

``make generate`` writes them to ``alerts/rules/cost.yml`` (``inferwatch up`` to its own
copy) with the prices per GPU-hour of the settings (``cost`` in ``inferwatch.yaml``). The
dashboards' Cost row and the A/B ``cost`` guardrail read the recorded series, never the
raw counters, so they cannot disagree on what a GPU-second is.

How GPU time is attributed to a model (docs/cost.md says it for operators):

- **The join is the host.** Every vLLM series and every GPU series gets a ``host`` label:
  the target's own ``host`` where its scrape config sets one (the compose stack's target
  files; Kubernetes, from the node a pod runs on), else the host part of ``instance``
  (``inferwatch up``, where vLLM and the exporter are both scraped at 127.0.0.1). A vLLM and
  the GPUs of its host are then joined on ``host``; nothing else ties a vLLM to a GPU in
  what Prometheus sees (vLLM exports no device ids, the exporter no vLLM).
- **A host that served one model in the window gives all its GPUs to that model**, also the
  GPUs its vLLM does not use: the host is what is paid for, and the idle share says how
  much of it waits. Several vLLM replicas of the same model on one host are that model's.
  Work that is not vLLM's (a training job on the same host) is invisible here, and charged
  to the model too.
- **A host that served several models in the window is not attributed**: nothing exported
  says which GPU (or which share of one, under MPS or time slicing) each model used, so no
  per-model number is made from it, not even a split by tokens, which would charge a small
  model for a large one's GPUs. Its GPUs are counted in ``SHARED_GPUS`` and its tokens per
  GPU-second are recorded per host (``HOST_TOKENS_PER_GPU_SECOND``), for the host only. A
  model that replaces another shows as two models for one window.
- A model's numbers cover the hosts it runs on alone, tokens and GPUs alike: its replicas on
  a shared host leave both out, so the ratio holds for the part it covers.
- **The unit is vLLM's served model name** (its ``model_name``, relabelled ``model``), not
  the gateway's public name and variant: vLLM does not know the variant. An A/B variant with
  a served name of its own (the experiment file's ``model``) on GPUs of its own is its own
  series; variants under one served name are one series, and variants of two served names
  on one host have none.

Every ratio reads rates over ``WINDOW``. Ratios per output token are absent while a model
generates nothing (a division by zero is no cost); the idle share still counts those GPUs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.model import Record
from inferwatch.config.settings import Cost

WINDOW = "5m"

# the host part of `instance` (host:port, [v6]:port, or a bare host): RE2, anchored
INSTANCE_HOST = "(.+?)(?::[0-9]+)?"
_NO_HOST, _OWN_HOST = 'host=""', 'host!=""'

_ENERGY = m("inferwatch_gpu_energy_joules_total")
_UTILIZATION = m("inferwatch_gpu_utilization_ratio")
_GPU = m("inferwatch_gpu_info")
_OUTPUT = m("vllm:generation_tokens_total")
_PROMPT = m("vllm:prompt_tokens_total")
_RUNNING = m("vllm:num_requests_running")
_SERVED = ',model!=""'  # vLLM's series name their model (model_name, relabelled model)

# per host (and model)
HOST_MODEL = "inferwatch_cost:host_model:info"  # {host, model}: models served on the host in the window
HOST_MODELS = "inferwatch_cost:host_models:count"  # {host}
HOST_GPUS = "inferwatch_cost:host_gpus:count"  # {host}
HOST_ENERGY = f"inferwatch_cost:host_gpu_energy:joules_rate{WINDOW}"  # {host}: watts, all its GPUs
HOST_OUTPUT = f"inferwatch_cost:host_model_output_tokens:rate{WINDOW}"  # {host, model}
HOST_PROMPT = f"inferwatch_cost:host_model_prompt_tokens:rate{WINDOW}"  # {host, model}
ATTRIBUTED_GPUS = "inferwatch_cost:host_model_gpus:count"  # {host, model}: only hosts of one model
SHARED_GPUS = "inferwatch_cost:host_gpus_shared:count"  # {host}: GPUs of hosts of several models
HOST_TOKENS_PER_GPU_SECOND = f"inferwatch_cost:host_output_tokens_per_gpu_second:rate{WINDOW}"  # {host}
# per GPU
GPU_IDLE = f"inferwatch_cost:gpu_idle:ratio_avg{WINDOW}"  # the exporter's GPU labels and host
# per model
MODEL_GPUS = "inferwatch_cost:model_gpus:count"
MODEL_OUTPUT = f"inferwatch_cost:model_output_tokens:rate{WINDOW}"
MODEL_PROMPT = f"inferwatch_cost:model_prompt_tokens:rate{WINDOW}"
MODEL_ENERGY = f"inferwatch_cost:model_gpu_energy:joules_rate{WINDOW}"
TOKENS_PER_GPU_SECOND = f"inferwatch_cost:model_output_tokens_per_gpu_second:rate{WINDOW}"  # the A/B cost guardrail's
GPU_SECONDS_PER_1K = f"inferwatch_cost:model_gpu_seconds_per_1k_output_tokens:rate{WINDOW}"
JOULES_PER_1K = f"inferwatch_cost:model_joules_per_1k_output_tokens:rate{WINDOW}"
DOLLARS_PER_1M = f"inferwatch_cost:model_dollars_per_1m_output_tokens:rate{WINDOW}"
MODEL_GPU_IDLE = f"inferwatch_cost:model_gpu_idle:ratio_avg{WINDOW}"
GPU_HOUR_PRICE = "inferwatch_cost:gpu_hour_price:dollars"
# with prices per GPU model (settings: cost.gpu_hour_prices): dollars per hour of a host's GPUs, and a model's
HOST_DOLLARS = "inferwatch_cost:host_gpu_hour_price:dollars"  # {host}
MODEL_DOLLARS = "inferwatch_cost:model_gpu_hour_price:dollars"  # {model}
# per A/B variant {model (the public name), variant}: what the A/B cost guardrail reads
VARIANT_TOKENS_PER_GPU_SECOND = f"inferwatch_cost:variant_output_tokens_per_gpu_second:rate{WINDOW}"
_VARIANT_SERVED = m("inferwatch_gateway_variant_served_model_info")
# per tenant {tenant, model}: its output tokens at the model's dollars per token; a day's sum {tenant}
TENANT_DOLLARS = f"inferwatch_cost:tenant_dollars_per_second:rate{WINDOW}"
TENANT_DOLLARS_DAY = "inferwatch_cost:tenant_dollars:sum1d"
_TENANT_OUTPUT = m("inferwatch_gateway_tenant_output_tokens_total")
# per LoRA adapter {model (its base), adapter}: its output tokens at its base model's dollars per token
ADAPTER_DOLLARS = f"inferwatch_cost:adapter_dollars_per_second:rate{WINDOW}"
_ADAPTER_OUTPUT = m("inferwatch_gateway_adapter_output_tokens_total")
# per Kubernetes pod and namespace, from which pod holds which GPU (the kubelet's pod-resources
# API, exporters/pod_resources.py): the whole GPUs a pod holds alone are its own; a GPU several
# containers share (time-slicing, MIG) is counted apart, never split
_POD_GPU = m("inferwatch_gpu_pod_info")
POD_GPUS = "inferwatch_cost:pod_gpus:count"  # {namespace, pod}
NAMESPACE_GPUS = "inferwatch_cost:namespace_gpus:count"  # {namespace}
NAMESPACE_SHARED_GPUS = "inferwatch_cost:namespace_gpus_shared:count"  # {namespace}
POD_DOLLARS = "inferwatch_cost:pod_gpu_hour_price:dollars"  # {namespace, pod}
NAMESPACE_DOLLARS = "inferwatch_cost:namespace_gpu_hour_price:dollars"  # {namespace}
POD_OUTPUT = f"inferwatch_cost:pod_output_tokens:rate{WINDOW}"  # {namespace, pod}: vLLM's, by its pod
POD_DOLLARS_PER_1M = f"inferwatch_cost:pod_dollars_per_1m_output_tokens:rate{WINDOW}"  # {namespace, pod}
NAMESPACE_DOLLARS_PER_1M = f"inferwatch_cost:namespace_dollars_per_1m_output_tokens:rate{WINDOW}"  # {namespace}


def hosted(expr: Callable[[str], str]) -> str:
    """``expr`` (of the label matchers it is given, without braces) on every series with a
    ``host`` label: the target's own where its scrape config set one, else the host part of
    ``instance``. Two selections, so no series is taken twice and none loses its own ``host``
    (``label_replace`` would overwrite it)."""
    derived = f'label_replace({expr(_NO_HOST)}, "host", "$1", "instance", "{INSTANCE_HOST}")'
    return f"{derived}\nor {expr(_OWN_HOST)}"


def _window(name: str, fn: str, matchers: str = "") -> Callable[[str], str]:
    """``fn`` over ``name`` in the window, e.g. ``rate(x{host=""}[5m])``."""
    return lambda sel: f"{fn}({name}{{{sel}{matchers}}}[{WINDOW}])"


def _of(outer: str, inner: str) -> str:
    """``outer (inner)``, the inner expression on lines of its own, indented."""
    return f"{outer} (\n{textwrap.indent(inner, '  ')}\n)"


def _one_per_gpu(expr: str) -> str:
    """One series per GPU of a host: a GPU scraped twice (two jobs, an exporter moved to a new
    address within the window) counts once."""
    return _of("max by (host, uuid)", expr)


def _on_attributed(expr: str) -> str:
    """``expr`` (per host) labelled with the model its host is attributed to; dropped for a
    host of several models or of none."""
    return f"{expr}\n* on (host) group_left (model) group by (host, model) ({ATTRIBUTED_GPUS})"


def _per_output_tokens(numerator: str, per: int) -> str:
    """``numerator`` (per second) per ``per`` output tokens; none while none are generated."""
    return f"{per} * {numerator} / ({MODEL_OUTPUT} > 0)"


def _priced_gpus(prices: Cost) -> str:
    """Each GPU of a host at its model's price per hour (NVML's ``name``), else the default."""
    def at(price: float, matcher: str) -> str:
        return _of("max by (host, uuid)", hosted(lambda sel: f"{_GPU}{{{sel}{matcher}}}")) + f" * 0 + {price!r}"
    terms = [at(price, f',name="{name}"') for name, price in sorted(prices.gpu_hour_prices.items())]
    return "\nor ".join(f"({t})" for t in (*terms, at(prices.gpu_hour_price, "")))


def _price_records(prices: Cost) -> tuple[Record, ...]:
    """Dollars per GPU-hour of each host and model, where GPU models differ in price."""
    if not prices.gpu_hour_prices:
        return ()
    return (Record(HOST_DOLLARS, _of("sum by (host)", _priced_gpus(prices))),
            Record(MODEL_DOLLARS, _of("sum by (model)", _on_attributed(HOST_DOLLARS))))


def _dollars_per_second(prices: Cost) -> str:
    if prices.gpu_hour_prices:
        return f"{MODEL_DOLLARS} / 3600"
    return f"{MODEL_GPUS} * {prices.gpu_hour_price!r} / 3600"


def _pod_records(prices: Cost) -> tuple[Record, ...]:
    """GPUs, their price and cost per token per pod and namespace. A pod's tokens are vLLM's
    series of that pod (the scrape's ``namespace`` and ``pod``): its dollars per token are its
    GPUs' price over its own output, whatever models other pods of the node serve."""
    held = f'group by (uuid, namespace, pod) ({_POD_GPU}{{shared="false"}})'
    priced = _of("max by (uuid)", _priced_gpus(prices))
    return (
        Record(POD_GPUS, f"count by (namespace, pod) ({held})"),
        Record(NAMESPACE_GPUS, f"sum by (namespace) ({POD_GPUS})"),
        Record(NAMESPACE_SHARED_GPUS,
               f'count by (namespace) (group by (uuid, namespace) ({_POD_GPU}{{shared="true"}}))'),
        Record(POD_DOLLARS, _of("sum by (namespace, pod)", f"{priced}\n* on (uuid) group_left (namespace, pod) {held}")),
        Record(NAMESPACE_DOLLARS, f"sum by (namespace) ({POD_DOLLARS})"),
        Record(POD_OUTPUT, f'sum by (namespace, pod) (rate({_OUTPUT}{{pod!=""{_SERVED}}}[{WINDOW}]))'),
        Record(POD_DOLLARS_PER_1M, f"1e6 * {POD_DOLLARS} / 3600 / ({POD_OUTPUT} > 0)"),
        Record(NAMESPACE_DOLLARS_PER_1M,
               f"1e6 * {NAMESPACE_DOLLARS} / 3600\n/ (sum by (namespace) ({POD_OUTPUT} and on (namespace, pod) "
               f"{POD_DOLLARS}) > 0)"),
    )


def records(prices: Cost = Cost()) -> tuple[Record, ...]:
    """The rules, in the order one evaluation must run them (each reads those above it)."""
    price = prices.gpu_hour_price
    return (
        # -- the join: which models each host served, and its GPUs ---------------------------
        Record(HOST_MODEL, _of("group by (host, model)", hosted(_window(_RUNNING, "last_over_time", _SERVED)))),
        Record(HOST_MODELS, f"count by (host) ({HOST_MODEL})"),
        Record(HOST_GPUS, _of("count by (host)", _one_per_gpu(hosted(lambda sel: f"{_GPU}{{{sel}}}")))),
        Record(HOST_ENERGY, _of("sum by (host)", _one_per_gpu(hosted(_window(_ENERGY, "rate"))))),
        Record(HOST_OUTPUT, _of("sum by (host, model)", hosted(_window(_OUTPUT, "rate", _SERVED)))),
        Record(HOST_PROMPT, _of("sum by (host, model)", hosted(_window(_PROMPT, "rate", _SERVED)))),
        Record(ATTRIBUTED_GPUS, f"{HOST_GPUS}\n* on (host) group_left (model) "
                                f"({HOST_MODEL} and on (host) {HOST_MODELS} == 1)"),
        Record(SHARED_GPUS, f"{HOST_GPUS} and on (host) {HOST_MODELS} > 1"),
        Record(HOST_TOKENS_PER_GPU_SECOND, f"sum by (host) ({HOST_OUTPUT}) / on (host) {HOST_GPUS}"),
        # NVML's utilization is already a share of time (a kernel ran at any moment of its
        # sample period), so one minus its mean is the share of the window no kernel ran
        Record(GPU_IDLE, _of("1 -", hosted(_window(_UTILIZATION, "avg_over_time")))),
        # -- per model, from the hosts attributed to it ---------------------------------------
        Record(MODEL_GPUS, f"sum by (model) ({ATTRIBUTED_GPUS})"),
        Record(MODEL_OUTPUT, f"sum by (model) ({HOST_OUTPUT} and on (host, model) {ATTRIBUTED_GPUS})"),
        Record(MODEL_PROMPT, f"sum by (model) ({HOST_PROMPT} and on (host, model) {ATTRIBUTED_GPUS})"),
        Record(MODEL_ENERGY, _of("sum by (model)", _on_attributed(HOST_ENERGY))),
        Record(TOKENS_PER_GPU_SECOND, f"{MODEL_OUTPUT} / {MODEL_GPUS}"),
        Record(GPU_SECONDS_PER_1K, _per_output_tokens(MODEL_GPUS, 1000)),
        Record(JOULES_PER_1K, _per_output_tokens(MODEL_ENERGY, 1000)),
        # GPUs x dollars per GPU-second, per million output tokens
        *_price_records(prices),
        Record(DOLLARS_PER_1M, _per_output_tokens(_dollars_per_second(prices), 1_000_000)),
        Record(MODEL_GPU_IDLE, _of("avg by (model)", _on_attributed(GPU_IDLE))),
        Record(GPU_HOUR_PRICE, f"vector({price!r})"),
        # -- per A/B variant: its served name's number, if no other variant shares that name --
        Record(VARIANT_TOKENS_PER_GPU_SECOND, _of("max by (model, variant)", _per_variant(TOKENS_PER_GPU_SECOND))),
        # -- per tenant: its share of a model's output tokens carries that share of its GPUs --
        Record(TENANT_DOLLARS, f"sum by (tenant, model) (rate({_TENANT_OUTPUT}[{WINDOW}]))\n"
                               f"* on (model) group_left () {DOLLARS_PER_1M} / 1e6"),
        # the last day's output tokens at the model's dollars per token now
        Record(TENANT_DOLLARS_DAY, f"sum by (tenant) (\n  increase({_TENANT_OUTPUT}[1d])\n"
                                   f"  * on (model) group_left () {DOLLARS_PER_1M} / 1e6\n)"),
        # -- per LoRA adapter: it runs on its base's GPUs, counted in the base's tokens (vLLM's
        # model_name is the base's), so its share of them is its share of the base's cost --
        Record(ADAPTER_DOLLARS, f"sum by (model, adapter) (rate({_ADAPTER_OUTPUT}[{WINDOW}]))\n"
                                f"* on (model) group_left () {DOLLARS_PER_1M} / 1e6"),
        # -- per Kubernetes pod and namespace ----------------------------------------------
        *_pod_records(prices),
    )


def _per_variant(per_served_model: str) -> str:
    """A per-model series (vLLM's served name) under the gateway's public model and variant
    (``inferwatch_gateway_variant_served_model_info``, one per gateway replica). A served name
    two variants share is one engine for both: neither gets a number of its own."""
    variants = f"max by (model, variant, served_model) ({_VARIANT_SERVED})"
    return (f'label_replace({per_served_model}, "served_model", "$1", "model", "(.+)")\n'
            f"* on (served_model) group_right () (\n  {variants}\n"
            f"  unless on (served_model) count by (served_model) ({variants}) > 1\n)")


def rule_file(prices: Cost = Cost()) -> dict[str, Any]:
    """``cost.yml``: one group, evaluated at the global interval (a few series per host)."""
    return {"groups": [{"name": "inferwatch-cost",
                        "rules": [r.rule() for r in records(prices)]}]}
