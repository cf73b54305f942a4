"""GPM (GPU Performance Monitoring, Hopper and later) for one GPU, by NVML's two-sample method.

A GPM sample is a snapshot of hardware counters; a metric is only defined between two
samples of the same GPU. Each sampler cycle takes one new sample and asks NVML for the
metrics between it and the previous cycle's, so every value is an average over one sampler
interval. NVML wants at least 100 ms between the two samples: with a shorter sampler
interval a new sample is taken only once 100 ms have passed, and the cycles in between
export the last values again. Two sample buffers and the request structure are allocated
once per GPU and reused, never reallocated in the hot loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from inferwatch.exporters.metrics import GPM_METRICS

log = logging.getLogger(__name__)
MIN_INTERVAL_S = 0.1  # NVML's shortest time between the two samples of a GPM metric


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """What ``nvmlGpmQueryDeviceSupport`` says; False with bindings or a driver without GPM,
    including a driver that does not know the bindings' version of the query's structure
    (ArgumentVersionMismatch, or InvalidArgument from drivers older than that code). Any
    other NVML error (GPU lost, unknown) is the GPU's and propagates to the caller."""
    if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
        return False
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NoPermission,
            nvml.NVMLError_ArgumentVersionMismatch, nvml.NVMLError_InvalidArgument) as exc:
        log.info("GPM not available through this driver: %s", exc)
        return False


class GpmReader:
    """Not thread-safe: owned by the sampler thread, like the rest of the NVML session."""

    def __init__(self, nvml: Any, handle: Any, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.handle = handle
        self._monotonic = monotonic
        # metric id -> (metric name, factor); ids come from the bindings, not retyped numbers
        self.metrics = {getattr(nvml, const): spec for const, spec in GPM_METRICS.items() if hasattr(nvml, const)}
        self._ids = list(self.metrics)
        self._previous = nvml.nvmlGpmSampleAlloc()
        try:
            self._current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:
            self._free(self._previous)
            raise
        self._have_previous = False
        self._previous_at = 0.0
        self._last: list[tuple[str, float]] = []
        self.call = ""  # the NVML call in progress, for error counts
        self._request = nvml.c_nvmlGpmMetricsGet_t()
        self._request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(self._ids)
        for slot, metric_id in enumerate(self._ids):
            self._request.metrics[slot].metricId = metric_id

    def read(self) -> list[tuple[str, float]]:
        """Take a sample; the metrics since the previous one ([] on the first call and after
        ``reset``); the last metrics again, without asking NVML, while the previous sample is
        younger than ``MIN_INTERVAL_S``. NVMLError propagates: the caller decides whether
        the device failed."""
        nv = self.nvml
        now = self._monotonic()
        if self._have_previous and now - self._previous_at < MIN_INTERVAL_S:
            return self._last
        self.call = "nvmlGpmSampleGet"
        nv.nvmlGpmSampleGet(self.handle, self._current)
        self._previous_at = now
        if not self._have_previous:
            self._swap()
            return []
        request = self._request
        request.sample1, request.sample2 = self._previous, self._current
        self.call = "nvmlGpmMetricsGet"
        nv.nvmlGpmMetricsGet(request)
        self._swap()
        out = []
        for slot, metric_id in enumerate(self._ids):
            metric = request.metrics[slot]
            if metric.nvmlReturn == nv.NVML_SUCCESS:  # per metric: NVLink rates on a PCIe card are NotSupported
                name, factor = self.metrics[metric_id]
                out.append((name, metric.value * factor))
        self._last = out
        return out

    def _swap(self) -> None:
        self._previous, self._current = self._current, self._previous
        self._have_previous = True

    def reset(self) -> None:
        """Forget the previous sample (the device failed in between: the interval is not one)."""
        self._have_previous = False
        self._last = []

    def free(self) -> None:
        for sample in (self._previous, self._current):
            self._free(sample)

    def _free(self, sample: Any) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except self.nvml.NVMLError as exc:
            log.debug("freeing a GPM sample: %s", exc)
