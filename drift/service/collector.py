"""The drift service's own series: computed at scrape time from the roles (verdicts are cached
until a window, baseline or threshold changes, and never calibrated here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.drift import metrics as drift_metrics
from inferwatch.drift.segment_verdicts import headline
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.verdicts import feature_status


class DriftCollector(Collector):
    """Scores computed at scrape time from the windows (cached until a window, baseline or
    threshold changes; never calibrated here: a missing threshold shows as ``calibrating``).
    Series exist only for live segments: idle ones expire with theirs."""

    PER_SEGMENT = (drift_metrics.SCORE, drift_metrics.DETECTED, drift_metrics.THRESHOLD, drift_metrics.FEATURE_DETECTED,
                   drift_metrics.FEATURE_P_VALUE, drift_metrics.SEGMENT_DETECTED, drift_metrics.SEGMENT_STATUS,
                   drift_metrics.FEATURE_STATUS, drift_metrics.WINDOW_RECORDS, drift_metrics.BASELINE_RECORDS)

    def __init__(self, state: DriftState, methods: Literal["headline", "all"] = "headline") -> None:
        self.state = state
        self.methods = methods

    def collect(self) -> Iterator[Metric]:
        g = {m: GaugeMetricFamily(m.name, m.doc, labels=list(m.labels)) for m in self.PER_SEGMENT}
        for segment in self.state.ingest.segments():
            seg = list(segment)
            if segment in self.state.ingest.windows:
                g[drift_metrics.WINDOW_RECORDS].add_metric(seg, self.state.ingest.records(segment))
            baseline = self.state.baselines.held.get(segment)
            if baseline is not None:
                g[drift_metrics.BASELINE_RECORDS].add_metric(seg, baseline.records)
            verdict = self.state.verdicts.verdict(segment)
            if verdict is None:
                continue
            g[drift_metrics.SEGMENT_STATUS].add_metric([*seg, verdict.status], 1.0)
            decided = verdict.status in ("drift", "no_drift")
            if decided:
                g[drift_metrics.SEGMENT_DETECTED].add_metric(seg, 1.0 if verdict.status == "drift" else 0.0)
            for feature, f in verdict.features.items():
                g[drift_metrics.FEATURE_STATUS].add_metric([*seg, feature, feature_status(verdict, feature)], 1.0)
                if f.status != "ok":
                    continue
                g[drift_metrics.FEATURE_P_VALUE].add_metric([*seg, feature], f.p_value)  # type: ignore[arg-type]  # set when ok
                if decided:
                    g[drift_metrics.FEATURE_DETECTED].add_metric([*seg, feature], 1.0 if f.drifted else 0.0)
                for r in f.methods.values():
                    if self.methods == "headline" and not f.drifted and r.method != headline(feature):
                        continue  # bounded: one method per quiet feature (about 8 series, not 40, per segment)
                    key = [*seg, feature, r.method]
                    g[drift_metrics.SCORE].add_metric(key, r.score)  # type: ignore[arg-type]  # set when ok
                    g[drift_metrics.DETECTED].add_metric(key, 1.0 if r.drifted else 0.0)
                    g[drift_metrics.THRESHOLD].add_metric([*key, r.source], r.threshold)
        yield from g.values()
        calibrator = self.state.calibrator
        for metric, value in ((drift_metrics.ALPHA, self.state.thresholds.alpha),
                              (drift_metrics.SEGMENTS, len(self.state.ingest.segments())),
                              (drift_metrics.WINDOW_BYTES, self.state.ingest.memory_bytes()),
                              (drift_metrics.CALIBRATIONS_PENDING, calibrator.pending)):
            yield GaugeMetricFamily(metric.name, metric.doc, value=value)
        for metric, value in ((drift_metrics.OVERFLOW, self.state.ingest.overflow),
                              (drift_metrics.EXPIRED, self.state.ingest.expired),
                              (drift_metrics.CALIBRATIONS, calibrator.calibrated),
                              (drift_metrics.CALIBRATIONS_REFUSED, calibrator.refused),
                              (drift_metrics.CALIBRATION_FAILURES, calibrator.failed)):
            yield CounterMetricFamily(metric.name, metric.doc, value=value)
