"""Drift and A/B: has the traffic or the model changed, and how do two variants compare."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash_b

from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.spec import JOB_DRIFT, Spec
from inferwatch.dashboards import uids
from inferwatch.dashboards.health import RED_FROM_ONE, alerts_firing, targets_up
from inferwatch.dashboards.panels import (
    RATE,
    dashboard,
    or_zero,
    q,
    quantiles,
    query_variable,
    server_error_ratio,
    stat_panel,
    timeseries_panel,
)
from inferwatch.drift.schema import (
    CATEGORICAL_FEATURES,
    NUMERIC_FEATURES,
    SAMPLING,
    CategoricalFeature,
    NumericFeature,
)

SEG = 'model=~"$model", variant=~"$variant", instance=~"$drift"'
RES = f'{SEG}, feature=~"$feature", method=~"$method"'


def _names(features: Iterable[NumericFeature | CategoricalFeature]) -> str:
    return "|".join(f.name for f in features)


def drift(spec: Spec) -> list[Any]:
    feature = f'{SEG}, feature=~"$feature"'
    return [
        stat_panel("Segment verdict (1 = drift)", "short",
                   q(f'max by (model, variant) ({m("inferwatch_drift_segment_detected")}{{{SEG}}})',
                     "{{model}}/{{variant}}"),
                   thresholds=[(None, "green"), (1, "red")], width=6, height=9,
                   description="Holm's procedure across the segment's features at alpha: 1 if any feature "
                               "drifted. No value while a threshold is being calibrated or data is short "
                               "(see Features by status)."),
        timeseries_panel("Features by status", "short",
                         q(f'count by (model, variant, status) ({m("inferwatch_drift_feature_status")}{{{feature}}})',
                           "{{model}}/{{variant}} {{status}}"),
                         width=9, height=9,
                         description="Features per segment that drifted (drift), did not (no_drift), wait for their "
                                     "threshold to be calibrated in the background (calibrating) or have too few "
                                     "values (insufficient_data)."),
        *(timeseries_panel(f"{kind} features: p-values vs alpha", "short",
                           q(f'{m("inferwatch_drift_feature_p_value")}{{{feature}, feature=~"{names}"}}',
                             "{{variant}} {{feature}}"),
                           q(f'max({m("inferwatch_drift_alpha")}{{instance=~"$drift"}})', "alpha"),
                           width=width, height=9, log_scale=True,
                           description="Each feature's calibrated p-value for 'some method flags it'. Holm compares "
                                       "the smallest of the segment's features with alpha / (number of features), "
                                       "the next with alpha / (one fewer), and so on.")
          # three panels: every feature of a segment and alpha on one axis would be past eight lines
          for kind, names, width in (("Numeric", _names(NUMERIC_FEATURES), 9),
                                     ("Answer and outcome", _names(c for c in CATEGORICAL_FEATURES
                                                                   if c.name not in SAMPLING), 12),
                                     ("Sampling", _names(c for c in CATEGORICAL_FEATURES if c.name in SAMPLING), 12))),
        timeseries_panel("Drifted features per segment", "short",
                         q(f'sum by (model, variant) (max by (model, variant, feature) '
                           f'({m("inferwatch_drift_feature_detected")}{{{feature}}}))', "{{model}}/{{variant}}"),
                         width=12, height=9, description=(
                             "How many of the segment's features drifted: what DriftDetected alerts on (for "
                             f"{spec.thresholds.drift_for}, with at least {spec.thresholds.drift_min_window_records} "
                             "records in the window); the p-value panels say which.")),
        # one panel per feature: methods x variants x (score, threshold) of every feature
        # on one axis would be dozens of lines
        timeseries_panel("Drift score vs threshold ($feature)", "short",
                         q(f'{m("inferwatch_drift_score")}{{{RES}}}', "{{variant}} {{method}}"),
                         q(f'{m("inferwatch_drift_threshold")}{{{RES}}}',
                           "threshold ({{source}}) {{variant}} {{method}}"),
                         width=12, height=9,
                         description="Each method's score of the current window against the baseline, with the "
                                     "threshold its verdict used and where it came from: calibrated (from the "
                                     "baseline at the window's size and alpha), alpha (a p-value) or fixed.")
        .repeat("feature").repeat_direction("h").max_per_row(2),
        timeseries_panel("Window and baseline sizes", "short",
                         q(f'{m("inferwatch_drift_window_records")}{{{SEG}}}', "window {{model}}/{{variant}}"),
                         q(f'{m("inferwatch_drift_baseline_records")}{{{SEG}}}', "baseline {{model}}/{{variant}}")),
        timeseries_panel("Calibration", "short",
                         q(f'sum({m("inferwatch_drift_calibrations_pending")}{{instance=~"$drift"}})', "pending"),
                         q(f'sum(rate({m("inferwatch_drift_calibrations_total")}{{instance=~"$drift"}}[{RATE}]))',
                           "calibrations/s"),
                         q(f'sum(rate({m("inferwatch_drift_calibrations_refused_total")}{{instance=~"$drift"}}'
                           f'[{RATE}]))', "refused/s (queue full)"),
                         q(f'sum(rate({m("inferwatch_drift_calibration_failures_total")}{{instance=~"$drift"}}'
                           f'[{RATE}]))', "failures/s"),
                         description="Thresholds are calibrated in the background; verdicts say calibrating until "
                                     "theirs is ready."),
        timeseries_panel("Ingest", "short",
                         q(f'sum(rate({m("inferwatch_drift_ingested_records_total")}{{instance=~"$drift"}}[{RATE}]))',
                           "records/s accepted"),
                         q(or_zero(f'sum by (reason) (rate({m("inferwatch_drift_rejected_batches_total")}'
                                   f'{{instance=~"$drift"}}[{RATE}]))', "reason"), "batches/s rejected: {{reason}}")),
        timeseries_panel("Feature records at the gateway", "short",
                         q(f'sum by (outcome) (rate({m("inferwatch_gateway_feature_records_total")}[{RATE}]))',
                           "{{outcome}}"),
                         width=24, description="queued, sent, dropped_full, dropped_send_error."),
    ]


def health(spec: Spec) -> list[Any]:
    return [targets_up((JOB_DRIFT,)), alerts_firing(uids.DRIFT, spec.alerts)]


def verdicts() -> list[Any]:
    """The A/B verdict per experiment (model, control, treatment): what ABCanaryWorse and
    ABCanaryHurtingUsers read, and the weights that decide how many users it reaches."""
    ab_sel = 'model=~"$model"'
    worse = f'{m("inferwatch_ab_guardrail_worse")}{{{ab_sel}}}'
    guardrail = f'{ab_sel},metric=~"$guardrail"'
    arms = "{{treatment}} vs {{control}}"
    return [
        stat_panel("Decision", "short",
                   q(f'max by (model, control, treatment, decision) ({m("inferwatch_ab_decision")}{{{ab_sel}}}) == 1',
                     f"{{{{model}}}} {arms}: {{{{decision}}}}", instant=True),
                   width=8, height=6, names_only=True,
                   description="rollback, hold, continue or promote, for the latest weight epoch."),
        # 14 guardrails are too many lines to read: the worse ones by name, else one line at 0
        timeseries_panel("Guardrails worse (1 = worse, 0 = none)", "short",
                         q(f'(max by (treatment, metric) ({worse}) == 1) '
                           f'or on (treatment) (max by (treatment) ({worse}) == 0)',
                           "{{treatment}} {{metric}}"),
                         thresholds=RED_FROM_ONE, width=8, height=6,
                         description="Always-valid test per guardrail, Holm across guardrails; each worse guardrail "
                                     "by name, one line at 0 while none is: ABCanaryWorse opens a ticket; "
                                     "ABCanaryHurtingUsers pages once the treatment has a real share."),
        timeseries_panel("Sample ratio p-value", "short",
                         q(f'max by (treatment) ({m("inferwatch_ab_srm_p_value")}{{{ab_sel}}})', "{{treatment}}"),
                         thresholds=[(None, "red"), (0.001, "green")], width=8, height=6, log_scale=True,
                         description="Units per arm against the epoch's weights: below 0.001 the split is broken "
                                     "and no verdict can be trusted."),
        # one panel per guardrail: an effect and its two bounds per treatment stay readable
        timeseries_panel("Effect on $guardrail, treatment vs control", "percentunit",
                         q(f'max by (treatment, metric) ({m("inferwatch_ab_effect_relative")}{{{guardrail}}})',
                           "{{treatment}} {{metric}}"),
                         q(f'max by (treatment, metric, bound) ({m("inferwatch_ab_effect_relative_bound")}'
                           f'{{{guardrail}}})', "{{treatment}} {{metric}} {{bound}}"),
                         width=24, height=6,  # Grafana sizes the copies: 24 / min(guardrails, 3) each
                         description="Treatment minus control over control, with its fixed-sample interval at the "
                                     "verdict's alpha (the decision itself uses always-valid p-values, which are "
                                     "wider early on).")
        .repeat("guardrail").repeat_direction("h").max_per_row(3),
        timeseries_panel("Live weights per gateway", "percentunit",
                         q(f'max by (instance, variant) ({m("inferwatch_gateway_experiment_weight_ratio")}'
                           f'{{{ab_sel}}})', "{{instance}} {{variant}}"),
                         q(f'max by (treatment) ({m("inferwatch_ab_treatment_share_ratio")}{{{ab_sel}}})',
                           "units seen: {{treatment}}"),
                         width=12, height=6,
                         description="The weights each gateway routes by, and the treatment's share of the units "
                                     "the drift service saw (they agree unless the split is broken)."),
        timeseries_panel("Units per arm", "short",
                         q(f'max by (treatment, arm) ({m("inferwatch_ab_units")}{{{ab_sel}}})',
                           "{{treatment}} {{arm}}"),
                         width=12, height=6, description="Randomized units (users) per arm in the judged epoch."),
    ]


def ab() -> list[Any]:
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


def build(spec: Spec) -> dash_b.Dashboard:
    score = m("inferwatch_drift_score")
    return dashboard(
        uids.DRIFT, "inferwatch / drift and A/B", "Drift of request features and confidence against the "
                                                   "baseline; two model variants side by side.",
        # models with drift scores and models in A/B experiments (either may be without the other)
        [query_variable("model", "Model", f'label_values({{__name__=~"{score}|{m("inferwatch_ab_decision")}"}}, model)'),
         query_variable("variant", "Variant", f'label_values({score}{{model=~"$model"}}, variant)'),
         query_variable("feature", "Feature", f'label_values({score}{{model=~"$model"}}, feature)'),
         query_variable("method", "Method", f"label_values({score}, method)"),
         query_variable("guardrail", "A/B guardrail",
                        f'label_values({m("inferwatch_ab_effect_relative")}{{model=~"$model"}}, metric)'),
         query_variable("drift", "Drift service", f'label_values(up{{job="{JOB_DRIFT}"}}, instance)')],
        [("Health", health(spec)), ("Drift", drift(spec)), ("A/B verdicts", verdicts()), ("A/B between variants", ab())])
