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
THRESHOLD = DriftMetric("inferwatch_drift_threshold", "gauge", "Threshold the verdict used.", RESULT_LABELS)
WINDOW_RECORDS = DriftMetric("inferwatch_drift_window_records", "gauge", "Records in the current window.",
                             SEGMENT_LABELS)
BASELINE_RECORDS = DriftMetric("inferwatch_drift_baseline_records", "gauge", "Records in the baseline.",
                               SEGMENT_LABELS)
INGESTED = DriftMetric("inferwatch_drift_ingested_records", "counter", "Records accepted.", ())
REJECTED = DriftMetric("inferwatch_drift_rejected_batches", "counter", "Batches refused, by reason.", ("reason",))

DRIFT_METRICS = (SCORE, DETECTED, THRESHOLD, WINDOW_RECORDS, BASELINE_RECORDS, INGESTED, REJECTED)
