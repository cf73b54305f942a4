"""Scoring a segment: every feature and method against a reference, with calibrated
thresholds, per-feature p-values and one per-segment verdict (Holm at alpha).

Pure apart from the source of null distributions it is handed: the state, the A/B comparison
and the simulations in the tests and benchmarks all score through ``score``.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal, Protocol, cast

import numpy as np

from inferwatch.drift.binning import (
    CategoricalCounts,
    Edges,
    Histogram,
    merge,
    merged_bins,
    merged_edges,
    quantile_starts,
)
from inferwatch.drift.calibration import RESAMPLES, NullDistribution, holm, null_distribution, size_band
from inferwatch.drift.methods import METHODS, DriftResult, ThresholdSource, chi_square, evaluate, prepare
from inferwatch.drift.schema import CATEGORICAL_FEATURES, NUMERIC_FEATURES

Windows = dict[str, Histogram | CategoricalCounts]
SegmentStatus = Literal["drift", "no_drift", "insufficient_data", "calibrating"]
NUMERIC_METHODS = tuple(m for m, s in METHODS.items() if s.applies_to == "numeric")


@dataclass(frozen=True)
class Policy:
    """How verdicts are reached. ``fixed`` holds operator-chosen thresholds for the methods
    that should not be calibrated; every other method is calibrated at ``alpha``. Feature and
    segment verdicts are always calibrated (they are what alerts read)."""

    alpha: float = 0.01
    min_samples: int = 50
    resamples: int = RESAMPLES
    fixed: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Reference:
    """A reference window: fine-grid counts and, per numeric feature, how its bins merge."""

    histograms: Windows
    starts: dict[str, np.ndarray]
    key: str  # identifies the reference in the calibration cache

    def merged(self, name: str) -> Histogram:
        h = self.histograms[name]
        assert isinstance(h, Histogram)
        return merge(h, self.starts[name], merged_edges(h.edges, self.starts[name]))


def reference_of(histograms: Windows, key: str, bins: int = 20) -> Reference:
    """Merge plan per numeric feature at the reference's own quantiles (about ``bins`` bins)."""
    starts = {}
    for f in NUMERIC_FEATURES:
        h = histograms[f.name]
        starts[f.name] = quantile_starts(h.counts, merged_bins(h.total, bins))
    return Reference(histograms, starts, key)


CacheKey = tuple[str, str, int, int]  # reference key, feature, size band, resamples


class NullSource(Protocol):
    """Where scoring gets null distributions: computed on the spot (``CalibrationCache``) or
    None while a background worker computes it (``drift.calibrator``)."""

    def get(self, reference: Reference, feature: str, n_cur: int, resamples: int) -> NullDistribution | None: ...


class CalibrationCache:
    """Null distributions by (reference, feature, size band), least recently used dropped
    first; each entry is about 48 KB (6 x B float32). Thread-safe: a background worker
    fills it while requests read it."""

    def __init__(self, entries: int = 1024) -> None:
        self.entries = entries
        self._cache: OrderedDict[CacheKey, NullDistribution] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(reference: Reference, feature: str, band: int, resamples: int) -> CacheKey:
        return reference.key, feature, band, resamples

    def peek(self, key: CacheKey) -> NullDistribution | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def put(self, key: CacheKey, null: NullDistribution) -> None:
        with self._lock:
            self._cache[key] = null
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)

    def get(self, reference: Reference, feature: str, n_cur: int, resamples: int) -> NullDistribution:
        """Computed on the spot when missing: for references that live for one request (A/B,
        fleet drift), where there is nothing to compute ahead of."""
        key = self.key(reference, feature, size_band(n_cur), resamples)
        null = self.peek(key)
        if null is None:
            null = calibrate(reference, feature, size_band(n_cur), resamples)
            self.put(key, null)
        return null

    def has_room(self) -> bool:
        """Below 90 % full: room for calibrations asked for ahead of need, which must not evict
        ones in use (that would calibrate the same thresholds again and again)."""
        with self._lock:
            return len(self._cache) < 0.9 * self.entries

    def forget(self, reference_key: str) -> None:
        with self._lock:
            for key in [k for k in self._cache if k[0] == reference_key]:
                del self._cache[key]


def calibrate(reference: Reference, feature: str, band: int, resamples: int) -> NullDistribution:
    """The null distribution of one reference feature at one size band (seeded by feature and
    band, so a restart draws the same thresholds), stored as float32."""
    fine = reference.histograms[feature]
    assert isinstance(fine, Histogram)
    seed = zlib.crc32(f"{feature}:{band}".encode())
    null = null_distribution(fine.counts, fine.edges, band, merged_bins(fine.total), resamples, seed)
    return NullDistribution(null.n_ref, null.n_cur, null.sorted_stats.astype(np.float32),
                            null.sorted_min_p.astype(np.float32))


@dataclass(frozen=True)
class FeatureVerdict:
    status: Literal["ok", "insufficient_data", "calibrating"]
    n_ref: int
    n_cur: int
    p_value: float | None  # "some method flags this feature", calibrated
    drifted: bool  # after Holm across the segment's features
    methods: dict[str, DriftResult]


@dataclass(frozen=True)
class SegmentVerdict:
    status: SegmentStatus
    alpha: float
    features: dict[str, FeatureVerdict]

    @property
    def drifted_features(self) -> list[str]:
        return [name for name, f in self.features.items() if f.drifted]


def _insufficient(method: str, threshold: float, n_ref: int, n_cur: int, minimum: int,
                  source: ThresholdSource) -> DriftResult:
    spec = METHODS[method]
    return DriftResult(method, spec.kind, spec.direction, None, threshold, False, "insufficient_data",
                       f"{n_ref} reference and {n_cur} current values; at least {minimum} each needed",
                       source)


def _calibrating(ref: Histogram, cur: Histogram, policy: Policy,
                 fine: tuple[Histogram, Histogram]) -> dict[str, DriftResult]:
    """Scores while the threshold is being calibrated: no calibrated verdict or p-value yet,
    said so; a fixed threshold needs no calibration and gives its verdict."""
    fixed = dict(policy.fixed)
    pp = prepare(ref, cur, fine)
    band = size_band(cur.total)
    results = {}
    for m in NUMERIC_METHODS:
        base = evaluate(m, ref, cur, fixed.get(m), pp)
        if m in fixed:
            results[m] = replace(base, source="fixed")
        else:
            results[m] = replace(base, threshold=policy.alpha if base.kind == "p_value" else math.nan,
                                 drifted=False, status="calibrating", source="alpha" if base.kind == "p_value"
                                 else "calibrated", detail=f"threshold being calibrated at n={band}",
                                 score=None if base.kind == "p_value" else base.score)
    return results


def _numeric(name: str, reference: Reference, current: Histogram, policy: Policy,
             nulls: NullSource) -> tuple[FeatureVerdict, float | None]:
    fixed = dict(policy.fixed)
    ref = reference.merged(name)
    cur = merge(current, reference.starts[name], ref.edges)
    n_ref, n_cur = ref.total, cur.total
    if min(n_ref, n_cur) < policy.min_samples:
        results = {m: _insufficient(m, fixed.get(m, policy.alpha if METHODS[m].kind == "p_value" else math.nan),
                                    n_ref, n_cur, policy.min_samples, "fixed" if m in fixed else "calibrated")
                   for m in NUMERIC_METHODS}
        return FeatureVerdict("insufficient_data", n_ref, n_cur, None, False, results), None
    fine = (cast(Histogram, reference.histograms[name]), current)  # a numeric feature's
    null = nulls.get(reference, name, n_cur, policy.resamples)
    if null is None:
        return FeatureVerdict("calibrating", n_ref, n_cur, None, False, _calibrating(ref, cur, policy, fine)), None
    results = method_results(ref, cur, null, policy, fine)
    feature_p = null.feature_p_value(min(cast(float, r.p_value) for r in results.values()))  # calibrated: each has one
    return FeatureVerdict("ok", n_ref, n_cur, feature_p, False, results), feature_p


def method_results(ref: Histogram, cur: Histogram, null: NullDistribution, policy: Policy,
                   fine: tuple[Histogram, Histogram]) -> dict[str, DriftResult]:
    """Every numeric method on one pair of histograms (merged bins; ``fine``: the same pair on
    the fine grid, for Wasserstein): its score, its calibrated p-value, and its verdict
    against a calibrated threshold (distances), alpha (p-values) or a fixed one."""
    fixed = dict(policy.fixed)
    pp = prepare(ref, cur, fine)
    results = {}
    for m in NUMERIC_METHODS:
        spec = METHODS[m]
        base = evaluate(m, ref, cur, fixed.get(m), pp)
        score = base.score
        assert score is not None  # None only below min_samples, which the caller ruled out
        p = null.p_value(m, float(pp.cdf_gap.max()) if m == "ks" else score)
        if m in fixed:
            results[m] = DriftResult(m, spec.kind, spec.direction, score, fixed[m], base.drifted, source="fixed",
                                     p_value=p, calibration_n=null.n_cur)
        elif spec.kind == "p_value":
            results[m] = DriftResult(m, spec.kind, spec.direction, p, policy.alpha, p <= policy.alpha,
                                     source="alpha", p_value=p, calibration_n=null.n_cur)
        else:
            limit = null.threshold(m, policy.alpha)
            results[m] = DriftResult(m, spec.kind, spec.direction, score, limit,
                                     score > limit, source="calibrated", p_value=p,
                                     calibration_n=null.n_cur)
    return results


def _categorical(name: str, ref: CategoricalCounts, cur: CategoricalCounts,
                 policy: Policy) -> tuple[FeatureVerdict, float | None]:
    fixed = dict(policy.fixed)
    source: ThresholdSource = "fixed" if "chi2" in fixed else "alpha"
    limit = fixed.get("chi2", policy.alpha)
    if min(ref.total, cur.total) < policy.min_samples:
        result = _insufficient("chi2", limit, ref.total, cur.total, policy.min_samples, source)
        return FeatureVerdict("insufficient_data", ref.total, cur.total, None, False, {"chi2": result}), None
    p = chi_square(ref, cur, policy.resamples)[1]
    spec = METHODS["chi2"]
    result = DriftResult("chi2", spec.kind, spec.direction, p, limit, p < limit if source == "fixed" else p <= limit,
                         source=source, p_value=p)
    return FeatureVerdict("ok", ref.total, cur.total, p, False, {"chi2": result}), p


def score(reference: Reference, current: Windows, policy: Policy, nulls: NullSource) -> SegmentVerdict:
    """Every feature and method of ``current`` against ``reference``, then Holm across the
    features that have enough data: the segment drifted if any feature is rejected. While a
    feature's threshold is being calibrated the segment is ``calibrating``: Holm over part of
    the features would be a different test from the one the alert and the docs state."""
    verdicts: dict[str, FeatureVerdict] = {}
    p_values: dict[str, float] = {}
    for f in NUMERIC_FEATURES:
        cur = current[f.name]
        assert isinstance(cur, Histogram)
        verdicts[f.name], p = _numeric(f.name, reference, cur, policy, nulls)
        if p is not None:
            p_values[f.name] = p
    for c in CATEGORICAL_FEATURES:
        ref, cur = reference.histograms[c.name], current[c.name]
        assert isinstance(ref, CategoricalCounts) and isinstance(cur, CategoricalCounts)
        verdicts[c.name], p = _categorical(c.name, ref, cur, policy)
        if p is not None:
            p_values[c.name] = p
    if any(v.status == "calibrating" for v in verdicts.values()):
        return SegmentVerdict("calibrating", policy.alpha, verdicts)
    rejected = holm(p_values, policy.alpha)
    for name, drifted in rejected.items():
        v = verdicts[name]
        verdicts[name] = FeatureVerdict(v.status, v.n_ref, v.n_cur, v.p_value, drifted, v.methods)
    status: SegmentStatus = "insufficient_data" if not p_values else ("drift" if any(rejected.values()) else "no_drift")
    return SegmentVerdict(status, policy.alpha, verdicts)


def feature_status(verdict: SegmentVerdict, feature: str) -> str:
    """One word per feature for metrics and dashboards: drift / no_drift once the segment's
    verdict is in, else calibrating or insufficient_data (a feature with data waits for the
    segment's calibration, since Holm decides all features at once)."""
    f = verdict.features[feature]
    if f.status == "insufficient_data":
        return "insufficient_data"
    if verdict.status == "calibrating":
        return "calibrating"
    return "drift" if f.drifted else "no_drift"


def analysis_edges(reference: Reference) -> dict[str, Edges]:
    """The merged bin edges each numeric feature is scored on (stored with a baseline)."""
    out = {}
    for f in NUMERIC_FEATURES:
        h = reference.histograms[f.name]
        assert isinstance(h, Histogram)
        out[f.name] = merged_edges(h.edges, reference.starts[f.name])
    return out
