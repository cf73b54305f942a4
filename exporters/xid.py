"""XID errors: a thread blocked on NVML's event set counts every XID as it happens.

Polling would miss an XID between two scrapes only if it read a gauge; events are queued
by the driver, so counting them as they arrive means an alert sees the very first one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from inferwatch.exporters.xid_catalog import action_of

log = logging.getLogger(__name__)


class XidWatcher:
    """``previous``: the watcher of an NVML session that was lost; its counts carry over, so
    re-initialising NVML does not reset ``inferwatch_gpu_xid_errors_total``."""

    def __init__(self, nvml: Any, handles: dict[int, Any], labels: dict[int, tuple[str, ...]],
                 clock: Callable[[], float] = time.time, wait_ms: int = 500, retry_wait_s: float = 1.0,
                 previous: XidWatcher | None = None) -> None:
        self.nvml = nvml
        self._handles = handles
        self._labels = labels
        self._clock = clock
        self._wait_ms = wait_ms
        self._retry_wait_s = retry_wait_s
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], int] = {}
        self._last: dict[tuple[str, ...], float] = {}
        self.version = 0  # bumps on every event, so cached expositions know they are stale
        if previous is not None:
            with previous._lock:
                self._counts, self._last = dict(previous._counts), dict(previous._last)
                self.version = previous.version + 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None

    def start(self) -> bool:
        nv = self.nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("XID events unavailable: %s", exc)
            return False
        registered = sum(self._register(index, handle) for index, handle in self._handles.items())
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
        self._thread.start()
        return registered > 0

    def _register(self, index: int, handle: Any) -> bool:
        nv = self.nvml
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
            return True
        except nv.NVMLError as exc:  # NotSupported on some GPUs / vGPU guests
            log.warning("GPU %s: XID events unavailable: %s", index, exc)
            return False

    def add(self, index: int, handle: Any, labels: tuple[str, ...]) -> None:
        """Count XIDs of a GPU discovered after start (it was lost then); no-op if known."""
        if index in self._handles or self._event_set is None:
            return
        self._handles[index] = handle
        with self._lock:
            self._labels[index] = labels
        self._register(index, handle)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 2)
        event_set, self._event_set = self._event_set, None  # stop() twice frees it once
        if event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(event_set)
            except self.nvml.NVMLError:
                pass

    def _run(self) -> None:
        """Wait for events until stopped. A failing wait is retried every ``retry_wait_s``
        and logged when it starts failing and when it works again, not every retry: NVML
        can be down for hours."""
        nv = self.nvml
        failing = False
        while not self._stop.is_set():
            try:
                event = nv.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except nv.NVMLError_Timeout:
                event = None
            except nv.NVMLError as exc:
                log.log(logging.DEBUG if failing else logging.WARNING, "waiting for XID events failed: %s", exc)
                failing = True
                self._stop.wait(self._retry_wait_s)
                continue
            if failing:
                log.info("waiting for XID events works again: XID counting resumed")
                failing = False
            if event is not None:
                self.record(event)

    def record(self, event: Any) -> None:
        try:
            index = self.nvml.nvmlDeviceGetIndex(event.device)
        except self.nvml.NVMLError:
            index = -1
        labels = self._labels.get(index, (str(index), "", "", ""))
        code = int(event.eventData)
        key = labels + (str(code),)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._last[labels] = self._clock()
            self.version += 1
        log.warning("GPU %s: XID %s (NVIDIA's action: %s)", index, code, action_of(code).title)

    def samples(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        with self._lock:
            return {
                "inferwatch_gpu_xid_errors": [(k, float(v)) for k, v in self._counts.items()],
                "inferwatch_gpu_last_xid_timestamp_seconds": list(self._last.items()),
            }
