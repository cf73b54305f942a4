"""LLM serving overview: are users hurting (RED, tokens, TTFT), is the engine saturated,
what the model answers (output quality, sampling parameters) and what its tokens cost.

Threshold lines are the alert spec's numbers (``inferwatch.alerts.spec``), never retyped;
cost panels read the cost rules' records (``inferwatch.alerts.cost``), never the counters."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash_b

from inferwatch.alerts import cost
from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.spec import JOB_GATEWAY, JOB_VLLM, Spec
from inferwatch.dashboards import uids
from inferwatch.dashboards.health import RED_BELOW_ONE, RED_FROM_ONE, alerts_firing, targets_up
from inferwatch.dashboards.panels import (
    RATE,
    dashboard,
    heatmap_panel,
    or_zero,
    q,
    quantiles,
    query_variable,
    server_error_ratio,
    stat_panel,
    timeseries_panel,
)
from inferwatch.drift.sampling_params import VALUES
from inferwatch.serving.metrics import ABNORMAL_KINDS, UNKNOWN_MODEL

SEL = 'model=~"$model", variant=~"$variant", instance=~"$gateway"'
REQ = m("inferwatch_gateway_requests_total")
VLLM_SEL = 'model=~"$model", instance=~"$vllm"'
# Latency per model, so "All" shows a slow model beside a fast one instead of their blend;
# the median and the tail (two series a model keeps a panel readable).
PER_MODEL: dict[str, Any] = {"by": "model", "qs": (0.5, 0.95)}  # quantiles() per model, p50 and p95


def _rate(name: str, by: str, selector: str = SEL) -> str:
    return f"sum by ({by}) (rate({m(name)}{{{selector}}}[{RATE}]))"


def health(spec: Spec) -> list[Any]:
    return [
        targets_up((JOB_GATEWAY, JOB_VLLM)),
        stat_panel("Gateways reaching vLLM", "percentunit",
                   q(f'avg by (upstream) ({m("inferwatch_gateway_upstream_up")}{{instance=~"$gateway"}})',
                     "{{upstream}}"),
                   thresholds=RED_BELOW_ONE, width=6,
                   description="Share of gateways whose probe of each upstream passes (GatewayUpstreamDown "
                               "pages when one fails while Prometheus reaches vLLM)."),
        stat_panel("Restarts (15m)", "short",
                   q(or_zero(f'sum by (child) (changes({m("inferwatch_supervisor_restarts_total")}[15m]))', "child"),
                     "{{child}}"),
                   thresholds=RED_FROM_ONE, width=6,
                   description="Children `inferwatch up` restarted; InferwatchCrashLooping pages at 3."),
        alerts_firing(uids.SERVING, spec.alerts),
    ]


def users(spec: Spec) -> list[Any]:
    availability = spec.slo_of("availability")
    ttft_s = next((d.threshold_s for d in spec.settings.slos if d.sli == "ttft"), None)
    # red where the first paging window pages on availability: the error ratio that spends its
    # share of the budget within that window
    error_lines = ([(availability.budget, "orange"), (availability.burn_threshold(spec.page_tier.windows[0]), "red")]
                   if availability else [])
    return [
        timeseries_panel("Request rate", "reqps", q(_rate(REQ, "model, status_class"), "{{model}} {{status_class}}"),
                         description="Requests answered per second, by status class."),
        timeseries_panel("Error ratio (5xx)", "percentunit", q(server_error_ratio(REQ, SEL, "model"), "{{model}}"),
                         thresholds=[(None, "green"), *error_lines],
                         description=("Share of requests answered with a server error; the availability SLO allows "
                                      f"{availability.budget:.1%}." if availability else
                                      "Share of requests answered with a server error; no availability SLO is set.")),
        stat_panel("Requests in flight", "short",
                   q(f'sum({m("inferwatch_gateway_requests_in_flight")}{{{SEL}}})', "in flight"), width=4, height=8),
        stat_panel("Tokens/s out", "short",
                   q(f'sum(rate({m("inferwatch_gateway_output_tokens_total")}{{{SEL}}}[{RATE}]))', "tokens/s"),
                   width=4, height=8),
        timeseries_panel("Request latency", "s",
                         *quantiles(m("inferwatch_gateway_request_duration_seconds_bucket"), SEL, **PER_MODEL),
                         description="Request received to last byte sent. Exemplars link to the trace."),
        heatmap_panel("Request latency heatmap",
                      f'sum by (le) (rate({m("inferwatch_gateway_request_duration_seconds_bucket")}{{{SEL}}}[{RATE}]))',
                      "s", description="Requests per second in each latency bucket."),
        timeseries_panel("Time to first token", "s",
                         *quantiles(m("inferwatch_gateway_time_to_first_token_seconds_bucket"), SEL, **PER_MODEL),
                         thresholds=[(None, "green"), *([(ttft_s, "red")] if ttft_s else [])],
                         description="What a streaming user waits for" + (f"; the TTFT SLO is {ttft_s:g} s." if ttft_s else ".")),
        timeseries_panel("Inter-token latency", "s",
                         *quantiles(m("inferwatch_gateway_inter_token_latency_seconds_bucket"), SEL, exemplar=False,
                                    **PER_MODEL)),
        timeseries_panel("Time per output token", "s",
                         *quantiles(m("inferwatch_gateway_time_per_output_token_seconds_bucket"), SEL, exemplar=False,
                                    **PER_MODEL)),
        timeseries_panel("Tokens/s in and out", "short",
                         q(_rate("inferwatch_gateway_input_tokens_total", "model"), "in {{model}}"),
                         q(_rate("inferwatch_gateway_output_tokens_total", "model"), "out {{model}}")),
        timeseries_panel("Upstream errors by reason", "reqps",
                         q(or_zero(_rate("inferwatch_gateway_upstream_errors_total", "reason"), "reason"), "{{reason}}"),
                         description="Calls to vLLM that failed: connect, timeout, http_4xx/5xx, stream cut, bad body."),
        timeseries_panel("Rejected requests by code", "reqps",
                         q(or_zero(_rate("inferwatch_gateway_rejected_requests_total", "code", 'instance=~"$gateway"'),
                                   "code"), "{{code}}"),
                         description="Refused by the gateway before reaching vLLM (invalid, too large, unauthorised)."),
    ]


def engine(spec: Spec) -> list[Any]:
    return [
        timeseries_panel("Running and waiting requests", "short",
                         q(f'sum by (model) ({m("vllm:num_requests_running")}{{{VLLM_SEL}}})', "running {{model}}"),
                         q(f'sum by (model) ({m("vllm:num_requests_waiting")}{{{VLLM_SEL}}})', "waiting {{model}}")),
        timeseries_panel("KV-cache usage", "percentunit",
                         q(f'max by (model, instance) ({m("vllm:kv_cache_usage_perc")}{{{VLLM_SEL}}})',
                           "{{model}} {{instance}}"),
                         thresholds=[(None, "green"), (spec.thresholds.kv_cache_high, "red")]),
        timeseries_panel("Preemptions", "ops", q(_rate("vllm:num_preemptions_total", "model", VLLM_SEL), "{{model}}")),
        timeseries_panel("Prefix-cache hit rate", "percentunit",
                         q(f'{_rate("vllm:prefix_cache_hits_total", "model", VLLM_SEL)} / '
                           f'{_rate("vllm:prefix_cache_queries_total", "model", VLLM_SEL)}', "{{model}}")),
        timeseries_panel("vLLM queue time (mean)", "s",
                         q(f'{_rate("vllm:request_queue_time_seconds_sum", "model", VLLM_SEL)} / '
                           f'{_rate("vllm:request_queue_time_seconds_count", "model", VLLM_SEL)}', "{{model}}"),
                         description="Mean time waiting for the scheduler. A mean, not quantiles: vLLM's first "
                                     "bucket ends at 0.3 s, so quantiles below it would be interpolation."),
        timeseries_panel("vLLM time to first token", "s",
                         *quantiles(m("vllm:time_to_first_token_seconds_bucket"), VLLM_SEL, exemplar=False),
                         description="The engine's own view; the gateway's TTFT adds the network and the relay."),
    ]


def model_layer() -> list[Any]:
    """What the model is asked and answers, and where its time goes (vLLM's own dashboard
    shows the same): lengths, why generation stopped, prefill against decode."""
    return [
        timeseries_panel("Prompt length", "short",
                         *quantiles(m("inferwatch_gateway_request_prompt_tokens_bucket"), SEL, exemplar=False,
                                    **PER_MODEL), description="Prompt tokens per request, as vLLM counted them."),
        timeseries_panel("Generation length", "short",
                         *quantiles(m("inferwatch_gateway_request_completion_tokens_bucket"), SEL, exemplar=False,
                                    **PER_MODEL), description="Completion tokens per request."),
        timeseries_panel("Finish reasons", "reqps",
                         q(_rate("vllm:request_success_total", "model, finished_reason", VLLM_SEL),
                           "{{model}} {{finished_reason}}"),
                         description="stop (the model ended), length (max_tokens cut it), abort (the client left)."),
        timeseries_panel("Prefill and decode time (p95)", "s",
                         *[q(f"histogram_quantile(0.95, sum by (le, model) "
                             f"(rate({m(f'vllm:request_{phase}_time_seconds_bucket')}{{{VLLM_SEL}}}[{RATE}])))",
                             f"{phase} {{{{model}}}}") for phase in ("prefill", "decode")],
                         description="Per request: reading the prompt, then generating; a long prefill is long "
                                     "prompts, a long decode long answers or a crowded batch."),
    ]


SAMPLING = m("inferwatch_gateway_sampling_requests_total")


def _sampling(param: str, *values: str) -> str:
    """Requests per second by bin of one sampling parameter, of ``values`` only when given:
    bins the gateway writes (drift/sampling_params.py), or the generator fails."""
    unknown = set(values) - set(VALUES[param])
    if unknown:
        raise KeyError(f"{param} has no bins {sorted(unknown)}; it has {VALUES[param]}")
    matchers = f'{SEL}, param="{param}"' + (f', value=~"{"|".join(values)}"' if values else "")
    return f"rate({SAMPLING}{{{matchers}}}[{RATE}])"


def _by_bin(param: str) -> str:
    """Each bin's share of the requests."""
    return f"sum by (value) ({_sampling(param)})\n/ on () group_left () sum ({_sampling(param)})"


def _flagged(param: str, *values: str) -> str:
    """The share of requests in ``values``; 0, not "No data", while none are."""
    total = f"sum ({_sampling(param)})"
    return f"(sum ({_sampling(param, *values)}) or 0 * {total})\n/ {total}"


def output_quality() -> list[Any]:
    """What the model answers, read by the gateway (never the text itself): repetition,
    answers that are empty, one token or a loop, and the sampling parameters clients ask
    for. A drift in any of them is the drift service's verdict; these show its size."""
    abnormal = m("inferwatch_gateway_abnormal_outputs_total")
    answers = f'sum by (model) (rate({REQ}{{{SEL}, status_class="2xx"}}[{RATE}]))'
    flags = (("stream", ("true",), "streamed"), ("tools", ("true",), "with tools"),
             ("response_format", ("json_object", "json_schema"), "JSON output"), ("n", ("2-4", ">4"), "n > 1"))
    return [
        timeseries_panel("Repetition in answers", "percentunit",
                         *quantiles(m("inferwatch_gateway_output_repetition_ratio_bucket"), SEL, exemplar=False,
                                    **PER_MODEL), width=12,
                         description="Per answer, the share of its 4-grams (tokens when streamed, words when not) "
                                     "that repeat an earlier one; answers of 8 or more. Fluent text sits under 5%, "
                                     "a looping answer above 50%."),
        timeseries_panel("Answers empty, one token or looping", "percentunit",
                         q(or_zero(f"sum by (model, kind) (rate({abnormal}{{{SEL}}}[{RATE}]))\n"
                                   f"/ on (model) group_left () {answers}", "kind"), "{{model}} {{kind}}"),
                         width=12,
                         description="Share of answered requests (2xx) by what is wrong with the answer: "
                                     f"{', '.join(ABNORMAL_KINDS)} (no text; stopped after one token; ending in one "
                                     "span repeated). Answers of n > 1 choices are not judged."),
        *(timeseries_panel(f"Sampling: {param}", "percentunit",
                           q(_by_bin(param), "{{value}}"),
                           width=6, stacked=True,
                           description=f"Share of requests by the {param} they ask for, binned (default: left "
                                       "out, vLLM takes the model's own; invalid: vLLM refuses it).")
          for param in ("temperature", "top_p", "max_tokens")),
        timeseries_panel("Sampling: stream, tools, JSON, n", "percentunit",
                         *(q(_flagged(param, *values), legend) for param, values, legend in flags),
                         width=6, description="Share of requests streamed, offering tools, asking for JSON "
                                              "(json_object or json_schema), asking for several choices."),
    ]


def cost_row() -> list[Any]:
    """What a model's tokens cost, from the cost rules: vLLM's token counters over the GPUs of
    the hosts that serve that model alone (docs/cost.md). A model whose hosts also serve
    another has no line here; its GPUs are counted as not attributable."""
    sel = '{model=~"$model"}'

    def per_model(title: str, unit: str, record: str, description: str, width: int = 6) -> object:
        return timeseries_panel(title, unit, q(f"{record}{sel}", "{{model}}"), width=width, description=description)

    return [
        per_model("Output tokens/s per GPU", "short", cost.TOKENS_PER_GPU_SECOND,
                  "Output tokens per second over the model's GPUs (every GPU of the hosts it serves alone), over "
                  f"{cost.WINDOW}: the A/B cost guardrail's reading."),
        per_model("GPU-seconds per 1k output tokens", "s", cost.GPU_SECONDS_PER_1K,
                  "GPU time the model's hosts spent per 1,000 output tokens, prompts included; none while it "
                  "generates nothing."),
        per_model("Joules per 1k output tokens", "joule", cost.JOULES_PER_1K,
                  "Energy the model's GPUs drew (NVML's energy counter) per 1,000 output tokens: GPUs only, not "
                  "the host, its CPUs or cooling."),
        per_model("$ per 1M output tokens", "currencyUSD", cost.DOLLARS_PER_1M,
                  "GPU-hours per million output tokens times the price per GPU-hour the rules were generated with "
                  "(INFERWATCH_GPU_HOUR_PRICE, the stat beside). GPUs only: no host, network or people."),
        per_model("Idle share of the model's GPUs", "percentunit", cost.MODEL_GPU_IDLE,
                  "Mean over the model's GPUs of the share of time no kernel ran (1 - NVML utilization over "
                  f"{cost.WINDOW}): GPUs paid for that wait. Per GPU: the GPU dashboard.", width=12),
        stat_panel("GPUs per model", "short", q(f"{cost.MODEL_GPUS}{sel}", "{{model}}"), height=8,
                   description="GPUs attributed to each model: every GPU of the hosts that serve it alone."),
        stat_panel("GPUs not attributable", "short", q(f"sum({cost.SHARED_GPUS}) or vector(0)", "shared"),
                   height=8, thresholds=[(None, "green"), (1, "orange")],
                   description="GPUs of hosts that served several models in the window: nothing says which "
                               "model used which, so they count for none (docs/cost.md)."),
        stat_panel("Price per GPU-hour", "currencyUSD", q(cost.GPU_HOUR_PRICE, "price"), height=8,
                   description="The price the rules were generated with (INFERWATCH_GPU_HOUR_PRICE)."),
    ]


def replicas() -> list[Any]:
    """Gateway replicas sharing state, and the vLLM replicas they balance over (docs/replicas.md)."""
    gw = 'instance=~"$gateway"'
    return [
        timeseries_panel("Shared state (Redis) up", "short",
                         q(f'min by (instance) ({m("inferwatch_gateway_shared_state_up")}{{{gw}}})', "{{instance}}"),
                         description="1 while a replica's Redis answers; at 0 it routes by its last weights and "
                                     "enforces limits at its share. Empty for gateways without Redis."),
        timeseries_panel("Experiment weights by replica", "percentunit",
                         q(f'max by (instance, model, variant) ({m("inferwatch_gateway_experiment_weight_ratio")}'
                           f'{{{gw}}})', "{{instance}} {{model}} {{variant}}"),
                         description="The weights each replica routes by; replicas sharing Redis agree within a "
                                     "second (GatewayReplicasDisagreeOnWeights fires after 2 minutes apart)."),
        timeseries_panel("Feature records waiting, per drift service", "short",
                         q(f'sum by (destination) ({m("inferwatch_gateway_feature_queue_depth")}{{{gw}}})',
                           "{{destination}}"),
                         description="Records held for each drift service (a pair gets everything): a backlog "
                                     "that grows is a drift service down or slow; it gets them when back."),
        timeseries_panel("Requests in flight per vLLM replica", "short",
                         q(f'sum by (endpoint) ({m("inferwatch_gateway_upstream_endpoint_requests_in_flight")}'
                           f'{{{gw}}})', "{{endpoint}}"),
                         description="What least-outstanding balancing compares, summed over the gateways: a "
                                     "replica that holds more than the others is slower (or batches less)."),
        timeseries_panel("vLLM replicas out of rotation", "short",
                         q(f'sum by (upstream) (1 - min by (upstream, endpoint) '
                           f'({m("inferwatch_gateway_upstream_endpoint_up")}{{{gw}}}))', "{{upstream}}"),
                         description="Replicas some gateway keeps out (refused connects, 5xx in a row, a failing "
                                     "/health), probed back in within 10 s of answering; "
                                     "GatewayUpstreamReplicaOut fires after 10 minutes."),
    ]


def build(spec: Spec) -> dash_b.Dashboard:
    return dashboard(
        uids.SERVING, "inferwatch / LLM serving",
        "RED and token-level metrics at the gateway; vLLM's engine; output quality; cost per token.",
        [query_variable("model", "Model", f'label_values({REQ}{{model!="{UNKNOWN_MODEL}"}}, model)', all_value=None),
         query_variable("variant", "Variant", f'label_values({REQ}{{model=~"$model"}}, variant)'),
         query_variable("gateway", "Gateway", f'label_values(up{{job="{JOB_GATEWAY}"}}, instance)'),
         query_variable("vllm", "vLLM", f'label_values(up{{job="{JOB_VLLM}"}}, instance)')],
        [("Health", health(spec)), ("Users (gateway)", users(spec)), ("Engine (vLLM)", engine(spec)),
         ("Model layer (vLLM)", model_layer()), ("Output quality (gateway)", output_quality()),
         ("Cost (vLLM's tokens on its hosts' GPUs)", cost_row()), ("Replicas (gateway)", replicas())])
