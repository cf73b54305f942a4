"""Every metric the drift service exports, declared once (rules and dashboards read these)."""

from __future__ import annotations

from typing import Literal, NamedTuple


class DriftMetric(NamedTuple):
    name: str  # counters without the _total suffix, as prometheus_client expects
    kind: Literal["gauge", "counter"]
    doc: str
    labels: tuple[str, ...]


SEGMENT_LABELS = ("model", "variant")
RESULT_LABELS = (*SEGMENT_LABELS, "feature", "method")

SCORE = DriftMetric("inferwatch_drift_score", "gauge", "Drift score of the current window vs the baseline.",
                    RESULT_LABELS)
DETECTED = DriftMetric("inferwatch_drift_detected", "gauge", "1 if the score crosses its threshold.", RESULT_LABELS)
THRESHOLD = DriftMetric("inferwatch_drift_threshold", "gauge",
                        "Threshold the verdict used; source: calibrated (from the baseline at the window's size "
                        "and alpha), alpha (a p-value against alpha) or fixed.", (*RESULT_LABELS, "source"))
FEATURE_DETECTED = DriftMetric("inferwatch_drift_feature_detected", "gauge",
                               "1 if the feature drifted: rejected by Holm across the segment's features at alpha.",
                               (*SEGMENT_LABELS, "feature"))
FEATURE_P_VALUE = DriftMetric("inferwatch_drift_feature_p_value", "gauge",
                              "Calibrated p-value of 'some method flags this feature'.", (*SEGMENT_LABELS, "feature"))
SEGMENT_DETECTED = DriftMetric("inferwatch_drift_segment_detected", "gauge",
                               "1 if any feature of the segment drifted (false-alarm rate alpha per evaluation); "
                               "absent while the data is insufficient.", SEGMENT_LABELS)
SEGMENT_STATUS = DriftMetric("inferwatch_drift_segment_status", "gauge",
                             "1 for the segment's status: drift, no_drift, calibrating (a threshold is being computed "
                             "in the background) or insufficient_data.", (*SEGMENT_LABELS, "status"))
FEATURE_STATUS = DriftMetric("inferwatch_drift_feature_status", "gauge",
                             "1 for the feature's status: drift, no_drift, calibrating or insufficient_data.",
                             (*SEGMENT_LABELS, "feature", "status"))
ALPHA = DriftMetric("inferwatch_drift_alpha", "gauge", "False-alarm rate per evaluation the verdicts hold.", ())
SEGMENTS = DriftMetric("inferwatch_drift_segments", "gauge", "(model, variant) segments held.", ())
WINDOW_BYTES = DriftMetric("inferwatch_drift_window_bytes", "gauge", "Bytes held by all windows.", ())
OVERFLOW = DriftMetric("inferwatch_drift_overflow_records", "counter",
                       "Records of new segments beyond INFERWATCH_DRIFT_MAX_SEGMENTS, counted in model=variant=other.",
                       ())
EXPIRED = DriftMetric("inferwatch_drift_expired_segments", "counter",
                      "Idle segments dropped with their series.", ())
WINDOW_RECORDS = DriftMetric("inferwatch_drift_window_records", "gauge", "Records in the current window.",
                             SEGMENT_LABELS)
BASELINE_RECORDS = DriftMetric("inferwatch_drift_baseline_records", "gauge", "Records in the baseline.",
                               SEGMENT_LABELS)
CALIBRATIONS = DriftMetric("inferwatch_drift_calibrations", "counter",
                           "Null distributions computed by the background worker.", ())
CALIBRATIONS_PENDING = DriftMetric("inferwatch_drift_calibrations_pending", "gauge",
                                   "Calibrations queued or running in the background.", ())
CALIBRATIONS_REFUSED = DriftMetric("inferwatch_drift_calibrations_refused", "counter",
                                   "Calibrations asked for while the queue was full (asked for again at the next "
                                   "evaluation).", ())
CALIBRATION_FAILURES = DriftMetric("inferwatch_drift_calibration_failures", "counter",
                                   "Calibrations that raised (logged with a traceback).", ())
INTERNAL_ERRORS = DriftMetric("inferwatch_drift_internal_errors", "counter",
                              "Requests answered 500 after an unexpected exception (logged with a traceback), by "
                              "route.", ("route",))
INGESTED = DriftMetric("inferwatch_drift_ingested_records", "counter", "Records accepted.", ())
REJECTED = DriftMetric("inferwatch_drift_rejected_batches", "counter",
                       "Batches refused or not stored, by reason: unauthorized, too_large, invalid, duplicate (stored "
                       "before under its Idempotency-Key: a sender's try whose answer was lost).", ("reason",))

# A/B verdicts (drift.ab): per watched experiment, labelled model, control, treatment.
AB_LABELS = ("model", "control", "treatment")
AB_DECISION = DriftMetric("inferwatch_ab_decision", "gauge",
                          "1 for the A/B decision: rollback, hold, continue or promote.", (*AB_LABELS, "decision"))
AB_WORSE = DriftMetric("inferwatch_ab_guardrail_worse", "gauge",
                       "1 if the treatment is worse on the guardrail metric (always-valid p-value, Holm across "
                       "guardrails, family-wise false-rollback rate alpha over all looks).", (*AB_LABELS, "metric"))
AB_P_VALUE = DriftMetric("inferwatch_ab_p_value", "gauge",
                         "Always-valid (sequential) p-value of the guardrail's difference.", (*AB_LABELS, "metric"))
AB_EFFECT_RELATIVE = DriftMetric("inferwatch_ab_effect_relative", "gauge",
                                 "Treatment minus control over control (a rate, or the Hodges-Lehmann shift over the "
                                 "control's median).", (*AB_LABELS, "metric"))
AB_EFFECT_BOUND = DriftMetric("inferwatch_ab_effect_relative_bound", "gauge",
                              "The relative effect's fixed-sample 1 - alpha interval: its low and high bound.",
                              (*AB_LABELS, "metric", "bound"))
AB_REQUESTS = DriftMetric("inferwatch_ab_requests", "gauge", "Requests per arm in the judged weight epoch.",
                          (*AB_LABELS, "arm"))
AB_UNITS = DriftMetric("inferwatch_ab_units", "gauge",
                       "Randomized units (users; anonymous requests count one each) per arm in the judged weight epoch.",
                       (*AB_LABELS, "arm"))
AB_EPOCH = DriftMetric("inferwatch_ab_epoch", "gauge", "The weight epoch judged (the experiment's latest).", AB_LABELS)
AB_TREATMENT_SHARE = DriftMetric("inferwatch_ab_treatment_share_ratio", "gauge",
                                 "Treatment's share of the units in the judged weight epoch.", AB_LABELS)
AB_SRM_P_VALUE = DriftMetric("inferwatch_ab_srm_p_value", "gauge",
                             "Always-valid p-value of the units per arm against the epoch's weights (mismatch below "
                             "0.001).", AB_LABELS)
AB_SRM_CHI2_P_VALUE = DriftMetric("inferwatch_ab_srm_chi2_p_value", "gauge",
                                  "Pearson's chi-square p-value of the units per arm seen at this look against the "
                                  "epoch's weights (a hold below 0.001; a promote needs at least 0.1).", AB_LABELS)
AB_NOT_KEPT = DriftMetric("inferwatch_ab_records_not_kept", "counter",
                          "Records (and ratings) of an experiment no ledger took: 'experiments' (beyond "
                          "INFERWATCH_DRIFT_AB_EXPERIMENTS), 'no_epoch' (a gateway that does not stamp the weight epoch), "
                          "'too_old' (finished before the retention), 'rating_unknown_experiment'.", ("reason",))
AB_LEDGER_BYTES = DriftMetric("inferwatch_ab_ledger_bytes", "gauge", "Bytes held by the experiment ledgers.", ())
AB_METRICS = (AB_DECISION, AB_WORSE, AB_P_VALUE, AB_EFFECT_RELATIVE, AB_EFFECT_BOUND, AB_REQUESTS, AB_UNITS, AB_EPOCH,
              AB_TREATMENT_SHARE, AB_SRM_P_VALUE, AB_SRM_CHI2_P_VALUE)

DRIFT_METRICS = (SCORE, DETECTED, THRESHOLD, FEATURE_DETECTED, FEATURE_P_VALUE, SEGMENT_DETECTED, SEGMENT_STATUS,
                 FEATURE_STATUS, ALPHA, SEGMENTS, WINDOW_BYTES, WINDOW_RECORDS, BASELINE_RECORDS, INGESTED, REJECTED,
                 OVERFLOW, EXPIRED, CALIBRATIONS, CALIBRATIONS_PENDING, CALIBRATIONS_REFUSED, CALIBRATION_FAILURES,
                 INTERNAL_ERRORS, *AB_METRICS, AB_NOT_KEPT, AB_LEDGER_BYTES)
