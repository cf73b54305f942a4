"""The drift service's state: windows per segment, baselines, and the results they give.

No HTTP here: the service and the tests drive it with batches and clocks.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

import numpy as np
from typing_extensions import TypeIs

from inferwatch.drift.ab.ledger import LedgerKey, Ledgers, restore_ledger, snapshot
from inferwatch.drift.binning import OTHER, CategoricalCounts, Histogram
from inferwatch.drift.calibration import RESAMPLES
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.feedback import POSITIVE, FeedbackBatch
from inferwatch.drift.methods import METHODS, DriftResult, ks_exact, wasserstein_exact
from inferwatch.drift.schema import (
    CATEGORICAL_FEATURES,
    FEATURES,
    NUMERIC_FEATURES,
    UNITS,
    Batch,
    BatchError,
    parse_batch,
)
from inferwatch.drift.store import Store
from inferwatch.drift.verdicts import (
    CalibrationCache,
    Policy,
    Reference,
    SegmentVerdict,
    analysis_edges,
    reference_of,
    score,
)
from inferwatch.drift.windows import Segment, SegmentWindow, baseline_from, segments_of

log = logging.getLogger(__name__)
T = TypeVar("T")
Windows = dict[str, Histogram | CategoricalCounts]
BASELINE_SAMPLE = 5000
OTHER_SEGMENT: Segment = (OTHER, OTHER)  # where records of segments beyond the bound are counted
CATEGORICAL_NAMES = frozenset(c.name for c in CATEGORICAL_FEATURES)


@dataclass(frozen=True)
class WindowConfig:
    window_s: float = 3600.0
    buckets: int = 60
    reservoir: int = 2000  # raw values per numeric feature per window, for exact tests
    retention_s: float = 7 * 86400.0  # stored batches, for baselines frozen from past ranges
    thresholds: tuple[tuple[str, float], ...] = ()  # method -> fixed threshold (else calibrated)
    alpha: float = 0.01  # false-alarm rate of one evaluation, per method and per segment
    min_samples: int = 50  # fewer values in either window: insufficient_data, not a verdict
    resamples: int = RESAMPLES
    max_segments: int = 1000  # (model, variant) pairs kept; records of more go to OTHER_SEGMENT
    calibration_cache: int = 8192  # null distributions kept (about 48 KB each; 6 per segment and size band)
    calibration_queue: int = 4096  # calibrations waiting for the background worker
    history: int = 240  # verdicts kept per segment for the report (one per time bucket)
    ab_experiments: int = 32  # experiment ledgers kept
    ab_units: int = 100_000  # unit rows per experiment ledger (about 150 bytes each) before units are sampled


@dataclass(frozen=True)
class Baseline:
    histograms: Windows
    samples: dict[str, np.ndarray]
    records: int
    source: dict[str, Any]
    starts: dict[str, np.ndarray]  # per numeric feature: how the fine bins merge (quantiles)
    created_at: float = 0.0

    @cached_property
    def reference(self) -> Reference:
        """Keyed by content: calibrations depend on the counts alone, and a key that outlives
        its baseline (a calibration still running when the baseline is replaced) can never
        be taken for another baseline's."""
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(self.histograms):
            digest.update(name.encode())
            digest.update(self.histograms[name].counts.tobytes())
        return Reference(self.histograms, self.starts, f"baseline:{digest.hexdigest()}")


class HealthSnapshot(NamedTuple):
    """/health's numbers, replaced whole after each change so a reader never takes the lock
    (an ingest holding it must not hold /health)."""

    segments: int
    ingested: int
    overflow_records: int
    window_bytes: int


@dataclass(frozen=True)
class HistoryPoint:
    t: float
    status: str
    features: dict[str, tuple[float | None, float, bool]]  # headline score, its threshold, feature drifted


def headline(feature: str) -> str:
    """The method the report charts per feature over time: W1 in reference standard
    deviations for numbers (readable as "shifted by x sigma"), chi-square for categories."""
    return "chi2" if feature in CATEGORICAL_NAMES else "wasserstein"


class DriftState:
    def __init__(self, store: Store, config: WindowConfig, clock: Callable[[], float] = time.time,
                 calibrator: BackgroundCalibrator | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.windows: dict[Segment, SegmentWindow] = {}
        self.baselines: dict[Segment, Baseline] = {}
        self.alpha = config.alpha
        self.fixed: dict[str, float] = dict(config.thresholds)
        self.calibrator = calibrator or BackgroundCalibrator(CalibrationCache(config.calibration_cache),
                                                             config.calibration_queue)
        self.ingested = 0
        self.overflow = 0  # records folded into OTHER_SEGMENT
        self.expired = 0  # idle segments dropped
        self._results: dict[Segment, tuple[tuple[Any, ...], SegmentVerdict]] = {}
        self._history: dict[Segment, deque[HistoryPoint]] = {}
        self._last_sweep = -math.inf
        self.ledgers = Ledgers(config.ab_experiments, config.ab_units)
        self._ledgers_upto = (0, 0)  # the last batch and rating the ledgers include
        self._ledgers_gone: list[LedgerKey] = []  # expired since the last checkpoint
        self._lock = threading.RLock()
        self._bytes_at = -math.inf
        # what /health reads without the lock (one attribute read): counts as of the last change
        self.snapshot = HealthSnapshot(0, 0, 0, 0)

    @property
    def policy(self) -> Policy:
        return Policy(self.alpha, self.config.min_samples, self.config.resamples, tuple(sorted(self.fixed.items())))

    # -- ingest ---------------------------------------------------------------------------
    def ingest(self, body: bytes, key: str | None = None) -> tuple[int, int] | None:
        """Validate, persist, count. Returns (records accepted, records inside the window),
        or None for a batch stored already under ``key`` (its sender's earlier try got no
        answer back). Stored and added to the ledgers under the lock, so a ledger checkpoint
        includes exactly the batches up to its id."""
        now = self.clock()
        batch = parse_batch(body, now)
        with self._lock:  # received_at taken under the lock: a restart replays batches and ratings in this order
            batch_id = self.store.append(body, float(batch.finished_at.min()), float(batch.finished_at.max()),
                                         self.clock(), key)
            if batch_id is None:
                return None
            self.ledgers.add_batch(batch, now - self.config.retention_s)
            self._ledgers_upto = (batch_id, self._ledgers_upto[1])
            return batch.size, self._count(batch, now)

    def rate(self, batch: FeedbackBatch) -> tuple[int, int]:
        """Persist ratings and add those of experiments to their ledgers. Returns how many
        joined a ledger (a rating of an answer no experiment assigned joins none), and how
        many rated an answer rated before (kept out: each answer counts once)."""
        with self._lock:
            received_at = self.clock()
            ids = [r.response_id for r in batch.records if r.response_id is not None]
            first = self.store.first_ratings(ids, received_at) if ids else set()
            records = [r for r in batch.records if r.response_id is None or r.response_id in first]
            duplicates = len(batch.records) - len(records)
            if not records:
                return 0, duplicates
            batch = FeedbackBatch(records=records)
            rating_id = self.store.append_ratings(batch.model_dump_json().encode(), received_at)
            kept = self._add_ratings(batch)
            self._ledgers_upto = (self._ledgers_upto[0], rating_id)
        return kept, duplicates

    def _add_ratings(self, batch: FeedbackBatch) -> int:
        return sum(self.ledgers.add_rating(r.model, r.experiment, r.epoch, r.variant, r.unit, r.score >= POSITIVE,
                                           r.at)
                   for r in batch.records if r.experiment is not None and r.epoch is not None)

    def with_ledgers(self, read: Callable[[Ledgers], T]) -> T:
        """``read`` under the lock: it must copy what it keeps, and be quick."""
        with self._lock:
            return read(self.ledgers)

    def checkpoint_ledgers(self) -> int:
        """Write the ledgers that changed since the last checkpoint; returns how many."""
        with self._lock:
            changed = {key: ledger for key, ledger in self.ledgers.ledgers.items() if ledger.dirty}
            blobs = {key: snapshot(ledger) for key, ledger in changed.items()}
            for ledger in changed.values():
                ledger.dirty = False
            gone, self._ledgers_gone = self._ledgers_gone, []
            upto = self._ledgers_upto
        try:
            self.store.checkpoint_ledgers(blobs, gone, upto)
        except BaseException:
            with self._lock:
                for ledger in changed.values():
                    ledger.dirty = True
                self._ledgers_gone += gone
            raise
        return len(blobs)

    def _count(self, batch: Batch, now: float) -> int:
        inside = 0
        cfg = self.config
        with self._lock:
            self._sweep(now)
            held = self._held()  # once per batch: a batch of 10,000 new names used to recount per name
            for segment, rows in segments_of(batch).items():
                window = self.windows.get(segment)
                if window is None:
                    if segment not in self.baselines and held >= cfg.max_segments - 1:
                        self.overflow += rows.size
                        segment = OTHER_SEGMENT
                        window = self.windows.get(segment)
                    if window is None:
                        window = self.windows[segment] = SegmentWindow(cfg.window_s, cfg.buckets, cfg.reservoir)
                        held += segment != OTHER_SEGMENT and segment not in self.baselines
                inside += window.add(batch, rows, now)
            self.ingested += batch.size
            self._publish(now)
        return inside

    def _held(self) -> int:
        """Segments held, not counting OTHER_SEGMENT."""
        return len((self.windows.keys() | self.baselines.keys()) - {OTHER_SEGMENT})

    def _full(self) -> bool:
        """The last of max_segments is kept for OTHER_SEGMENT."""
        return self._held() >= self.config.max_segments - 1

    def _publish(self, now: float) -> None:
        """Refresh what /health shows (under the lock). Window bytes walk every bucket of every
        window, so they are recounted at most once a second."""
        if now - self._bytes_at >= 1.0:
            self._bytes_at = now
            window_bytes = sum(w.nbytes() for w in self.windows.values())
        else:
            window_bytes = self.snapshot.window_bytes
        self.snapshot = HealthSnapshot(len(self.windows.keys() | self.baselines.keys()), self.ingested,
                                       self.overflow, window_bytes)

    def _sweep(self, now: float) -> None:
        """Drop windows that hold nothing any more (at most once per time bucket), with their
        cached results and, for segments without a baseline, their history: their series go."""
        width = self.config.window_s / self.config.buckets
        if now - self._last_sweep < width:
            return
        self._last_sweep = now
        self._ledgers_gone += self.ledgers.expire(now - self.config.retention_s)
        for segment, window in list(self.windows.items()):
            window.expire(now)
            if not window.live:
                del self.windows[segment]
                self._results.pop(segment, None)
                if segment not in self.baselines:
                    self._history.pop(segment, None)
                self.expired += 1
        self._publish(now)

    def restore(self) -> int:
        """Rebuild windows and baselines from the store (after a restart or a crash)."""
        now = self.clock()
        self.store.prune(now - self.config.retention_s)
        for segment, doc in self.store.baselines().items():
            try:
                self.baselines[segment] = baseline_from_doc(doc)
            except BatchError as exc:  # stored on an older bin grid: freeze or upload it again
                log.error("baseline of %s/%s no longer fits the feature bins, skipped: %s", *segment, exc)
        blobs, upto = self.store.ledgers()
        for blob in blobs:
            try:
                ledger = restore_ledger(blob, self.config.ab_units)
            except (ValueError, KeyError, OSError) as exc:  # a checkpoint of another version: rebuilt from batches
                log.error("experiment ledger checkpoint unreadable, skipped: %s", exc)
                upto = (0, 0)
                continue
            self.ledgers.ledgers[(ledger.model, ledger.experiment)] = ledger
        if upto == (0, 0):
            self.ledgers.ledgers.clear()
        replayed, since = 0, now - self.config.window_s
        ratings = self.store.ratings_after(upto[1])  # replayed between the batches, as they came
        for batch_id, received_at, body in self.store.batches_for_restore(since, upto[0]):
            while ratings and batch_id > upto[0] and ratings[0][1] < received_at:
                rating_id, _, rated = ratings.pop(0)
                self._add_ratings(FeedbackBatch.model_validate_json(rated))
                upto = (upto[0], rating_id)
            try:
                batch = _stored(body)
            except BatchError as exc:  # only if the record contract changed between versions; never fatal
                log.error("skipping a stored batch that no longer validates: %s", exc)
                continue
            if batch_id > upto[0]:
                self.ledgers.add_batch(batch, now - self.config.retention_s)
            if batch.finished_at.max() >= since:
                self._count(batch, now)
                replayed += batch.size
            upto = (max(upto[0], batch_id), upto[1])
        for rating_id, _, rated in ratings:
            self._add_ratings(FeedbackBatch.model_validate_json(rated))
            upto = (upto[0], rating_id)
        self._ledgers_upto = upto
        saved = self.store.setting("thresholds", {})
        if isinstance(saved, dict):
            self.alpha = float(saved.get("alpha", self.alpha))
            fixed = saved.get("fixed", {k: v for k, v in saved.items() if k in METHODS})  # older format: flat
            self.fixed.update({k: float(v) for k, v in fixed.items() if k in METHODS})
        for segment, points in self.store.history().items():
            if segment in self.baselines:
                self._history[segment] = deque(
                    (HistoryPoint(t, p["status"], {k: tuple(v) for k, v in p["features"].items()}) for t, p in points),
                    maxlen=self.config.history)
        for segment in list(self.baselines):
            self.verdict(segment)  # queues the calibrations the current windows need
        return replayed

    def set_thresholds(self, changes: dict[str, object]) -> dict[str, Any]:
        """Change alpha, or give a method a fixed threshold (a number) or hand it back to
        calibration (null), at run time; persisted, so changes survive restarts. All or nothing."""
        if not changes:
            raise BatchError(f"give 'alpha' or a method's threshold ({', '.join(METHODS)})", field="alpha")
        for key, value in changes.items():
            if key == "alpha":
                if not _number(value) or not 0 < value <= 0.5:
                    raise BatchError("'alpha' must be a number in (0, 0.5]: the false-alarm rate per evaluation",
                                     field="alpha")
                if value < smallest_alpha(self.config.resamples):
                    raise BatchError(f"'alpha' {value:g} is below what {self.config.resamples} resamples can resolve "
                                     f"(1/{self.config.resamples + 1}); raise INFERWATCH_DRIFT_RESAMPLES or alpha",
                                     field="alpha")
                continue
            spec = METHODS.get(key)
            if spec is None:
                raise BatchError(f"unknown method '{key}'; known: alpha, {', '.join(METHODS)}", field=key)
            if value is None:
                continue
            if not _number(value) or value <= 0:
                raise BatchError(f"threshold for '{key}' must be a positive number, or null to calibrate it",
                                 field=key)
            if spec.kind == "p_value" and value >= 1:
                raise BatchError(f"'{key}' is a p-value test: its threshold must be below 1", field=key)
        with self._lock:
            for key, value in changes.items():
                if key == "alpha":
                    self.alpha = float(value)  # type: ignore[arg-type]  # checked a number above
                elif value is None:
                    self.fixed.pop(key, None)
                else:
                    self.fixed[key] = float(value)  # type: ignore[arg-type]  # checked a number above
            self._results.clear()
        self.store.put_setting("thresholds", {"alpha": self.alpha, "fixed": self.fixed})
        return self.thresholds()

    def thresholds(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "min_samples": self.config.min_samples, "resamples": self.config.resamples,
                "methods": {m: ({"mode": "fixed", "threshold": self.fixed[m]} if m in self.fixed else
                                {"mode": "alpha" if s.kind == "p_value" else "calibrated"})
                            for m, s in METHODS.items()}}

    # -- baselines ------------------------------------------------------------------------
    def freeze_baseline(self, segment: Segment, since: float, until: float) -> Baseline:
        self._admit(segment)
        batches = [_stored(body) for body in self.store.batches(since, until)]
        in_range = []
        for b in batches:
            keep = (b.finished_at >= since) & (b.finished_at <= until)
            in_range.append(_subset(b, np.flatnonzero(keep)))
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
        baseline = _baseline(hists, samples, records, {"kind": "range", "from": since, "to": until}, self.clock())
        self._put_baseline(segment, baseline)
        return baseline

    def upload_baseline(self, segment: Segment, histograms: dict[str, list[int]]) -> Baseline:
        self._admit(segment)
        doc = {"histograms": histograms, "samples": {}, "source": {"kind": "upload"}, "created_at": self.clock()}
        baseline = baseline_from_doc(doc)  # validates shapes and values
        self._put_baseline(segment, baseline)
        return baseline

    def _admit(self, segment: Segment) -> None:
        with self._lock:
            known = segment in self.windows or segment in self.baselines
            if not known and self._full():
                raise SegmentLimit(f"{len(self.segments())} segments are held, the limit "
                                   f"(INFERWATCH_DRIFT_MAX_SEGMENTS) is {self.config.max_segments}: raise it, or wait "
                                   f"for idle segments to expire ({self.config.window_s:g} s without records)")

    def _put_baseline(self, segment: Segment, baseline: Baseline) -> None:
        self.store.put_baseline(*segment, baseline_doc(baseline), self.clock())
        with self._lock:
            old = self.baselines.get(segment)
            if old is not None:
                self.calibrator.cache.forget(old.reference.key)
            self.baselines[segment] = baseline
            self._results.pop(segment, None)
            self._history.pop(segment, None)
            self.store.forget_history(*segment)
            self._publish(self.clock())
        self.verdict(segment)  # queues the calibrations the current window needs, computes nothing here

    # -- results --------------------------------------------------------------------------
    def segments(self) -> list[Segment]:
        """Every segment held; idle ones are swept here too, so they expire without new records."""
        with self._lock:
            self._sweep(self.clock())
            return sorted(set(self.windows) | set(self.baselines))

    def current(self, segment: Segment) -> Windows:
        now = self.clock()
        with self._lock:
            window = self.windows.get(segment)
            return window.histograms(now) if window else {}

    def verdict(self, segment: Segment) -> SegmentVerdict | None:
        """The segment's verdict against its baseline; None without a baseline or a window.
        Never calibrates on the caller's thread: a missing threshold is queued for the
        background worker and the verdict is ``calibrating`` until it is ready. Cached until
        the window, the baseline or the thresholds change (a calibrating one is not cached,
        so the next call picks up what the worker finished)."""
        now = self.clock()
        with self._lock:
            baseline, window = self.baselines.get(segment), self.windows.get(segment)
            if baseline is None or window is None:
                return None
            window.expire(now)
            key = (window.version, window.oldest(now), id(baseline), self.alpha, tuple(sorted(self.fixed.items())))
            cached = self._results.get(segment)
            if cached is not None and cached[0] == key:
                return cached[1]
            result = score(baseline.reference, window.histograms(now), self.policy, self.calibrator)
            if result.status != "calibrating":
                self._results[segment] = (key, result)
                self._remember(segment, now, result)
            return result

    def calibrated_verdict(self, segment: Segment, timeout_s: float = 120.0) -> SegmentVerdict | None:
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
        width = self.config.window_s / self.config.buckets
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
        a, b = self.current((model, variant_a)), self.current((model, variant_b))
        if not a or not b:
            return None
        with self._lock:
            version = self.windows[(model, variant_a)].version
        reference = reference_of(a, f"window:{model}:{variant_a}:{version}")
        return score(reference, b, self.policy, self.calibrator.cache)

    def exact(self, segment: Segment, feature: str) -> dict[str, Any]:
        """KS and Wasserstein on raw samples: the baseline's sample against the window's
        reservoir. ``wasserstein`` is W1 over the reference sample's standard deviation, the
        same quantity as in /v1/drift; ``w1`` is the raw distance in the feature's unit."""
        baseline = self.baselines.get(segment)
        with self._lock:
            window = self.windows.get(segment)
            current = window.samples(feature, self.clock()) if window else np.empty(0)
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

    def window_records(self, segment: Segment) -> int:
        with self._lock:
            window = self.windows.get(segment)
            return window.records(self.clock()) if window else 0

    def memory_bytes(self) -> int:
        """Bytes held by windows (counts and samples): what the segment bound limits."""
        with self._lock:
            return sum(w.nbytes() for w in self.windows.values())


class SegmentLimit(BatchError):
    """A new segment would exceed INFERWATCH_DRIFT_MAX_SEGMENTS."""


def smallest_alpha(resamples: int) -> float:
    """Below 1/(B + 1) no calibrated p-value can reach alpha: every calibrated threshold would
    be infinite, a verdict that can never fire."""
    return 1 / (resamples + 1)


def _number(value: object) -> TypeIs[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _stored(body: bytes) -> Batch:
    """A batch read back from the store. It was validated when it was acknowledged; the
    future-timestamp rule was relative to that moment and must not apply again."""
    return parse_batch(body, now=math.inf)


def _subset(batch: Batch, rows: np.ndarray) -> Batch:
    return Batch(
        size=rows.size, model=[batch.model[i] for i in rows], variant=[batch.variant[i] for i in rows],
        finished_at=batch.finished_at[rows], status=batch.status[rows],
        numeric={k: v[rows] for k, v in batch.numeric.items()},
        finish_reason=[batch.finish_reason[i] for i in rows], experiment=[batch.experiment[i] for i in rows],
        unit=[batch.unit[i] for i in rows], epoch=batch.epoch[rows], weight=batch.weight[rows],
        categorical={k: [v[i] for i in rows] for k, v in batch.categorical.items()},
    )


def _baseline(hists: Windows, samples: dict[str, np.ndarray], records: int, source: dict[str, Any],
              created_at: float, starts: dict[str, np.ndarray] | None = None) -> Baseline:
    plan = reference_of(hists, "").starts if starts is None else starts
    return Baseline(hists, samples, records, source, plan, created_at)


def baseline_doc(b: Baseline) -> dict[str, Any]:
    edges = {name: e.values.tolist() for name, e in analysis_edges(b.reference).items()}
    return {"histograms": {k: h.counts.tolist() for k, h in b.histograms.items()},
            "samples": {k: v.tolist() for k, v in b.samples.items()}, "records": b.records, "source": b.source,
            "edges": edges, "created_at": b.created_at}


MAX_COUNT = 10**12  # per bin; sums stay far inside int64


def baseline_from_doc(doc: dict[str, Any]) -> Baseline:
    """A baseline from its stored or uploaded form; every value checked, so a bad upload is a
    422 naming the feature, never an overflow later."""
    hists: Windows = {}
    given = doc.get("histograms")
    if not isinstance(given, dict) or not given:
        raise BatchError("'histograms' must map feature names to bin counts (GET /v1/features)", field="histograms")
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
                or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_COUNT for c in counts)):
            raise BatchError(f"histogram '{name}' must be {size} integers between 0 and {MAX_COUNT} "
                             f"(counts per bin of GET /v1/features)", field=name)
        arr = np.array(counts, dtype=np.int64)
        hists[name] = Histogram(feature.edges, arr) if hasattr(feature, "edges") else CategoricalCounts(
            feature.categories, arr)
    if not any(h.total for h in hists.values()):
        raise BatchError("'histograms' holds no counts: a baseline needs records", field="histograms")
    starts: dict[str, np.ndarray[Any, Any]] | None = None
    if isinstance(doc.get("edges"), dict):  # stored with the baseline: reuse exactly
        starts = {}
        for f in NUMERIC_FEATURES:
            values = np.asarray(doc["edges"].get(f.name, []), dtype=float)
            idx = np.searchsorted(f.edges.values, values)
            if values.size < 2 or idx.max() >= f.edges.values.size or not np.allclose(f.edges.values[idx], values):
                starts = None  # the grid changed since: recompute from the counts
                break
            starts[f.name] = idx[:-1].astype(np.int64)
    samples = {k: np.array(v, dtype=float) for k, v in (doc.get("samples") or {}).items()}
    records = int(doc.get("records") or hists["status_class"].counts.sum() or
                  max(h.counts.sum() for h in hists.values()))
    return _baseline(hists, samples, records, doc.get("source") or {"kind": "upload"},
                     float(doc.get("created_at") or 0.0), starts)
