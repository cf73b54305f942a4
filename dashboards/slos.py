"""SLOs and alerts: objective, SLI, error budget, burn rates per window, what fires now."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash_b

from inferwatch.alerts.generate import (
    BUDGET_REMAINING,
    ERROR_BUDGET,
    OBJECTIVE,
    PERIOD_INTERVAL,
    error_ratio,
    fresh,
    interval_of,
)
from inferwatch.alerts.spec import Spec
from inferwatch.common.durations import seconds
from inferwatch.dashboards import uids
from inferwatch.dashboards.panels import dashboard, or_zero, q, query_variable, stat_panel, timeseries_panel
from inferwatch.serving.metrics import UNKNOWN_MODEL

SEL = 'model=~"$model", slo=~"$slo"'
BURN_UNIT = "suffix:×"  # a multiple of the budget rate: Grafana has no unit for it, a suffix says it


def _ratio(window: str) -> str:
    return fresh(f"{error_ratio(window)}{{{SEL}}}", interval_of(window))


def build(spec: Spec) -> dash_b.Dashboard:
    # The meta-alerts fire by design; counting them would hide whether anything is wrong.
    always_firing = [a.name for a in spec.alerts if a.severity == "none"]
    firing = f'ALERTS{{alertstate="firing", alertname!~"{"|".join(always_firing)}"}}'
    # One period when every SLO has the same (the titles say it), else each SLO's own.
    periods = {s.period for s in spec.slos}
    period = periods.pop() if len(periods) == 1 else "each SLO's period"
    # (long window, burn rate) at which the page tier fires: the panels turn red at the lowest
    # (paging begins) and the highest (every window pages); of the first SLO's period
    page_factors = [(w.long, w.factor(spec.slos[0].period)) for w in spec.page_tier.windows]
    windows = sorted({w for tier in spec.tiers for bw in tier.windows for w in (bw.long, bw.short)}, key=seconds)
    lowest, highest = min(f for _, f in page_factors), max(f for _, f in page_factors)
    burn = [q(f'{_ratio(w)} / on (slo) group_left {ERROR_BUDGET}{{slo=~"$slo"}}', f"{w} {{{{model}}}}")
            for w in windows]
    slo_panels = [
        stat_panel("Objective", "percentunit", q(f'{OBJECTIVE}{{slo=~"$slo"}}', "{{slo}}"),
                   width=6, height=6),
        stat_panel(f"Error budget remaining ({period})", "percentunit",
                   q(fresh(f"{BUDGET_REMAINING}{{{SEL}}}", PERIOD_INTERVAL), "{{model}} {{slo}}"),
                   thresholds=[(None, "red"), (0.25, "orange"), (0.5, "green")], width=10, height=6,
                   description="Share of the period's budget left; recomputed hourly."),
        stat_panel("Current burn rate", BURN_UNIT,
                   q(f'inferwatch_slo:current_burn_rate:ratio{{{SEL}}}', "{{model}} {{slo}}"),
                   thresholds=[(None, "green"), (1, "orange"), (highest, "red")], width=8, height=6),
        timeseries_panel(f"Error budget remaining over time ({period})", "percentunit",
                         q(fresh(f"{BUDGET_REMAINING}{{{SEL}}}", PERIOD_INTERVAL), "{{model}} {{slo}}"),
                         thresholds=[(None, "red"), (0.25, "orange"), (0.5, "green")], width=24,
                         description="How the period's budget was spent: a cliff is an incident, a slope a "
                                     "chronic burn."),
        # one panel per SLO: windows x models of every SLO on one axis would be dozens of lines
        timeseries_panel("SLI: share of bad events ($slo)", "percentunit",
                         *[q(_ratio(w), f"{w} {{{{model}}}}") for w in ("5m", "1h", "6h", "1d")],
                         width=12).repeat("slo").repeat_direction("v"),
        timeseries_panel("Burn rate per window ($slo)", BURN_UNIT, *burn, width=12,
                         thresholds=[(None, "green"), (1, "orange"), (lowest, "red")],
                         description="Error ratio divided by the budget: 1x spends the budget exactly over the "
                                     "period; pages at "
                                     + " and ".join(f"{f:g}x ({w})" for w, f in page_factors) + ".")
        .repeat("slo").repeat_direction("v"),
    ]
    alert_panels = [
        timeseries_panel("Alerts firing by severity", "short",
                         q(or_zero(f"sum by (severity) ({firing})", "severity"), "{{severity}}"), width=12),
        timeseries_panel("Alerts firing", "short",
                         q(or_zero(f"sum by (alertname, severity) ({firing})", "alertname"),
                           "{{alertname}} ({{severity}})"), width=12,
                         description=f"{' and '.join(always_firing)}, which always fire by design, are left out."),
    ]
    return dashboard(
        uids.SLOS, "inferwatch / SLOs and alerts", "Per-model SLOs with multi-window burn rates; alerts firing.",
        [query_variable("model", "Model", f'label_values({error_ratio("5m")}{{model!="{UNKNOWN_MODEL}"}}, model)',
                        all_value=None),
         query_variable("slo", "SLO", f"label_values({OBJECTIVE}, slo)")],
        [("SLOs", slo_panels), ("Alerts", alert_panels)])
