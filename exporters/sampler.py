"""Read NVML into an immutable snapshot; the collector serves snapshots, never NVML.

Error policy, per query and device:
- NotSupported (and NoPermission): the device cannot answer this query. Remembered and
  never asked again, so the hot loop and the log stay quiet.
- Anything else (GPU lost, unknown error, ...): the device failed this cycle. It is marked
  ``device_failed``, the failing query is counted, its other series are left out of this
  snapshot, and every other GPU is exported as usual. The device is retried next cycle.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exporters.metrics import THROTTLE_REASONS

log = logging.getLogger(__name__)

Samples = dict[str, list[tuple[tuple[str, ...], float]]]
NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # NVML_NVLINK_ERROR_DL_*
KIB = 1024


@dataclass(frozen=True)
class Snapshot:
    seq: int
    taken_at: float  # unix seconds
    duration_s: float
    up: bool
    reason: str  # why up is 0
    driver: str = ""
    cuda: str = ""
    samples: Samples = field(default_factory=dict)


@dataclass
class Device:
    index: int
    handle: Any
    labels: tuple[str, str, str, str]  # GPU_LABELS values
    nvlinks: int = 0


class DeviceFailed(Exception):
    def __init__(self, query: str, error: Exception) -> None:
        super().__init__(f"{query}: {error}")
        self.query = query


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version(raw: int) -> str:
    """NVML's 12040 -> '12.4'."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class Sampler:
    """Owns the NVML session. Not thread-safe: one sampler thread calls ``sample``."""

    def __init__(self, nvml: Any, *, processes: bool = False, slow_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.nvml = nvml
        self.processes = processes
        self.slow_interval_s = slow_interval_s
        self.clock = clock
        self.devices: list[Device] = []
        self.up = False
        self.reason = "not started"
        self.driver = self.cuda = ""
        self._unsupported: set[tuple[int, str]] = set()
        self._errors: dict[tuple[str, ...], int] = {}
        self._seq = 0
        self._slow_at = float("-inf")
        self._slow: Samples = {}

    def start(self, quiet: bool = False) -> bool:
        """Initialise NVML and discover GPUs; False (and the reason) if that fails.
        ``quiet`` logs a failure at debug level, for periodic retries."""
        nv = self.nvml
        try:
            nv.nvmlInit()
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
            self.cuda = cuda_version(nv.nvmlSystemGetCudaDriverVersion())
            self.devices = [self._discover(i) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            self.reason = f"NVML unavailable: {exc}"
            log.log(logging.DEBUG if quiet else logging.ERROR, "%s; serving inferwatch_nvml_up 0", self.reason)
            return False
        self.up = bool(self.devices)
        self.reason = "" if self.up else "NVML found no GPU"
        log.info("NVML driver %s (CUDA %s): %d GPU(s)", self.driver, self.cuda, len(self.devices))
        return self.up

    def stop(self) -> None:
        if self.up:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.up = False

    def _discover(self, index: int) -> Device:
        nv = self.nvml
        h = nv.nvmlDeviceGetHandleByIndex(index)
        labels = (str(index), _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h)),
                  _text(nv.nvmlDeviceGetPciInfo(h).busId))
        links = 0
        try:
            while links < nv.NVML_NVLINK_MAX_LINKS and nv.nvmlDeviceGetNvLinkState(h, links) is not None:
                links += 1
        except nv.NVMLError:
            pass  # NotSupported: no NVLink; InvalidArgument: past the last link
        return Device(index, h, labels, links)

    # -- one cycle ----------------------------------------------------------------------------
    def sample(self) -> Snapshot:
        started = time.perf_counter()
        samples: Samples = {}
        if self.up:
            slow_due = self.processes and time.monotonic() - self._slow_at >= self.slow_interval_s
            slow: Samples = {} if slow_due else self._slow
            for dev in self.devices:
                failed = 0.0
                try:
                    self._sample_device(dev, samples)
                    if slow_due:
                        self._sample_processes(dev, slow)
                except DeviceFailed as exc:
                    failed = 1.0
                    key = dev.labels + (exc.query,)
                    self._errors[key] = self._errors.get(key, 0) + 1
                    log.warning("GPU %s (%s): %s", dev.index, dev.labels[1], exc)
                samples.setdefault("inferwatch_gpu_device_failed", []).append((dev.labels, failed))
            if slow_due:
                self._slow, self._slow_at = slow, time.monotonic()
            for name, rows in self._slow.items():
                samples.setdefault(name, []).extend(rows)
            samples["inferwatch_gpu_collection_errors"] = [(k, float(v)) for k, v in self._errors.items()]
            samples["inferwatch_nvml_info"] = [((self.driver, self.cuda), 1.0)]
        samples["inferwatch_nvml_up"] = [((), 1.0 if self.up else 0.0)]
        samples["inferwatch_nvml_devices"] = [((), float(len(self.devices)))]
        self._seq += 1
        duration = time.perf_counter() - started
        samples["inferwatch_nvml_sampler_duration_seconds"] = [((), duration)]
        taken_at = self.clock()
        samples["inferwatch_nvml_snapshot_timestamp_seconds"] = [((), taken_at)]
        return Snapshot(self._seq, taken_at, duration, self.up, self.reason, self.driver, self.cuda, samples)

    def _q(self, dev: Device, query: str, *args: Any) -> Any:
        """One NVML call for ``dev``; None when the device cannot answer it."""
        if (dev.index, query) in self._unsupported:
            return None
        nv = self.nvml
        try:
            return getattr(nv, query)(dev.handle, *args)
        except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission):
            self._unsupported.add((dev.index, query))
            return None
        except nv.NVMLError as exc:
            raise DeviceFailed(query, exc) from None

    def _sample_device(self, dev: Device, out: Samples) -> None:
        nv, q, L = self.nvml, self._q, dev.labels

        def put(name: str, value: float | None, *extra: str) -> None:
            if value is not None:
                out.setdefault(name, []).append((L + extra, float(value)))

        put("inferwatch_gpu_info", 1)
        util = q(dev, "nvmlDeviceGetUtilizationRates")
        if util is not None:
            put("inferwatch_gpu_utilization_ratio", util.gpu / 100)
            put("inferwatch_gpu_memory_utilization_ratio", util.memory / 100)
        mem = q(dev, "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            put("inferwatch_gpu_memory_used_bytes", mem.used)
            put("inferwatch_gpu_memory_free_bytes", mem.free)
            put("inferwatch_gpu_memory_total_bytes", mem.total)
        put("inferwatch_gpu_temperature_celsius", q(dev, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU))
        fields = [nv.NVML_FI_DEV_MEMORY_TEMP]
        for link in range(dev.nvlinks):
            fields += [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link), (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)]
        values = q(dev, "nvmlDeviceGetFieldValues", fields)
        if values is not None:
            if values[0].nvmlReturn == nv.NVML_SUCCESS:
                put("inferwatch_gpu_memory_temperature_celsius", values[0].value.uiVal)
            for link in range(dev.nvlinks):
                tx, rx = values[1 + 2 * link], values[2 + 2 * link]
                put("inferwatch_gpu_nvlink_up", 1, str(link))
                if tx.nvmlReturn == nv.NVML_SUCCESS:
                    put("inferwatch_gpu_nvlink_tx_bytes", tx.value.ullVal * KIB, str(link))
                if rx.nvmlReturn == nv.NVML_SUCCESS:
                    put("inferwatch_gpu_nvlink_rx_bytes", rx.value.ullVal * KIB, str(link))
        power = q(dev, "nvmlDeviceGetPowerUsage")
        put("inferwatch_gpu_power_watts", None if power is None else power / 1000)
        limit = q(dev, "nvmlDeviceGetEnforcedPowerLimit")
        put("inferwatch_gpu_power_limit_watts", None if limit is None else limit / 1000)
        energy = q(dev, "nvmlDeviceGetTotalEnergyConsumption")
        put("inferwatch_gpu_energy_joules", None if energy is None else energy / 1000)
        for name, clock in (("sm", nv.NVML_CLOCK_SM), ("memory", nv.NVML_CLOCK_MEM)):
            cur = q(dev, "nvmlDeviceGetClockInfo", clock)
            put(f"inferwatch_gpu_{name}_clock_hertz", None if cur is None else cur * 1e6)
            top = q(dev, "nvmlDeviceGetMaxClockInfo", clock)
            put(f"inferwatch_gpu_{name}_clock_max_hertz", None if top is None else top * 1e6)
        put("inferwatch_gpu_performance_state", q(dev, "nvmlDeviceGetPerformanceState"))
        reasons = q(dev, self._reasons_call)
        if reasons is not None:
            for bit, reason in THROTTLE_REASONS.items():
                put("inferwatch_gpu_throttle_active", 1 if reasons & bit else 0, reason)
        tx = q(dev, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES)
        put("inferwatch_gpu_pcie_tx_bytes_per_second", None if tx is None else tx * KIB)
        rx = q(dev, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES)
        put("inferwatch_gpu_pcie_rx_bytes_per_second", None if rx is None else rx * KIB)
        put("inferwatch_gpu_pcie_replays", q(dev, "nvmlDeviceGetPcieReplayCounter"))
        for link in range(dev.nvlinks):
            for kind, counter in NVLINK_ERRORS.items():
                put("inferwatch_gpu_nvlink_errors", q(dev, "nvmlDeviceGetNvLinkErrorCounter", link, counter),
                    str(link), kind)
        for etype, ename in ((nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                             (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
            for ctype, cname in ((nv.NVML_VOLATILE_ECC, "volatile"), (nv.NVML_AGGREGATE_ECC, "aggregate")):
                put("inferwatch_gpu_ecc_errors", q(dev, "nvmlDeviceGetTotalEccErrors", etype, ctype), ename, cname)
        for cause, cname in ((nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "multiple_single_bit"),
                             (nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "double_bit")):
            pages = q(dev, "nvmlDeviceGetRetiredPages", cause)
            put("inferwatch_gpu_retired_pages", None if pages is None else len(pages), cname)
        put("inferwatch_gpu_retired_pages_pending", q(dev, "nvmlDeviceGetRetiredPagesPendingStatus"))
        rows = q(dev, "nvmlDeviceGetRemappedRows")
        if rows is not None:
            put("inferwatch_gpu_remapped_rows", rows[0], "correctable")
            put("inferwatch_gpu_remapped_rows", rows[1], "uncorrectable")
            put("inferwatch_gpu_row_remap_pending", 1 if rows[2] else 0)
            put("inferwatch_gpu_row_remap_failure", 1 if rows[3] else 0)
        fan = q(dev, "nvmlDeviceGetFanSpeed")
        put("inferwatch_gpu_fan_speed_ratio", None if fan is None else fan / 100)
        enc = q(dev, "nvmlDeviceGetEncoderUtilization")
        put("inferwatch_gpu_encoder_utilization_ratio", None if enc is None else enc[0] / 100)
        dec = q(dev, "nvmlDeviceGetDecoderUtilization")
        put("inferwatch_gpu_decoder_utilization_ratio", None if dec is None else dec[0] / 100)
        mig = q(dev, "nvmlDeviceGetMigMode")
        if mig is not None:
            enabled = mig[0] == nv.NVML_DEVICE_MIG_ENABLE
            put("inferwatch_gpu_mig_enabled", 1 if enabled else 0)
            if enabled:
                self._sample_mig(dev, put)

    @property
    def _reasons_call(self) -> str:
        # renamed in newer drivers' bindings; older nvidia-ml-py only has the throttle name
        if hasattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
            return "nvmlDeviceGetCurrentClocksEventReasons"
        return "nvmlDeviceGetCurrentClocksThrottleReasons"

    def _sample_mig(self, dev: Device, put: Callable[..., None]) -> None:
        nv = self.nvml
        for slot in range(self._q(dev, "nvmlDeviceGetMaxMigDeviceCount") or 0):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
            except nv.NVMLError_NotFound:
                continue
            except nv.NVMLError as exc:
                raise DeviceFailed("nvmlDeviceGetMigDeviceHandleByIndex", exc) from None
            try:
                ids = (str(nv.nvmlDeviceGetGpuInstanceId(mh)), str(nv.nvmlDeviceGetComputeInstanceId(mh)),
                       _text(nv.nvmlDeviceGetUUID(mh)))
                mem = nv.nvmlDeviceGetMemoryInfo(mh)
            except nv.NVMLError as exc:
                raise DeviceFailed("mig_device", exc) from None
            put("inferwatch_gpu_mig_memory_used_bytes", mem.used, *ids)
            put("inferwatch_gpu_mig_memory_total_bytes", mem.total, *ids)

    def _sample_processes(self, dev: Device, out: Samples) -> None:
        procs = self._q(dev, "nvmlDeviceGetComputeRunningProcesses")
        for p in procs or ():
            if p.usedGpuMemory is None:  # not visible from this container / without privileges
                continue
            out.setdefault("inferwatch_gpu_process_memory_used_bytes", []).append(
                (dev.labels + (str(p.pid), process_name(p.pid)), float(p.usedGpuMemory)))


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "unknown"
    except OSError:
        return "unknown"
