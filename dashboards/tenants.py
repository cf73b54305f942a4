"""Tenants: who sends the load, whether it is served within its objectives, what it costs and
how much of its budget is left, whose prompts reuse vLLM's prefix cache, and which LoRA
adapters of a model carry its traffic."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash_b

from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.cost import ADAPTER_DOLLARS, TENANT_DOLLARS, TENANT_DOLLARS_DAY
from inferwatch.alerts.spec import JOB_GATEWAY, TENANT_GOODPUT, Spec
from inferwatch.dashboards import uids
from inferwatch.dashboards.health import alerts_firing, targets_up
from inferwatch.dashboards.panels import RATE, dashboard, q, query_variable, stat_panel, timeseries_panel

SEL = 'tenant=~"$tenant", model=~"$model"'
TOP = 10  # tenants drawn per panel: the rest are a long tail no one reads on a graph

_REQUESTS = m("inferwatch_gateway_tenant_requests_total")
_INPUT = m("inferwatch_gateway_tenant_input_tokens_total")
_OUTPUT = m("inferwatch_gateway_tenant_output_tokens_total")
_CACHED = m("inferwatch_gateway_tenant_cached_input_tokens_total")
_GOOD_TOKENS = m("inferwatch_gateway_goodput_output_tokens_total")
_TTFT = m("inferwatch_gateway_tenant_time_to_first_token_seconds_bucket")
_LIMIT = m("inferwatch_gateway_tenant_budget_limit")
_USED = m("inferwatch_gateway_tenant_budget_used")
_REFUSED = m("inferwatch_gateway_admission_rejected_total")
_ADAPTER_REQUESTS = m("inferwatch_gateway_adapter_requests_total")
_ADAPTER_OUTPUT = m("inferwatch_gateway_adapter_output_tokens_total")
_ADAPTER_GOOD = m("inferwatch_gateway_adapter_goodput_requests_total")
_MODEL_OUTPUT = m("inferwatch_gateway_output_tokens_total")
ADAPTERS = 'model=~"$model"'


def _rate(metric: str, by: str = "tenant", selector: str = SEL) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}]))"


def _top(expr: str) -> str:
    return f"topk({TOP}, {expr})"


def _health(spec: Spec) -> list[object]:
    return [
        targets_up((JOB_GATEWAY,)),
        alerts_firing(uids.TENANTS, spec.alerts),
        stat_panel("Tenants sending", "short", q(f"count(sum by (tenant) (rate({_REQUESTS}[{RATE}])) > 0)", "tenants"),
                   width=6, description="Tenants with requests in the window: the declared ones, other (keys no "
                                        "tenant declares) and anonymous (no valid key)."),
        stat_panel("Goodput, all tenants", "percentunit",
                   q(f"sum(rate({m('inferwatch_gateway_goodput_requests_total')}{{{SEL}}}[{RATE}])) / "
                     f"(sum(rate({_REQUESTS}{{{SEL}}}[{RATE}])) > 0)", "goodput"),
                   thresholds=[(None, "red"), (0.95, "orange"), (0.99, "green")], width=6,
                   description="Share of requests answered 2xx within every latency objective of their model."),
    ]


def _load() -> list[object]:
    return [
        timeseries_panel(f"Top {TOP} tenants by requests", "reqps", q(_top(_rate(_REQUESTS)), "{{tenant}}"),
                         width=12),
        timeseries_panel(f"Top {TOP} tenants by tokens", "short",
                         q(_top(f"{_rate(_INPUT)} + {_rate(_OUTPUT)}"), "{{tenant}}"), width=12,
                         description="Prompt and completion tokens per second, from vLLM's usage."),
        timeseries_panel("Errors by tenant", "reqps",
                         q(_top(_rate(_REQUESTS, "tenant, status_class", f'{SEL}, status_class!="2xx"')),
                           "{{tenant}} {{status_class}}"),
                         width=12, description="4xx include 429s of limits and budgets; 5xx are the fleet's."),
        timeseries_panel("Time to first token p95 by tenant", "s",
                         q(_top(f"histogram_quantile(0.95, sum by (tenant, le) (rate({_TTFT}{{{SEL}}}[{RATE}])))"),
                           "{{tenant}}"), width=12),
    ]


def _goodput(spec: Spec) -> list[object]:
    ttft = spec.slo_of("ttft")
    objective = f" (e.g. {ttft.title})" if ttft else ""
    return [
        timeseries_panel("Goodput per tenant and model", "percentunit",
                         q(f"{TENANT_GOODPUT}{{{SEL}}}", "{{tenant}} {{model}}"), width=12,
                         thresholds=[(None, "red"), (0.95, "orange"), (0.99, "green")],
                         description="Requests within every objective of their model together" + objective
                                     + ", over all requests: the joint condition no per-SLI histogram keeps."),
        timeseries_panel("Tokens served within objective", "percentunit",
                         q(f"clamp_max({_rate(_GOOD_TOKENS, 'tenant, model')} / "
                           f"({_rate(_OUTPUT, 'tenant, model')} > 0), 1)", "{{tenant}} {{model}}"), width=12,
                         description="Output tokens of good requests over all output tokens (two counters scraped "
                                     "a moment apart can put the ratio of their rates past 1 for a step)."),
    ]


def _cost() -> list[object]:
    return [
        timeseries_panel(f"Top {TOP} tenants by cost", "currencyUSD",
                         q(_top(f"sum by (tenant) ({TENANT_DOLLARS}{{{SEL}}}) * 3600"), "{{tenant}}"), width=12,
                         description="Dollars per hour: each tenant's share of a model's output tokens carries that "
                                     "share of its GPUs' cost (docs/cost.md). Absent where GPUs are not attributable "
                                     "(vLLM's CPU build has none)."),
        stat_panel("Dollars in the last day", "currencyUSD",
                   q(_top(f'{TENANT_DOLLARS_DAY}{{tenant=~"$tenant"}}'), "{{tenant}}"), width=12, height=8),
    ]


def _budgets() -> list[object]:
    spent = f'max by (tenant, unit, period) ({_USED}{{tenant=~"$tenant"}}) / ' \
            f'max by (tenant, unit, period) ({_LIMIT}{{tenant=~"$tenant"}})'
    return [
        stat_panel("Budget spent", "percentunit", q(spent, "{{tenant}} ({{unit}}/{{period}})"),
                   thresholds=[(None, "green"), (0.8, "orange"), (1, "red")], width=12, height=8,
                   description="Share of each tenant's budget spent this period (UTC day or month): a ticket at "
                               "80 %, a page at 100 % for tenants marked critical; at 100 % requests get 429."),
        stat_panel("Budget left", "short",
                   q(f'max by (tenant, unit) ({_LIMIT}{{tenant=~"$tenant"}}) - '
                     f'max by (tenant, unit) ({_USED}{{tenant=~"$tenant"}})', "{{tenant}} ({{unit}})"),
                   width=6, height=8),
        timeseries_panel("Requests refused for budget", "reqps",
                         q(f'sum by (model) (rate({_REFUSED}{{scope="tenant", limit="budget"}}[{RATE}]))',
                           "{{model}}"), width=6),
    ]


def _cache() -> list[object]:
    return [
        timeseries_panel("Prompt tokens from the prefix cache", "percentunit",
                         q(f"{_rate(_CACHED, 'tenant, model')} / ({_rate(_INPUT, 'tenant, model')} > 0)",
                           "{{tenant}} {{model}}"), width=24,
                         description="Cached prompt tokens (vLLM's usage.prompt_tokens_details.cached_tokens, with "
                                     "--enable-prompt-tokens-details) over prompt tokens: whose prompts reuse the "
                                     "cache. Absent while vLLM does not report it."),
    ]


def _adapters() -> list[object]:
    by = "model, adapter"
    legend = "{{adapter}} ({{model}})"
    return [
        timeseries_panel("Requests by LoRA adapter", "reqps", q(_rate(_ADAPTER_REQUESTS, by, ADAPTERS), legend),
                         width=6, description="Requests to adapters vLLM serves under names of their own; every "
                                              "other panel counts them under their base model, as vLLM does."),
        timeseries_panel("Adapter's share of its model's tokens", "percentunit",
                         q(f"{_rate(_ADAPTER_OUTPUT, by, ADAPTERS)} / on (model) group_left () "
                           f"({_rate(_MODEL_OUTPUT, 'model', ADAPTERS)} > 0)", legend), width=6,
                         description="Output tokens of the adapter over all its base model's, through the gateway."),
        timeseries_panel("Goodput by adapter", "percentunit",
                         q(f"{_rate(_ADAPTER_GOOD, by, ADAPTERS)} / ({_rate(_ADAPTER_REQUESTS, by, ADAPTERS)} > 0)",
                           legend), width=6, thresholds=[(None, "red"), (0.95, "orange"), (0.99, "green")],
                         description="Within every objective of the base model, over all the adapter's requests."),
        timeseries_panel("Cost by adapter", "currencyUSD", q(f"{ADAPTER_DOLLARS}{{{ADAPTERS}}} * 3600", legend),
                         width=6, description="Dollars per hour: the adapter's share of its base model's output "
                                              "tokens at the base's price. Absent where GPUs are not attributable."),
    ]


def build(spec: Spec) -> dash_b.Dashboard:
    return dashboard(
        uids.TENANTS, "inferwatch / Tenants",
        "Per tenant: load, goodput, cost, budgets and prefix-cache reuse; per LoRA adapter: load, goodput, cost.",
        [query_variable("tenant", "Tenant", f"label_values({_REQUESTS}, tenant)", all_value=None),
         query_variable("model", "Model", f"label_values({_REQUESTS}, model)", all_value=None)],
        [("Health", _health(spec)), ("Load", _load()), ("Goodput", _goodput(spec)), ("Cost", _cost()),
         ("Budgets", _budgets()), ("Prefix cache", _cache()), ("LoRA adapters", _adapters())])
