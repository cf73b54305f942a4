"""Each segment's baseline: frozen from the stored records of a time range, or uploaded as
counts; stored, and restored on a restart. A new segment's baseline is taken only within
the segment bound (``Ingest.admit``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from inferwatch.drift.baseline import BASELINE_SAMPLE, Baseline, baseline_doc, baseline_from_doc, make_baseline, subset
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.schema import NUMERIC_FEATURES, BatchError, parse_stored
from inferwatch.drift.store import Store
from inferwatch.drift.windows import Segment, baseline_from, segments_of

log = logging.getLogger(__name__)


class Baselines:
    def __init__(self, store: Store, lock: threading.RLock, clock: Callable[[], float],
                 admit: Callable[[Segment], None], calibrator: BackgroundCalibrator) -> None:
        self.store, self.clock = store, clock
        self._lock = lock
        self._admit, self.calibrator = admit, calibrator
        self.held: dict[Segment, Baseline] = {}
        # under the lock, after a baseline is put: the segment's verdicts start over
        self.on_rebased: Callable[[Segment], None] = lambda segment: None
        # after the lock is let go: the segment's verdict queues what it needs calibrated
        self.on_put: Callable[[Segment], object] = lambda segment: None

    def freeze(self, segment: Segment, since: float, until: float) -> Baseline:
        self._admit(segment)
        batches = [parse_stored(body) for body in self.store.batches(since, until)]
        in_range = []
        for b in batches:
            keep = (b.finished_at >= since) & (b.finished_at <= until)
            in_range.append(subset(b, np.flatnonzero(keep)))
        hists = baseline_from(in_range, segment)
        records = int(hists["status_class"].counts.sum())
        if records == 0:
            raise BatchError(f"no records for model '{segment[0]}' variant '{segment[1]}' between 'from' {since} and "
                             f"'to' {until}", field="from")
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
        baseline = make_baseline(hists, samples, records, {"kind": "range", "from": since, "to": until}, self.clock())
        self._put(segment, baseline)
        return baseline

    def upload(self, segment: Segment, histograms: dict[str, list[int]]) -> Baseline:
        self._admit(segment)
        doc = {"histograms": histograms, "samples": {}, "source": {"kind": "upload"}, "created_at": self.clock()}
        baseline = baseline_from_doc(doc)  # validates shapes and values
        self._put(segment, baseline)
        return baseline

    def _put(self, segment: Segment, baseline: Baseline) -> None:
        self.store.put_baseline(*segment, baseline_doc(baseline), self.clock())
        with self._lock:
            old = self.held.get(segment)
            if old is not None:
                self.calibrator.cache.forget(old.reference.key)
            self.held[segment] = baseline
            self.on_rebased(segment)
        self.on_put(segment)  # queues the calibrations the current window needs, computes nothing here

    def restore(self) -> None:
        for segment, doc in self.store.baselines().items():
            try:
                self.held[segment] = baseline_from_doc(doc)
            except BatchError as exc:  # stored on an older bin grid: freeze or upload it again
                log.error("baseline of %s/%s no longer fits the feature bins, skipped: %s", *segment, exc)
