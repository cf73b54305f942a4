"""Each segment's verdict against its baseline, cached until the window, the baseline or the
thresholds change; one point per time bucket kept as the segment's history (stored, so a
restart goes on from it); the A/B comparison of two variants' windows; and the exact tests
on raw samples."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferwatch.drift.baseline import Baseline
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.ingest import Ingest
from inferwatch.drift.methods import DriftResult, ks_exact, wasserstein_exact
from inferwatch.drift.schema import CATEGORICAL_FEATURES, UNITS
from inferwatch.drift.store import Store
from inferwatch.drift.thresholds import Thresholds
from inferwatch.drift.verdicts import SegmentVerdict, reference_of, score
from inferwatch.drift.window_config import WindowConfig
from inferwatch.drift.windows import Segment

CATEGORICAL_NAMES = frozenset(c.name for c in CATEGORICAL_FEATURES)


@dataclass(frozen=True)
class HistoryPoint:
    t: float
    status: str
    features: dict[str, tuple[float | None, float, bool]]  # headline score, its threshold, feature drifted


def headline(feature: str) -> str:
    """The method the report charts per feature over time: W1 in reference standard
    deviations for numbers (readable as "shifted by x sigma"), chi-square for categories."""
    return "chi2" if feature in CATEGORICAL_NAMES else "wasserstein"


class SegmentVerdicts:
    def __init__(self, store: Store, config: WindowConfig, lock: threading.RLock, clock: Callable[[], float],
                 ingest: Ingest, baselines: Callable[[], Mapping[Segment, Baseline]], thresholds: Thresholds,
                 calibrator: BackgroundCalibrator) -> None:
        self.store, self.config, self.clock = store, config, clock
        self._lock = lock
        self.ingest, self._baselines, self.thresholds, self.calibrator = ingest, baselines, thresholds, calibrator
        self._results: dict[Segment, tuple[tuple[Any, ...], SegmentVerdict]] = {}
        self._history: dict[Segment, deque[HistoryPoint]] = {}

    # -- what the other roles tell (under the lock) ------------------------------------------
    def stale(self) -> None:
        """The thresholds changed: every cached verdict is stale."""
        self._results.clear()

    def expired(self, segment: Segment) -> None:
        """The segment's window went idle: its verdict goes, and its history unless it has a baseline."""
        self._results.pop(segment, None)
        if segment not in self._baselines():
            self._history.pop(segment, None)

    def rebased(self, segment: Segment) -> None:
        """The segment has a new baseline: its verdicts and history start over."""
        self._results.pop(segment, None)
        self._history.pop(segment, None)
        self.store.forget_history(*segment)

    def restore_history(self) -> None:
        for segment, points in self.store.history().items():
            if segment in self._baselines():
                self._history[segment] = deque(
                    (HistoryPoint(t, p["status"], {k: tuple(v) for k, v in p["features"].items()}) for t, p in points),
                    maxlen=self.config.history)

    # -- verdicts ---------------------------------------------------------------------------
    def verdict(self, segment: Segment) -> SegmentVerdict | None:
        """The segment's verdict against its baseline; None without a baseline or a window.
        Never calibrates on the caller's thread: a missing threshold is queued for the
        background worker and the verdict is ``calibrating`` until it is ready. Cached until
        the window, the baseline or the thresholds change (a calibrating one is not cached,
        so the next call picks up what the worker finished)."""
        now = self.clock()
        with self._lock:
            baseline, window = self._baselines().get(segment), self.ingest.windows.get(segment)
            if baseline is None or window is None:
                return None
            window.expire(now)
            t = self.thresholds
            key = (window.version, window.oldest(now), id(baseline), t.alpha, tuple(sorted(t.fixed.items())))
            cached = self._results.get(segment)
            if cached is not None and cached[0] == key:
                return cached[1]
            result = score(baseline.reference, window.histograms(now), t.policy, self.calibrator)
            if result.status != "calibrating":
                self._results[segment] = (key, result)
                self._remember(segment, now, result)
            return result

    def calibrated(self, segment: Segment, timeout_s: float = 120.0) -> SegmentVerdict | None:
        """``verdict``, after waiting for the background worker to calibrate what it needs: for
        one-shot callers (reports written to a file, simulations), never for requests."""
        deadline = time.monotonic() + timeout_s
        result = self.verdict(segment)
        while result is not None and result.status == "calibrating" and time.monotonic() < deadline:
            self.calibrator.wait(max(deadline - time.monotonic(), 0.0))
            result = self.verdict(segment)
        return result

    def _remember(self, segment: Segment, now: float, result: SegmentVerdict) -> None:
        """The segment's verdict in the current time bucket: one point per bucket, at the
        bucket's start (the same instants on both replicas of a pair), the bucket's latest
        verdict, stored so that a restart goes on from it."""
        history = self._history.setdefault(segment, deque(maxlen=self.config.history))
        width = self.config.bucket_s
        t = math.floor(now / width) * width
        points = {}
        for name, f in result.features.items():
            r = f.methods[headline(name)]
            points[name] = (r.score, r.threshold, f.drifted)
        point = HistoryPoint(t, result.status, points)
        if history and history[-1].t == t:
            if history[-1] == point:
                return
            history.pop()
        history.append(point)
        self.store.put_history(*segment, t, {"status": point.status, "features": point.features})

    def history(self, segment: Segment) -> list[HistoryPoint]:
        with self._lock:
            return list(self._history.get(segment, ()))

    def drifting_since(self, segment: Segment) -> float | None:
        """When the segment's current run of drift verdicts began (None if it is not drifting):
        the start of the first bucket of the run. A bucket whose window was too thin to judge
        (``insufficient_data``: a replica just restarted, before the records it missed reach
        it) neither begins nor ends a run."""
        since = None
        for point in self.history(segment):
            if point.status == "drift":
                since = since or point.t
            elif point.status != "insufficient_data":
                since = None
        return since

    def results(self, segment: Segment) -> dict[str, dict[str, DriftResult]]:
        verdict = self.verdict(segment)
        return {} if verdict is None else {name: f.methods for name, f in verdict.features.items()}

    def compare(self, model: str, variant_a: str, variant_b: str) -> SegmentVerdict | None:
        """A/B: variant b's current window scored against variant a's, feature by feature;
        a's window is the reference (binned at its own quantiles, calibrated at b's size).
        A reference that changes with every record has nothing to calibrate ahead of, so this
        calibrates on the caller's thread (the service runs it off its event loop)."""
        a, b = self.ingest.current((model, variant_a)), self.ingest.current((model, variant_b))
        if not a or not b:
            return None
        with self._lock:
            version = self.ingest.windows[(model, variant_a)].version
        reference = reference_of(a, f"window:{model}:{variant_a}:{version}")
        return score(reference, b, self.thresholds.policy, self.calibrator.cache)

    def exact(self, segment: Segment, feature: str) -> dict[str, Any]:
        """KS and Wasserstein on raw samples: the baseline's sample against the window's
        reservoir. ``wasserstein`` is W1 over the reference sample's standard deviation, the
        same quantity as in /v1/drift; ``w1`` is the raw distance in the feature's unit."""
        baseline = self._baselines().get(segment)
        current = self.ingest.samples(segment, feature)
        ref = baseline.samples.get(feature, np.empty(0)) if baseline else np.empty(0)
        out = {"feature": feature, "unit": UNITS[feature], "reference_sample": int(ref.size),
               "current_sample": int(current.size), "min_samples": self.config.min_samples}
        if min(ref.size, current.size) < self.config.min_samples:
            return {**out, "status": "insufficient_data"}
        d, p = ks_exact(ref, current)
        w1 = wasserstein_exact(ref, current)
        std = float(np.std(ref))
        scale = std if std > 0 else (abs(float(np.mean(ref))) or 1.0)
        return {**out, "status": "ok", "ks_statistic": d, "ks_p_value": p, "wasserstein": w1 / scale, "w1": w1}
