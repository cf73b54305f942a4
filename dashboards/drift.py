"""Drift and A/B: has the traffic or the model changed, and how do two variants compare."""

from __future__ import annotations

from dashboards import uids
from dashboards.panels import (RATE, dashboard, or_zero, q, quantiles, query_variable, server_error_ratio, stat_panel,
                               timeseries_panel)
from alerts.spec import JOB_DRIFT
from inferwatch.catalog import metric as m

SEG = 'model=~"$model", variant=~"$variant", instance=~"$drift"'
RES = f'{SEG}, feature=~"$feature", method=~"$method"'


def drift() -> list:
    return [
        timeseries_panel("Drift score vs threshold", "short",
                         q(f'{m("inferwatch_drift_score")}{{{RES}}}', "{{variant}} {{feature}} {{method}}"),
                         q(f'{m("inferwatch_drift_threshold")}{{{RES}}}',
                           "threshold {{variant}} {{feature}} {{method}}"),
                         width=12, height=9,
                         description="Each method's score of the current window against the baseline, with the "
                                     "threshold its verdict used."),
        timeseries_panel("Drift detected", "short",
                         q(f'sum by (model, variant, feature) ({m("inferwatch_drift_detected")}{{{RES}}})',
                           "{{variant}} {{feature}}"),
                         width=12, height=9, description="Methods that flag each feature (0 = none)."),
        timeseries_panel("Window and baseline sizes", "short",
                         q(f'{m("inferwatch_drift_window_records")}{{{SEG}}}', "window {{model}}/{{variant}}"),
                         q(f'{m("inferwatch_drift_baseline_records")}{{{SEG}}}', "baseline {{model}}/{{variant}}")),
        timeseries_panel("Ingest", "short",
                         q(f'sum(rate({m("inferwatch_drift_ingested_records_total")}{{instance=~"$drift"}}[{RATE}]))',
                           "records/s accepted"),
                         q(or_zero(f'sum by (reason) (rate({m("inferwatch_drift_rejected_batches_total")}'
                                   f'{{instance=~"$drift"}}[{RATE}]))', "reason"), "batches/s rejected: {{reason}}")),
        timeseries_panel("Feature records at the gateway", "short",
                         q(f'sum by (outcome) (rate({m("inferwatch_gateway_feature_records_total")}[{RATE}]))',
                           "{{outcome}}"),
                         description="queued, sent, dropped_full, dropped_send_error."),
    ]


def ab() -> list:
    req = m("inferwatch_gateway_requests_total")
    by_variant = 'model=~"$model"'
    return [
        timeseries_panel("Requests by variant", "reqps",
                         q(f"sum by (model, variant) (rate({req}{{{by_variant}}}[{RATE}]))", "{{model}} {{variant}}")),
        timeseries_panel("Error ratio by variant", "percentunit",
                         q(server_error_ratio(req, by_variant, "model, variant"), "{{model}} {{variant}}")),
        timeseries_panel("TTFT p95 by variant", "s",
                         *quantiles(m("inferwatch_gateway_time_to_first_token_seconds_bucket"), by_variant,
                                    by="model, variant", qs=(0.95,))),
        timeseries_panel("Completion tokens p50 by variant", "short",
                         *quantiles(m("inferwatch_gateway_request_completion_tokens_bucket"), by_variant,
                                    by="model, variant", qs=(0.5,), exemplar=False)),
        stat_panel("Variants serving", "short",
                   q(f"count(count by (variant) ({req}{{{by_variant}}}))", "variants"), height=8),
    ]


def build():
    score = m("inferwatch_drift_score")
    return dashboard(
        uids.DRIFT, "inferwatch / drift and A/B", "Drift of request features and confidence against the "
                                                   "baseline; two model variants side by side.",
        [query_variable("model", "Model", f"label_values({score}, model)"),
         query_variable("variant", "Variant", f'label_values({score}{{model=~"$model"}}, variant)'),
         query_variable("feature", "Feature", f'label_values({score}{{model=~"$model"}}, feature)'),
         query_variable("method", "Method", f"label_values({score}, method)"),
         query_variable("drift", "Drift service", f'label_values(up{{job="{JOB_DRIFT}"}}, instance)')],
        [("Drift", drift()), ("A/B between variants", ab())])
