"""The JSON the service answers with, from the roles' values: a method's result, a segment's
verdict, a baseline."""

from __future__ import annotations

import math
from typing import Any

from inferwatch.drift.baseline import Baseline
from inferwatch.drift.methods import DriftResult
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.verdicts import SegmentVerdict, analysis_edges
from inferwatch.drift.windows import Segment


def result_json(r: DriftResult) -> dict[str, Any]:
    return {"method": r.method, "kind": r.kind, "direction": r.direction, "score": r.score,
            "threshold": None if math.isnan(r.threshold) else r.threshold,
            "threshold_source": r.source, "calibration_n": r.calibration_n, "p_value": r.p_value,
            "drifted": r.drifted, "status": r.status}


def features_json(verdict: SegmentVerdict) -> dict[str, Any]:
    return {name: {"status": f.status, "reference_n": f.n_ref, "current_n": f.n_cur, "p_value": f.p_value,
                   "drifted": f.drifted, "methods": {m: result_json(r) for m, r in f.methods.items()}}
            for name, f in verdict.features.items()}


def segment_json(state: DriftState, segment: Segment, feature: str | None = None) -> dict[str, Any]:
    verdict = state.verdicts.verdict(segment)
    baseline = state.baselines.held.get(segment)
    features = features_json(verdict) if verdict else {}
    if feature is not None:
        features = {k: v for k, v in features.items() if k == feature}
    return {"model": segment[0], "variant": segment[1],
            "status": verdict.status if verdict else "no_baseline", "alpha": state.thresholds.alpha,
            "window_records": state.ingest.records(segment), "baseline_records": baseline.records if baseline else 0,
            "drifted_features": verdict.drifted_features if verdict else [],
            "drifting_since": state.verdicts.drifting_since(segment), "features": features}


def baseline_json(model: str, variant: str, b: Baseline) -> dict[str, Any]:
    return {"model": model, "variant": variant, "records": b.records, "source": b.source, "created_at": b.created_at,
            "edges": {name: e.values.tolist() for name, e in analysis_edges(b.reference).items()}}
