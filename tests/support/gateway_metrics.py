"""The gateway's metrics as a busy gateway has them, for the exposition tests and the
/metrics render benchmark (bench/gateway_overhead.py) to measure the same registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferwatch.serving.admission import Policy
from inferwatch.serving.budgets import BudgetCollector, Budgets
from inferwatch.serving.metrics import create_metrics
from inferwatch.serving.tenant_metrics import TenantSeries
from inferwatch.serving.tenants import Budget, Tenant


def populated_registry(models: int, variants: int, tenants: int = 0) -> CollectorRegistry:
    """Every route and status class seen per model and variant, with exemplars; with
    ``tenants``, each of them (and other and anonymous) sending to every model, with a budget."""
    registry = CollectorRegistry()
    m = create_metrics(registry)
    names = [f"tenant-{i:02d}" for i in range(tenants)]
    if tenants:
        policy = Policy(tenants={name: Tenant(budget=Budget(tokens=1e9)) for name in names})
        budgets = Budgets()
        registry.register(BudgetCollector(budgets, lambda: policy))
        for name in names:
            budgets.charge(name, policy.tenants[name].budget, 1000)
    for tenant in [*names, "other", "anonymous"] if tenants else ():
        for model in (f"model-{i}" for i in range(models)):
            series = TenantSeries(m.tenants, tenant, model)
            series.answered("2xx").inc(100)
            for token in (series.input_tokens, series.output_tokens, series.cached_tokens, series.good,
                          series.good_tokens):
                token.inc(1000)
            for i in range(50):
                series.ttft.observe(0.01 * i)
                series.duration.observe(0.1 * i)
    for model in (f"model-{i}" for i in range(models)):
        for variant in (f"v{i}" for i in range(variants)):
            for route in ("/v1/chat/completions", "/v1/completions"):
                tok = (model, variant, route)
                for sc in ("2xx", "4xx", "5xx"):
                    m.requests.labels(*tok, sc).inc(100)
                    for i in range(50):
                        m.request_duration.labels(*tok, sc).observe(0.01 * i, {"trace_id": f"{i:032x}"})
                for i in range(200):
                    m.signals["ttft"].labels(*tok).observe(0.005 * i, {"trace_id": f"{i:032x}"})
                    m.signals["itl"].labels(*tok).observe(0.001 * i)
                    m.signals["tpot"].labels(*tok).observe(0.001 * i)
                    m.signals["prompt_tokens"].labels(*tok).observe(i * 10)
                    m.signals["completion_tokens"].labels(*tok).observe(i * 3)
                m.input_tokens.labels(*tok).inc(1e6)
                m.output_tokens.labels(*tok).inc(1e6)
            m.in_flight.labels(model, variant).set(3)
            for reason in ("connect", "timeout", "stream_interrupted"):
                m.upstream_errors.labels(model, variant, reason).inc()
    return registry
