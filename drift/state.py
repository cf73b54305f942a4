"""The drift service's state: windows per segment, baselines, and the results they give.

No HTTP here: the service and the tests drive it with batches and clocks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from drift.binning import CategoricalCounts, Histogram
from drift.methods import METHODS, DriftResult, evaluate, ks_exact, prepare, wasserstein_exact
from drift.schema import CATEGORICAL_FEATURES, FEATURES, NUMERIC_FEATURES, Batch, BatchError, parse_batch
from drift.store import Store
from drift.windows import Segment, SegmentWindow, baseline_from, segments_of

log = logging.getLogger(__name__)
Windows = dict[str, Histogram | CategoricalCounts]
BASELINE_SAMPLE = 5000


@dataclass(frozen=True)
class WindowConfig:
    window_s: float = 3600.0
    buckets: int = 60
    reservoir: int = 2000  # raw values per numeric feature per window (spread over buckets)
    retention_s: float = 7 * 86400.0  # stored batches, for baselines frozen from past ranges
    thresholds: tuple[tuple[str, float], ...] = ()  # method -> threshold overrides


@dataclass(frozen=True)
class Baseline:
    histograms: Windows
    samples: dict[str, np.ndarray]
    records: int
    source: dict


class DriftState:
    def __init__(self, store: Store, config: WindowConfig, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.windows: dict[Segment, SegmentWindow] = {}
        self.baselines: dict[Segment, Baseline] = {}
        self.thresholds = {m: s.default_threshold for m, s in METHODS.items()} | dict(config.thresholds)
        self.ingested = 0
        self._lock = threading.Lock()

    # -- ingest ---------------------------------------------------------------------------
    def ingest(self, body: bytes) -> tuple[int, int]:
        """Validate, persist, count. Returns (records accepted, records inside the window)."""
        now = self.clock()
        batch = parse_batch(body, now)
        self.store.append(body, float(batch.finished_at.min()), float(batch.finished_at.max()), now)
        return batch.size, self._count(batch, now)

    def _count(self, batch: Batch, now: float) -> int:
        inside = 0
        with self._lock:
            for segment, rows in segments_of(batch).items():
                window = self.windows.get(segment)
                if window is None:
                    cfg = self.config
                    window = self.windows[segment] = SegmentWindow(
                        cfg.window_s, cfg.buckets, max(1, cfg.reservoir // cfg.buckets))
                inside += window.add(batch, rows, now)
            self.ingested += batch.size
        return inside

    def restore(self) -> int:
        """Rebuild windows and baselines from the store (after a restart or a crash)."""
        now = self.clock()
        self.store.prune(now - self.config.retention_s)
        replayed = 0
        for body in self.store.batches(now - self.config.window_s):
            try:
                batch = _stored(body)
            except BatchError as exc:  # only if the record contract changed between versions; never fatal
                log.error("skipping a stored batch that no longer validates: %s", exc)
                continue
            self._count(batch, now)
            replayed += batch.size
        for segment, doc in self.store.baselines().items():
            self.baselines[segment] = baseline_from_doc(doc)
        self.thresholds.update(self.store.setting("thresholds", {}))  # type: ignore[arg-type]
        return replayed

    def set_thresholds(self, changes: dict[str, float]) -> dict[str, float]:
        """Change verdict thresholds at run time; persisted, so they survive restarts."""
        for method, value in changes.items():
            spec = METHODS.get(method)
            if spec is None:
                raise BatchError(f"unknown method '{method}'; known: {', '.join(METHODS)}", field=method)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise BatchError(f"threshold for '{method}' must be a positive number", field=method)
            if spec.kind == "p_value" and value >= 1:
                raise BatchError(f"'{method}' is a p-value test: its threshold must be below 1", field=method)
        with self._lock:
            self.thresholds.update({m: float(v) for m, v in changes.items()})
            overrides = {m: v for m, v in self.thresholds.items() if v != METHODS[m].default_threshold}
        self.store.put_setting("thresholds", overrides)
        return dict(self.thresholds)

    # -- baselines ------------------------------------------------------------------------
    def freeze_baseline(self, segment: Segment, since: float, until: float) -> Baseline:
        batches = [_stored(body) for body in self.store.batches(since, until)]
        in_range = []
        for b in batches:
            keep = (b.finished_at >= since) & (b.finished_at <= until)
            in_range.append(_subset(b, np.flatnonzero(keep)))
        hists = baseline_from(in_range, segment)
        records = int(hists["status_class"].counts.sum())
        if records == 0:
            raise BatchError(f"no records for model '{segment[0]}' variant '{segment[1]}' between {since} and {until}")
        samples = {}
        rng = np.random.default_rng(0)
        rows_of = [(b, segments_of(b).get(segment)) for b in in_range]
        for f in NUMERIC_FEATURES:
            parts = [b.numeric[f.name][rows] for b, rows in rows_of if rows is not None]
            values = np.concatenate(parts) if parts else np.empty(0)
            values = values[np.isfinite(values)]
            if values.size > BASELINE_SAMPLE:
                values = rng.choice(values, BASELINE_SAMPLE, replace=False)
            samples[f.name] = values
        baseline = Baseline(hists, samples, records, {"kind": "range", "from": since, "to": until})
        self._put_baseline(segment, baseline)
        return baseline

    def upload_baseline(self, segment: Segment, histograms: dict[str, list[int]]) -> Baseline:
        doc = {"histograms": histograms, "samples": {}, "source": {"kind": "upload"}}
        baseline = baseline_from_doc(doc)  # validates shapes and values
        self._put_baseline(segment, baseline)
        return baseline

    def _put_baseline(self, segment: Segment, baseline: Baseline) -> None:
        self.store.put_baseline(*segment, baseline_doc(baseline), self.clock())
        with self._lock:
            self.baselines[segment] = baseline

    # -- results --------------------------------------------------------------------------
    def segments(self) -> list[Segment]:
        with self._lock:
            return sorted(set(self.windows) | set(self.baselines))

    def current(self, segment: Segment) -> Windows:
        now = self.clock()
        with self._lock:
            window = self.windows.get(segment)
            return window.histograms(now) if window else {}

    def results(self, segment: Segment) -> dict[str, dict[str, DriftResult]]:
        baseline = self.baselines.get(segment)
        current = self.current(segment)
        if baseline is None or not current:
            return {}
        return self.score(baseline.histograms, current)

    def compare(self, model: str, variant_a: str, variant_b: str) -> dict[str, dict[str, DriftResult]]:
        """A/B: variant b's current window scored against variant a's, feature by feature."""
        a, b = self.current((model, variant_a)), self.current((model, variant_b))
        return self.score(a, b) if a and b else {}

    def score(self, reference: Windows, current: Windows) -> dict[str, dict[str, DriftResult]]:
        out: dict[str, dict[str, DriftResult]] = {}
        for f in NUMERIC_FEATURES:
            ref, cur = reference[f.name], current[f.name]
            prepared = prepare(ref, cur) if ref.total and cur.total else None  # type: ignore[arg-type]
            out[f.name] = {m: evaluate(m, ref, cur, self.thresholds[m], prepared)
                           for m, s in METHODS.items() if s.applies_to == "numeric"}
        for f in CATEGORICAL_FEATURES:
            out[f.name] = {"chi2": evaluate("chi2", reference[f.name], current[f.name], self.thresholds["chi2"])}
        return out

    def exact(self, segment: Segment, feature: str) -> dict:
        """KS and W1 on raw samples: the baseline's sample against the window's reservoir."""
        baseline = self.baselines.get(segment)
        with self._lock:
            window = self.windows.get(segment)
            current = window.samples(feature, self.clock()) if window else np.empty(0)
        ref = baseline.samples.get(feature, np.empty(0)) if baseline else np.empty(0)
        if ref.size == 0 or current.size == 0:
            return {"feature": feature, "status": "insufficient_data", "reference_sample": int(ref.size),
                    "current_sample": int(current.size)}
        d, p = ks_exact(ref, current)
        return {"feature": feature, "status": "ok", "ks_statistic": d, "ks_p_value": p,
                "wasserstein": wasserstein_exact(ref, current), "reference_sample": int(ref.size),
                "current_sample": int(current.size)}

    def window_records(self, segment: Segment) -> int:
        with self._lock:
            window = self.windows.get(segment)
            return window.records(self.clock()) if window else 0


def _stored(body: bytes) -> Batch:
    """A batch read back from the store. It was validated when it was acknowledged; the
    future-timestamp rule was relative to that moment and must not apply again."""
    return parse_batch(body, now=math.inf)


def _subset(batch: Batch, rows: np.ndarray) -> Batch:
    return Batch(
        size=rows.size, model=[batch.model[i] for i in rows], variant=[batch.variant[i] for i in rows],
        finished_at=batch.finished_at[rows], status=batch.status[rows],
        numeric={k: v[rows] for k, v in batch.numeric.items()},
        finish_reason=[batch.finish_reason[i] for i in rows],
    )


def baseline_doc(b: Baseline) -> dict:
    return {"histograms": {k: h.counts.tolist() for k, h in b.histograms.items()},
            "samples": {k: v.tolist() for k, v in b.samples.items()}, "records": b.records, "source": b.source}


def baseline_from_doc(doc: dict) -> Baseline:
    hists: Windows = {}
    given = doc.get("histograms")
    if not isinstance(given, dict):
        raise BatchError("'histograms' must map feature names to bin counts")
    unknown = set(given) - set(FEATURES)
    if unknown:
        raise BatchError(f"unknown features: {', '.join(sorted(unknown))}; known: {', '.join(FEATURES)}",
                         field=sorted(unknown)[0])
    for name, feature in FEATURES.items():
        counts = given.get(name)
        size = feature.edges.bins if hasattr(feature, "edges") else len(feature.categories) + 1
        if counts is None:
            counts = [0] * size
        if (not isinstance(counts, list) or len(counts) != size
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)):
            raise BatchError(f"histogram '{name}' must be {size} non-negative integers", field=name)
        arr = np.array(counts, dtype=np.int64)
        hists[name] = Histogram(feature.edges, arr) if hasattr(feature, "edges") else CategoricalCounts(
            feature.categories, arr)
    samples = {k: np.array(v, dtype=float) for k, v in (doc.get("samples") or {}).items()}
    records = int(doc.get("records") or hists["status_class"].counts.sum() or
                  max(h.counts.sum() for h in hists.values()))
    return Baseline(hists, samples, records, doc.get("source") or {"kind": "upload"})
