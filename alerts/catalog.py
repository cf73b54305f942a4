"""Every series the stack exposes, gathered from each component's own declarations.

Alert rules and dashboards name metrics through :func:`metric`, which fails at generation
time on a name that no component declares; a test also parses every generated query and
checks its names here, and checks the vLLM part against a real vLLM server.
"""

from __future__ import annotations

from functools import cache

from prometheus_client import CollectorRegistry

# Series Prometheus itself makes: one per target, the alert state of its rules, and (from
# its self-scrape) how many targets each scrape job's discovery found and relabelling kept, how many Alertmanagers
# it found and how full its queue of alerts to them is.
PROMETHEUS_SERIES = ("up", "ALERTS", "ALERTS_FOR_STATE", "prometheus_sd_discovered_targets",
                     "prometheus_target_scrape_pool_targets",
                     "prometheus_notifications_alertmanagers_discovered", "prometheus_notifications_queue_length",
                     "prometheus_notifications_queue_capacity")
# Counters of Prometheus and Alertmanager themselves (their self-scrapes), which the
# meta-monitoring alerts (alerts/meta.py) read.
PROMETHEUS_COUNTERS = ("prometheus_rule_evaluation_failures_total", "prometheus_rule_group_iterations_missed_total",
                       "prometheus_notifications_errors_total", "prometheus_notifications_sent_total")
ALERTMANAGER_COUNTERS = ("alertmanager_notifications_total", "alertmanager_notifications_failed_total")


def series_of(name: str, kind: str) -> tuple[str, ...]:
    """The names a family of ``kind`` is queried by (prometheus_client's naming)."""
    return {
        "counter": (f"{name}_total",),
        "histogram": (f"{name}_bucket", f"{name}_count", f"{name}_sum"),
        "info": (f"{name}_info",),
    }.get(kind, (name,))


def _registry_series(registry: CollectorRegistry) -> list[tuple[str, str]]:
    return [(s, family.type) for family in registry.collect() for s in series_of(family.name, family.type)]


@cache
def _exposed() -> dict[str, tuple[str, str]]:
    """Series name -> (component that exports it, family kind)."""
    from inferwatch.common.supervise import Supervisor
    from inferwatch.drift.metrics import DRIFT_METRICS
    from inferwatch.exporters.metrics import HOST_SPECS, SPECS
    from inferwatch.serving.admission import Policy
    from inferwatch.serving.budgets import BudgetCollector, Budgets
    from inferwatch.serving.metrics import create_metrics
    from inferwatch.serving.vllm_metrics import VLLM_METRICS

    out = {name: ("prometheus", "gauge") for name in PROMETHEUS_SERIES}
    out |= {name: ("prometheus", "counter") for name in PROMETHEUS_COUNTERS}
    out |= {name: ("alertmanager", "counter") for name in ALERTMANAGER_COUNTERS}
    gateway = CollectorRegistry()
    create_metrics(gateway)
    gateway.register(BudgetCollector(Budgets(), Policy))  # registered by a gateway with a limits file
    out |= {s: ("gateway", kind) for s, kind in _registry_series(gateway)}
    supervisor = CollectorRegistry()
    Supervisor(supervisor)
    out |= {s: ("supervisor", kind) for s, kind in _registry_series(supervisor)}
    out |= {s: ("exporter", spec.kind) for spec in (*SPECS, *HOST_SPECS) for s in series_of(spec.name, spec.kind)}
    out |= {s: ("drift", d.kind) for d in DRIFT_METRICS for s in series_of(d.name, d.kind)}
    out |= {s: ("vllm", kind) for name, kind in VLLM_METRICS.items() for s in series_of(name, kind)}
    return out


def exposed() -> dict[str, str]:
    """Series name -> the component that exports it."""
    return {name: component for name, (component, _) in _exposed().items()}


def kind_of(series: str) -> str:
    """'counter', 'gauge', 'histogram' or 'info' for an exported series (KeyError if unknown)."""
    return _exposed()[series][1]


def metric(name: str) -> str:
    """``name`` itself, once it is known to be exported by some part of the stack."""
    if name not in exposed():
        raise KeyError(f"no component exports {name!r}; declare it where it is exported first")
    return name
