"""Read NVML into an immutable snapshot; the collector serves snapshots, never NVML.

Error policy, per query, arguments and device:
- NotSupported (and NoPermission, or a driver without the function): the device cannot
  answer this query with these arguments. Remembered and never asked again, so the hot
  loop and the log stay quiet; the same query with other arguments (another NVLink error
  counter, clock type, ECC counter) is still asked, because NVML answers them separately.
- Anything else (GPU lost, unknown error, ...): the device failed this cycle. It is marked
  ``device_failed``, the failing query is counted, its other series are left out of this
  snapshot (each device's readings are collected apart and merged only when all of them
  were read), and every other GPU is exported as usual. The device is retried next cycle.
  It is logged when it fails and when it recovers, not every cycle: a GPU that stays lost
  for a day must not fill the log; the error counter says how long.
- A GPU that fails while being discovered (lost at start, or any NVML error from one of its
  discovery queries, GPM's support query included) is exported as failed under its index
  and discovered again every cycle; the healthy ones are sampled meanwhile.
- NVML itself lost (every GPU answers Uninitialized, DriverNotLoaded or the library/driver
  version mismatch of a driver upgraded underneath): the session is shut down and the
  exporter serves ``inferwatch_nvml_up 0`` until a retry re-initialises it. Every GPU
  answering GpuIsLost is not that: the GPUs failed (each keeps ``device_failed 1``, which
  pages), NVML did not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.exporters.gpm import GpmReader, gpm_supported
from inferwatch.exporters.metrics import COMPUTE_MODES, TEMPERATURE_THRESHOLDS, THROTTLE_REASONS

log = logging.getLogger(__name__)

Samples = dict[str, list[tuple[tuple[str, ...], float]]]
NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # NVML_NVLINK_ERROR_DL_*
KIB = 1024
LEGACY_CLOCK_EVENTS = 0x1FF  # reasons up to display_clock_setting; board_limit (0x200) and later are newer


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
    nvlinks: tuple[int, ...] = ()  # indices of the links NVML reports, up or down
    fields: tuple[Any, ...] = ()  # nvmlDeviceGetFieldValues ids, built once
    gpm: GpmReader | None = None


@dataclass(frozen=True)
class InFlight:
    """The NVML call the sampler is waiting on: a scrape reads it to name a GPU whose call
    hangs, while the sampler itself (stuck in that call) can say nothing."""

    labels: tuple[str, ...]
    query: str
    since: float  # time.monotonic()


class DeviceFailed(Exception):
    def __init__(self, query: str, error: Exception) -> None:
        super().__init__(f"{query}: {error}")
        self.query = query
        self.error = error


def _cannot_answer(nv: Any) -> tuple[type[Exception], ...]:
    """Errors that mean "this device cannot answer this query with these arguments"."""
    return (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission, nv.NVMLError_FunctionNotFound,
            nv.NVMLError_ArgumentVersionMismatch)


def _session_lost(nv: Any, error: Exception) -> bool:
    """An error that no GPU causes: the NVML session or the driver under it is gone."""
    return isinstance(error, (nv.NVMLError_Uninitialized, nv.NVMLError_DriverNotLoaded,
                              nv.NVMLError_LibRmVersionMismatch, nv.NVMLError_LibraryNotFound))


def _merge(into: Samples, rows: Samples) -> None:
    for name, values in rows.items():
        into.setdefault(name, []).extend(values)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lost_labels(index: int) -> tuple[str, str, str, str]:
    """A GPU NVML counts but could not identify: known by its index alone."""
    return (str(index), "", "", "")


def _took(dev: Device, started: float) -> Samples:
    return {"inferwatch_gpu_nvml_duration_seconds": [(dev.labels, time.perf_counter() - started)]}


def cuda_version(raw: int) -> str:
    """NVML's 12040 -> '12.4'."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class Sampler:
    """Owns the NVML session. Not thread-safe: one sampler thread calls ``sample``."""

    def __init__(self, nvml: Any, *, processes: bool = False, slow_interval_s: float = 10.0, gpm: bool = True,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.processes = processes
        self.gpm = gpm
        self.slow_interval_s = slow_interval_s
        self.clock = clock
        self.monotonic = monotonic  # GPM's sample spacing; a test passes the fake NVML's clock
        self.devices: list[Device] = []
        self.count = 0  # GPUs NVML reports, discovered or not
        self._lost: dict[int, str] = {}  # index -> the query that failed its discovery
        self.up = False
        self.reason = "not started"
        self.driver = self.cuda = ""
        self._unsupported: set[tuple[int, str, tuple[Any, ...]]] = set()
        self._errors: dict[tuple[str, ...], int] = {}
        self._failing: set[int] = set()  # devices whose last cycle failed: logged once, not every cycle
        self._seq = 0
        self._slow_at = float("-inf")
        self._slow: dict[int, Samples] = {}  # device index -> its last process list
        self.in_flight: InFlight | None = None  # set and read across threads: one reference, swapped whole

    def start(self, quiet: bool = False) -> bool:
        """Initialise NVML and discover GPUs; False (and the reason) if that fails.
        ``quiet`` logs a failure at debug level, for periodic retries."""
        nv = self.nvml
        if self.up:
            self.stop()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return self._unavailable(exc, quiet)
        try:
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
            self.cuda = cuda_version(nv.nvmlSystemGetCudaDriverVersion())
            self.count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._shutdown()  # nvmlInit counts references: one that succeeded needs its shutdown
            return self._unavailable(exc, quiet)
        self.devices, self._lost, self._slow, self._failing = [], {}, {}, set()
        self._unsupported.clear()  # a new session may be a new driver
        for index in range(self.count):
            self._try_discover(index)
        self.up = self.count > 0
        self.reason = "" if self.up else "NVML found no GPU"
        log.info("NVML driver %s (CUDA %s): %d GPU(s)", self.driver, self.cuda, self.count)
        if not self.up:  # retried like a missing driver: each retry's nvmlInit needs its shutdown
            self._shutdown()
        return self.up

    def _unavailable(self, exc: Exception, quiet: bool) -> bool:
        self.up, self.count = False, 0
        self.reason = f"NVML unavailable: {exc}"
        log.log(logging.DEBUG if quiet else logging.ERROR, "%s; serving inferwatch_nvml_up 0", self.reason)
        return False

    def stop(self) -> None:
        for dev in self.devices:
            if dev.gpm is not None:
                dev.gpm.free()
                dev.gpm = None
        if self.up:
            self._shutdown()
            self.up = False

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def _lose_session(self, error: Exception) -> None:
        """Every GPU answered with an error of the session, not of a GPU: release it (GPM
        buffers, the nvmlInit reference) so that a retry starts a fresh one."""
        log.error("NVML lost on every GPU (%s): serving inferwatch_nvml_up 0 and re-initialising it", error)
        self.stop()
        self.devices, self._lost, self._slow, self._failing = [], {}, {}, set()
        self.count = 0
        self.reason = f"NVML lost: {error}"

    def _try_discover(self, index: int) -> DeviceFailed | None:
        """Discover GPU ``index``; on failure remember it as lost (exported as failed) and
        return the failure."""
        try:
            dev = self._discover(index)
        except DeviceFailed as exc:
            if index not in self._lost:
                log.warning("GPU %d could not be discovered (%s); exporting the others and retrying it", index, exc)
            self._lost[index] = exc.query
            self._count_error(_lost_labels(index), exc.query)
            return exc
        if self._lost.pop(index, None) is not None:
            log.info("GPU %d (%s) discovered", index, dev.labels[1])
        self.devices = sorted([*self.devices, dev], key=lambda d: d.index)
        return None

    def _nvlinks(self, h: Any) -> tuple[int, ...]:
        """The GPU's NVLinks, by index (a disabled link is still a link, exported as down).
        Where the driver answers the link-count field, links 0 to count - 1; else every link
        index is probed, as DCGM does: numbering may have gaps (a part with links fused off),
        so a link NVML calls invalid or cannot answer for is skipped and the probe goes on. A
        GPU without NVLink answers so for every index: no links, no error. Any other error
        fails the discovery, as any discovery query does."""
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
            if count.nvmlReturn == nv.NVML_SUCCESS:
                return tuple(range(min(int(count.value.uiVal), nv.NVML_NVLINK_MAX_LINKS)))
        except _cannot_answer(nv):
            pass
        except nv.NVMLError as exc:
            raise DeviceFailed("nvmlDeviceGetFieldValues", exc) from None
        links = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                nv.nvmlDeviceGetNvLinkState(h, link)
            except (nv.NVMLError_InvalidArgument, *_cannot_answer(nv)):
                continue
            except nv.NVMLError as exc:
                raise DeviceFailed("nvmlDeviceGetNvLinkState", exc) from None
            links.append(link)
        return tuple(links)

    def _discover(self, index: int) -> Device:
        nv = self.nvml

        def call(query: str, *args: Any) -> Any:
            try:
                return getattr(nv, query)(*args)
            except nv.NVMLError as exc:
                raise DeviceFailed(query, exc) from None

        h = call("nvmlDeviceGetHandleByIndex", index)
        labels = (str(index), _text(call("nvmlDeviceGetUUID", h)), _text(call("nvmlDeviceGetName", h)),
                  _text(call("nvmlDeviceGetPciInfo", h).busId))
        links = self._nvlinks(h)
        fields: list[Any] = [nv.NVML_FI_DEV_MEMORY_TEMP]
        for link in links:
            fields += [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link), (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)]
        if links:
            fields.append(nv.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL)
        return Device(index, h, labels, links, tuple(fields), self._open_gpm(index, h) if self.gpm else None)

    def _open_gpm(self, index: int, handle: Any) -> GpmReader | None:
        """GPM where NVML says the GPU has it. An NVML error from the support query fails the
        discovery of this GPU (retried next cycle) like any other discovery query: it is the
        GPU's trouble, and must neither stop the exporter nor cost the GPU its GPM for good."""
        nv = self.nvml
        try:
            supported = gpm_supported(nv, handle)
        except nv.NVMLError as exc:
            raise DeviceFailed("nvmlGpmQueryDeviceSupport", exc) from None
        if not supported:
            return None
        try:
            return GpmReader(nv, handle, self.monotonic)
        except nv.NVMLError as exc:  # allocating sample buffers: memory, not the GPU
            log.warning("GPU %d: GPM unavailable: %s", index, exc)
            return None

    # -- one cycle ----------------------------------------------------------------------------
    def sample(self) -> Snapshot:
        started = time.perf_counter()
        samples: Samples = {}
        if self.up:
            self._sample_gpus(samples)
        if self.up:  # still: NVML may have been lost during this cycle
            samples["inferwatch_nvml_info"] = [((self.driver, self.cuda), 1.0)]
        if self.up or self._errors:  # a counter: kept across an NVML outage
            samples["inferwatch_gpu_collection_errors"] = [(k, float(v)) for k, v in self._errors.items()]
        samples["inferwatch_nvml_up"] = [((), 1.0 if self.up else 0.0)]
        samples["inferwatch_nvml_devices"] = [((), float(self.count))]
        self._seq += 1
        duration = time.perf_counter() - started
        samples["inferwatch_nvml_sampler_duration_seconds"] = [((), duration)]
        taken_at = self.clock()
        samples["inferwatch_nvml_snapshot_timestamp_seconds"] = [((), taken_at)]
        return Snapshot(self._seq, taken_at, duration, self.up, self.reason, self.driver, self.cuda, samples)

    def _sample_gpus(self, samples: Samples) -> None:
        """One cycle over every GPU into ``samples``; a failed GPU adds only its
        ``device_failed 1``. When every GPU failed with an error of the NVML session, the
        session is released instead (``up`` turns False) and ``samples`` stays empty."""
        slow_due = self.processes and time.monotonic() - self._slow_at >= self.slow_interval_s
        failed: Samples = {}
        failures: list[DeviceFailed] = []
        for index in sorted(self._lost):
            failure = self._try_discover(index)
            if failure is not None:
                failures.append(failure)
                failed.setdefault("inferwatch_gpu_device_failed", []).append((_lost_labels(index), 1.0))
        sampled: Samples = {}
        answered = 0
        for dev in self.devices:
            failure = self._sample_one(dev, slow_due, sampled)
            if failure is None:
                answered += 1
            else:
                failures.append(failure)
            sampled.setdefault("inferwatch_gpu_device_failed", []).append((dev.labels, 0.0 if failure is None else 1.0))
        if slow_due:
            self._slow_at = time.monotonic()
        if failures and not answered and all(_session_lost(self.nvml, f.error) for f in failures):
            self._lose_session(failures[0].error)
            return
        _merge(samples, failed)
        _merge(samples, sampled)

    def _sample_one(self, dev: Device, slow_due: bool, out: Samples) -> DeviceFailed | None:
        """Read ``dev`` into a scratch dict and merge it into ``out`` only if every query
        succeeded: a GPU that fails half-way exports none of its half-cycle."""
        readings: Samples = {}
        started = time.perf_counter()
        try:
            self._sample_device(dev, readings)
            if slow_due:
                processes: Samples = {}
                self._sample_processes(dev, processes)
                self._slow[dev.index] = processes
        except DeviceFailed as exc:
            self._count_error(dev.labels, exc.query)
            if dev.index not in self._failing:
                log.warning("GPU %s (%s) failed: %s; exporting the others and retrying it every cycle",
                            dev.index, dev.labels[1], exc)
                self._failing.add(dev.index)
            if dev.gpm is not None:
                dev.gpm.reset()  # its next sample does not close one interval
            _merge(out, _took(dev, started))
            return exc
        if dev.index in self._failing:
            self._failing.discard(dev.index)
            log.info("GPU %s (%s) recovered", dev.index, dev.labels[1])
        _merge(out, readings)
        _merge(out, self._slow.get(dev.index, {}))
        _merge(out, _took(dev, started))
        return None

    def _count_error(self, labels: tuple[str, ...], query: str) -> None:
        key = labels + (query,)
        self._errors[key] = self._errors.get(key, 0) + 1


    def _q(self, dev: Device, query: str, *args: Any) -> Any:
        """One NVML call for ``dev``; None when the device cannot answer it with these arguments."""
        key = (dev.index, query, args)
        if key in self._unsupported:
            return None
        nv = self.nvml
        self.in_flight = InFlight(dev.labels, query, time.monotonic())
        try:
            return getattr(nv, query)(dev.handle, *args)
        except _cannot_answer(nv):
            self._unsupported.add(key)
            return None
        except nv.NVMLError as exc:
            raise DeviceFailed(query, exc) from None
        finally:
            self.in_flight = None

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
        self._sample_gpm(dev, put)
        self._sample_memory(dev, put)
        put("inferwatch_gpu_temperature_celsius", q(dev, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU))
        values = q(dev, "nvmlDeviceGetFieldValues", dev.fields)
        if values is not None and values[0].nvmlReturn == nv.NVML_SUCCESS:
            put("inferwatch_gpu_memory_temperature_celsius", values[0].value.uiVal)
        self._sample_nvlinks(dev, values, put)
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
        self._sample_clock_events(dev, put)
        tx = q(dev, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES)
        put("inferwatch_gpu_pcie_tx_bytes_per_second", None if tx is None else tx * KIB)
        rx = q(dev, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES)
        put("inferwatch_gpu_pcie_rx_bytes_per_second", None if rx is None else rx * KIB)
        put("inferwatch_gpu_pcie_replays", q(dev, "nvmlDeviceGetPcieReplayCounter"))
        for suffix, query in (("generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
                              ("generation_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                              ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
                              ("width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            put(f"inferwatch_gpu_pcie_link_{suffix}", q(dev, query))
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
        self._sample_limits_and_modes(dev, put)
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

    def _sample_gpm(self, dev: Device, put: Callable[..., None]) -> None:
        if dev.gpm is None:
            return
        nv = self.nvml
        try:
            readings = dev.gpm.read()
        except _cannot_answer(nv) as exc:
            log.info("GPU %s: GPM unavailable (%s); not asked again", dev.index, exc)
            dev.gpm.free()
            dev.gpm = None
            return
        except nv.NVMLError as exc:
            raise DeviceFailed(dev.gpm.call, exc) from None
        for name, value in readings:
            put(name, value)

    def _sample_memory(self, dev: Device, put: Callable[..., None]) -> None:
        """The v2 API where the driver has it: it reports reserved memory apart, and v1's
        ``used`` includes it (so v1 on an idle GPU shows hundreds of MiB "used")."""
        mem = self._q(dev, "nvmlDeviceGetMemoryInfo", self.nvml.nvmlMemory_v2)
        if mem is not None:
            put("inferwatch_gpu_memory_reserved_bytes", mem.reserved)
        else:
            mem = self._q(dev, "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            put("inferwatch_gpu_memory_used_bytes", mem.used)
            put("inferwatch_gpu_memory_free_bytes", mem.free)
            put("inferwatch_gpu_memory_total_bytes", mem.total)

    def _sample_clock_events(self, dev: Device, put: Callable[..., None]) -> None:
        """One 0/1 series per reason the driver can report; a reason it cannot is unknown, so
        absent, not 0. Where the driver cannot say which it reports, the reasons NVML defined
        before 0x200 are exported and board_limit and reliability (recent drivers) are not."""
        reasons = self._q(dev, self._reasons_call("Current"))
        if reasons is None:
            return
        supported = self._q(dev, self._reasons_call("Supported"))
        if supported is None:
            supported = LEGACY_CLOCK_EVENTS
        for bit, reason in THROTTLE_REASONS.items():
            if supported & bit:
                put("inferwatch_gpu_throttle_active", 1 if reasons & bit else 0, reason)

    def _link_state(self, dev: Device, link: int) -> int | None:
        """A link's state; None for a link NVML cannot answer for or calls invalid (a gap in
        the numbering the count field did not show), remembered like NotSupported, never a
        failed GPU."""
        key = (dev.index, "nvmlDeviceGetNvLinkState", (link,))
        try:
            state: int | None = self._q(dev, "nvmlDeviceGetNvLinkState", link)
            return state
        except DeviceFailed as failed:
            if not isinstance(failed.error, self.nvml.NVMLError_InvalidArgument):
                raise
            self._unsupported.add(key)
            return None

    def _sample_nvlinks(self, dev: Device, values: Any, put: Callable[..., None]) -> None:
        """Link state as NVML reports it; throughput and error counters of links that are up.
        ``values`` (nvmlDeviceGetFieldValues: throughput, the ECC total) is None where the
        device cannot answer it: state and error counters come from their own calls."""
        nv = self.nvml
        for slot, link in enumerate(dev.nvlinks):
            state = self._link_state(dev, link)
            if state is None:
                continue
            up = state == nv.NVML_FEATURE_ENABLED
            put("inferwatch_gpu_nvlink_up", 1 if up else 0, str(link))
            if not up:
                continue
            if values is not None:
                tx, rx = values[1 + 2 * slot], values[2 + 2 * slot]
                if tx.nvmlReturn == nv.NVML_SUCCESS:
                    put("inferwatch_gpu_nvlink_tx_bytes", tx.value.ullVal * KIB, str(link))
                if rx.nvmlReturn == nv.NVML_SUCCESS:
                    put("inferwatch_gpu_nvlink_rx_bytes", rx.value.ullVal * KIB, str(link))
            for kind, counter in NVLINK_ERRORS.items():
                put("inferwatch_gpu_nvlink_errors", self._q(dev, "nvmlDeviceGetNvLinkErrorCounter", link, counter),
                    str(link), kind)
        if dev.nvlinks and values is not None and values[-1].nvmlReturn == nv.NVML_SUCCESS:
            put("inferwatch_gpu_nvlink_ecc_data_errors", values[-1].value.ullVal)

    def _sample_limits_and_modes(self, dev: Device, put: Callable[..., None]) -> None:
        nv, q = self.nvml, self._q
        default = q(dev, "nvmlDeviceGetPowerManagementDefaultLimit")
        put("inferwatch_gpu_power_limit_default_watts", None if default is None else default / 1000)
        bounds = q(dev, "nvmlDeviceGetPowerManagementLimitConstraints")
        if bounds is not None:
            put("inferwatch_gpu_power_limit_min_watts", bounds[0] / 1000)
            put("inferwatch_gpu_power_limit_max_watts", bounds[1] / 1000)
        for const, label in TEMPERATURE_THRESHOLDS.items():
            put("inferwatch_gpu_temperature_threshold_celsius",
                q(dev, "nvmlDeviceGetTemperatureThreshold", getattr(nv, const)), label)
        ecc = q(dev, "nvmlDeviceGetEccMode")
        if ecc is not None:
            put("inferwatch_gpu_ecc_enabled", 1 if ecc[0] == nv.NVML_FEATURE_ENABLED else 0)
            put("inferwatch_gpu_ecc_pending_enabled", 1 if ecc[1] == nv.NVML_FEATURE_ENABLED else 0)
        persistence = q(dev, "nvmlDeviceGetPersistenceMode")
        if persistence is not None:
            put("inferwatch_gpu_persistence_mode_enabled", 1 if persistence == nv.NVML_FEATURE_ENABLED else 0)
        mode = q(dev, "nvmlDeviceGetComputeMode")
        if mode is not None:
            put("inferwatch_gpu_compute_mode", 1, COMPUTE_MODES.get(mode, str(mode)))

    def _reasons_call(self, which: str) -> str:
        """``which`` is Current or Supported. Renamed in newer drivers' bindings; older
        nvidia-ml-py only has the throttle name."""
        name = f"nvmlDeviceGet{which}ClocksEventReasons"
        return name if hasattr(self.nvml, name) else name.replace("Event", "Throttle")

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
