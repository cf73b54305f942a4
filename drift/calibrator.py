"""Calibration off the request path: a background worker fills the calibration cache.

Calibrating one baseline feature at one window size costs tens of milliseconds (1,999
resampled windows). Done inside a request, 200 baselines meeting a new size band held the
first ``/metrics`` scrape for 35 s, past Prometheus's 10 s scrape timeout. Here a request
only looks the null distribution up; on a miss it queues the work and scoring says
``calibrating`` for that feature until the worker is done. A hit also queues the next size
band up while the cache has room, so a growing window usually finds its next threshold ready.

The queue is bounded: work asked for while it is full is refused (counted) and asked for
again at the next evaluation that still misses, so a flood costs waiting, not memory. One
worker thread runs while there is work and ends when the queue is empty.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from inferwatch.drift.calibration import NullDistribution, next_band, size_band
from inferwatch.drift.verdicts import CacheKey, CalibrationCache, Reference, calibrate

log = logging.getLogger(__name__)
Compute = Callable[[Reference, str, int, int], NullDistribution]  # reference, feature, band, resamples


class BackgroundCalibrator:
    """A ``NullSource`` that never computes on the caller's thread."""

    def __init__(self, cache: CalibrationCache, queue_size: int = 4096, compute: Compute = calibrate) -> None:
        self.cache = cache
        self.queue_size = queue_size
        self._compute = compute
        self._queue: deque[tuple[CacheKey, Reference]] = deque()
        self._pending: set[CacheKey] = set()  # queued or being computed
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self.calibrated = 0  # null distributions computed
        self.refused = 0  # asked for while the queue was full
        self.failed = 0

    def get(self, reference: Reference, feature: str, n_cur: int, resamples: int) -> NullDistribution | None:
        band = size_band(n_cur)
        null = self.cache.peek(self.cache.key(reference, feature, band, resamples))
        if null is None:
            self.request(reference, feature, band, resamples)
        elif self.cache.has_room():
            self.request(reference, feature, next_band(band), resamples)
        return null

    def request(self, reference: Reference, feature: str, band: int, resamples: int) -> None:
        """Queue a calibration unless it is cached, queued or running, or the queue is full."""
        key = self.cache.key(reference, feature, band, resamples)
        with self._lock:
            if key in self._pending or self.cache.peek(key) is not None:
                return
            if len(self._queue) >= self.queue_size:
                self.refused += 1
                return
            self._pending.add(key)
            self._queue.append((key, reference))
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="drift-calibration", daemon=True)
                self._worker.start()

    @property
    def pending(self) -> int:
        """Calibrations queued or running."""
        with self._lock:
            return len(self._pending)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or running (tests, benchmarks, one-shot reports);
        False if ``timeout`` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    self._idle.notify_all()
                    return
                key, reference = self._queue.popleft()
            _, feature, band, resamples = key
            try:
                self.cache.put(key, self._compute(reference, feature, band, resamples))
                self.calibrated += 1
            except Exception:  # the worker must outlive any one calibration; asked for again next evaluation
                self.failed += 1
                log.exception("calibrating %s at n=%d failed", feature, band)
            finally:
                with self._lock:
                    self._pending.discard(key)
