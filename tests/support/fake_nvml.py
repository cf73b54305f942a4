"""A stand-in for nvidia-ml-py (``pynvml``) on machines without a GPU.

It implements the subset of pynvml's API that the exporter calls, with the same names,
parameter names, constants and return shapes, and raises pynvml's own error classes
(``pynvml.NVMLError(code)``, which maps a code to a subclass such as
``NVMLError_NotSupported``), so the exporter cannot tell it from the real module. Like NVML,
``nvmlInit`` and ``nvmlShutdown`` are reference counted: every successful init needs a
shutdown, and a test can see one that leaked. Readings are configured per device; errors can be injected per call and
device (or per call and arguments, as NVML answers NotSupported for one NVLink counter or one
clock type while answering the others); XID events can be emitted and are delivered through
``nvmlEventSetWait_v2``. GPM (Hopper profiling) follows NVML's two-sample method: a sample
records cumulative activity at the moment it is taken, and ``nvmlGpmMetricsGet`` returns the
average rate between two samples of the same GPU, so a caller that swaps or reuses samples
gets an error, not a plausible number.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as _pynvml
from pynvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
)

# -- errors: nvidia-ml-py's own ------------------------------------------------------------
# The exporter must meet the very classes it meets on a GPU host: pynvml's NVMLError, whose
# constructor maps a code to its subclass through pynvml's own table (NVMLError(15) is an
# NVMLError_GpuIsLost), for every code the bindings know, so a test can inject any of them.
# Importing pynvml needs no driver: it loads libnvidia-ml only in nvmlInit.
ERROR_NAMES = tuple(name for name in dir(_pynvml) if name.startswith(("NVML_ERROR_", "NVMLError_")))
globals().update({name: getattr(_pynvml, name) for name in ERROR_NAMES})
NVML_SUCCESS = 0

# -- constants (values as in pynvml, checked against it by tests) --------------------------
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL = 160
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x0000000000000008

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100


# -- configuration -------------------------------------------------------------------------
@dataclass
class FakeMig:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    memory_total: int
    memory_used: int


@dataclass
class FakeProcess:
    pid: int
    used_memory: int | None


@dataclass
class FakeDevice:
    """One GPU's readings, in NVML's units (mW, mJ, MHz, KB/s, %)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:01:00.0"
    gpu_util: int = 50
    mem_util: int = 20
    memory_total: int = 80 * 1024**3
    memory_used: int = 10 * 1024**3  # as the v2 API counts it: reserved memory apart
    memory_reserved: int | None = 512 * 1024**2  # None: a driver without nvmlDeviceGetMemoryInfo_v2
    temperature: int = 60
    memory_temperature: int | None = 70
    power_mw: int = 300_000
    power_limit_mw: int = 700_000
    power_default_limit_mw: int = 700_000
    power_limit_constraints_mw: tuple[int, int] = (200_000, 700_000)
    temperature_thresholds: dict[int, int] = field(default_factory=lambda: {0: 92, 1: 89, 2: 95, 3: 87})
    energy_mj: int = 123_456_789
    sm_clock: int = 1980
    mem_clock: int = 2619
    sm_clock_max: int = 1980
    mem_clock_max: int = 2619
    pstate: int = 0
    throttle_reasons: int = 0
    supported_clock_reasons: int = 0x7FF  # the reasons this driver and GPU can report
    pcie_tx_kbps: int = 1000
    pcie_rx_kbps: int = 2000
    pcie_replays: int = 0
    pcie_link: tuple[int, int, int, int] = (5, 5, 16, 16)  # generation, max generation, width, max width
    ecc_mode: tuple[int, int] = (1, 1)  # current, pending
    persistence_mode: int = 1
    compute_mode: int = 0
    nvlink_links: int = 0  # links present; each link reads the values below
    nvlink_count_field: bool = True  # False: a driver that answers NotSupported for the link-count field
    nvlink_disabled: set[int] = field(default_factory=set)  # links present but down
    nvlink_gaps: set[int] = field(default_factory=set)  # indices below nvlink_links that NVML calls invalid
    nvlink_ecc_data_errors: int = 0  # over all links
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    nvlink_errors: dict[int, int] = field(default_factory=dict)  # NVML_NVLINK_ERROR_* -> count
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> count
    retired_pages: dict[int, list[int]] = field(default_factory=dict)  # cause -> page addresses
    retired_pending: int = 0
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    fan_speed: int | None = None  # None: NotSupported (passively cooled data-center GPUs)
    encoder_util: int = 0
    decoder_util: int = 0
    mig: list[FakeMig] | None = None  # None: MIG not supported; [] supported but off
    processes: list[FakeProcess] = field(default_factory=list)
    gpm: dict[int, float] | None = None  # NVML_GPM_METRIC_* -> % or MiB/s; None: not a GPM GPU (pre-Hopper)
    # call names answering NotSupported, or (call name, *arguments) for one argument combination
    unsupported: set[str | tuple] = field(default_factory=set)


@dataclass(eq=False)
class _GpmSample:
    """What NVML keeps behind a sample handle: the counters at the moment it was taken."""

    buffer: ctypes.Array  # the memory the handle points at, kept alive while allocated
    index: int | None = None
    taken_at: float = 0.0
    cumulative: dict[int, float] = field(default_factory=dict)
    freed: bool = False


def _address(handle: object) -> int | None:
    """A sample handle (pynvml's ``c_nvmlGpmSample_t``, a pointer) as the address it holds."""
    if not isinstance(handle, _pynvml.c_nvmlGpmSample_t):
        return None
    return ctypes.cast(handle, ctypes.c_void_p).value


class FakeNVML:
    """An object that quacks like the ``pynvml`` module.

    ``fail(call, index, code, times)`` makes ``call`` raise ``NVMLError(code)`` for device
    ``index`` (None: every device, or the system call) ``times`` times (None: until cleared).
    ``call`` "*" fails every call but ``nvmlShutdown`` (the driver unloaded or every GPU fell
    off the bus: NVML answers everything with the same error).
    ``library_missing=True`` makes ``nvmlInit`` raise LibraryNotFound, as on a host without
    a driver.
    ``delay(call, index, seconds)`` makes ``call`` answer ``seconds`` late for device ``index``;
    ``hang(call, index)`` makes it block until the returned event is set, as a call into a
    failing GPU's driver does.
    """

    def __init__(self, devices: list[FakeDevice], driver: str = "550.54.15", cuda: int = 12040,
                 library_missing: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.devices = devices
        self.driver = driver
        self.cuda = cuda
        self.library_missing = library_missing
        self.inits = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self.calls = 0
        self._faults: dict[tuple[str, int | None], list[int | None]] = {}
        self._delays: dict[tuple[str, int | None], float | threading.Event] = {}
        self._events: deque[SimpleNamespace] = deque()
        self._event_cond = threading.Condition()
        self._registered: set[int] = set()
        self._lock = threading.Lock()
        self._clock = clock
        self._gpm_activity: dict[int, tuple[float, dict[int, float]]] = {}  # index -> (time, cumulative)
        self._energy_read_at: dict[int, float] = {}  # index -> the clock at the last energy read
        self._gpm_samples: dict[int | None, _GpmSample] = {}  # handle address -> sample
        for name, value in globals().items():  # constants and error classes, as module attributes
            if name.isupper() or name.startswith(("NVMLError", "nvmlEventType", "nvmlClocksEventReason", "NVML_",
                                                  "nvmlMemory")):
                setattr(self, name, value)

    # GPM goes through nvidia-ml-py's own ctypes structures, as the real module: the request
    # and its metric slots are pynvml's, and sample handles are pointers of pynvml's type.
    c_nvmlGpmMetricsGet_t = _pynvml.c_nvmlGpmMetricsGet_t

    # -- test controls -------------------------------------------------------------------
    def fail(self, call: str, index: int | None, code: int, times: int | None = None) -> None:
        with self._lock:
            self._faults[(call, index)] = [code, times]

    def clear(self, call: str, index: int | None) -> None:
        with self._lock:
            self._faults.pop((call, index), None)
            self._delays.pop((call, index), None)

    def delay(self, call: str, index: int | None, seconds: float) -> None:
        with self._lock:
            self._delays[(call, index)] = seconds

    def hang(self, call: str, index: int | None) -> threading.Event:
        release = threading.Event()
        with self._lock:
            self._delays[(call, index)] = release
        return release

    def emit_xid(self, index: int, xid: int) -> None:
        with self._event_cond:
            if index in self._registered:
                self._events.append(SimpleNamespace(device=_Handle(index), eventType=nvmlEventTypeXidCriticalError,
                                                    eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                                    computeInstanceId=0xFFFFFFFF))
                self._event_cond.notify_all()

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self.inits > 0

    def _check(self, call: str, index: int | None, initialized: bool = True) -> None:
        self.calls += 1
        if initialized and not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        with self._lock:
            late = self._delays.get((call, index))
        if isinstance(late, threading.Event):
            late.wait()
        elif late is not None:
            time.sleep(late)
        with self._lock:
            for key in ((call, index), (call, None), ("*", None)):
                fault = self._faults.get(key)
                if fault is None:
                    continue
                code, times = fault
                if times is not None:
                    fault[1] = times - 1
                    if fault[1] <= 0:
                        del self._faults[key]
                raise NVMLError(code)

    def _dev(self, call: str, handle: _Handle, *args: object) -> FakeDevice:
        self._check(call, handle.index)
        device = self.devices[handle.index]
        if call in device.unsupported or (call, *args) in device.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device

    # -- system -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self._check("nvmlInit", None, initialized=False)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.calls += 1
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion", None)
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # -- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetIndex(self, handle):
        self._check("nvmlDeviceGetIndex", handle.index)
        return handle.index

    def nvmlDeviceGetName(self, handle):
        return self._dev("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetUUID", handle.parent)
            return self.devices[handle.parent].mig[handle.slot].uuid
        return self._dev("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=self._dev("nvmlDeviceGetPciInfo", handle).pci_bus_id)

    # -- readings -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle):
        d = self._dev("nvmlDeviceGetUtilizationRates", handle)
        if d.mig:  # NVML: device utilization is not supported on a MIG-enabled GPU
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=d.gpu_util, memory=d.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if isinstance(handle, _MigHandle):
            self._check("nvmlDeviceGetMemoryInfo", handle.parent)
            m = self.devices[handle.parent].mig[handle.slot]
            return SimpleNamespace(total=m.memory_total, used=m.memory_used, free=m.memory_total - m.memory_used)
        d = self._dev("nvmlDeviceGetMemoryInfo", handle)
        reserved = d.memory_reserved or 0
        free = d.memory_total - d.memory_used - reserved
        if not version:  # v1 counts reserved memory as used
            return SimpleNamespace(total=d.memory_total, used=d.memory_used + reserved, free=free)
        if d.memory_reserved is None:  # pynvml looks up nvmlDeviceGetMemoryInfo_v2 in an older driver
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(version=version, total=d.memory_total, reserved=reserved, free=free,
                               used=d.memory_used)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        d = self._dev("nvmlDeviceGetTemperature", handle, sensor)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.temperature

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        d = self._dev("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in fieldIds:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            ret, vtype, value = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_INT, 0
            if fid == NVML_FI_DEV_MEMORY_TEMP:
                if d.memory_temperature is None:
                    ret = NVML_ERROR_NOT_SUPPORTED
                else:
                    value = d.memory_temperature
            elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                vtype = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                if scope >= d.nvlink_links or scope in d.nvlink_gaps:
                    ret = NVML_ERROR_NOT_SUPPORTED
                else:
                    value = d.nvlink_tx_kib if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else d.nvlink_rx_kib
            elif fid in (NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL):
                if d.nvlink_links == 0 or (fid == NVML_FI_DEV_NVLINK_LINK_COUNT and not d.nvlink_count_field):
                    ret = NVML_ERROR_NOT_SUPPORTED
                elif fid == NVML_FI_DEV_NVLINK_LINK_COUNT:
                    value = d.nvlink_links
                else:
                    vtype, value = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, d.nvlink_ecc_data_errors
            else:
                ret = NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=vtype,
                                       value=SimpleNamespace(uiVal=value, ullVal=value, ulVal=value)))
        return out

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._dev("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        """Millijoules since the driver loaded, as the driver counts them: the device's power
        (mW) times the seconds of the fake's clock since the last read, added to the count."""
        d = self._dev("nvmlDeviceGetTotalEnergyConsumption", handle)
        now = self._clock()
        with self._lock:
            last = self._energy_read_at.get(handle.index, now)
            d.energy_mj += round(d.power_mw * (now - last))
            self._energy_read_at[handle.index] = now
        return d.energy_mj

    def nvmlDeviceGetClockInfo(self, handle, type):
        d = self._dev("nvmlDeviceGetClockInfo", handle, type)
        return d.sm_clock if type == NVML_CLOCK_SM else d.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, handle, type):
        d = self._dev("nvmlDeviceGetMaxClockInfo", handle, type)
        return d.sm_clock_max if type == NVML_CLOCK_SM else d.mem_clock_max

    def nvmlDeviceGetPerformanceState(self, handle):
        return self._dev("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle_reasons

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle):
        return self._dev("nvmlDeviceGetSupportedClocksEventReasons", handle).supported_clock_reasons

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        return self._dev("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        return list(self._dev("nvmlDeviceGetPowerManagementLimitConstraints", handle).power_limit_constraints_mw)

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold):
        d = self._dev("nvmlDeviceGetTemperatureThreshold", handle, threshold)
        if threshold not in d.temperature_thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.temperature_thresholds[threshold]

    # -- modes and the PCIe link ----------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, handle):
        return list(self._dev("nvmlDeviceGetEccMode", handle).ecc_mode)

    def nvmlDeviceGetPersistenceMode(self, handle):
        return self._dev("nvmlDeviceGetPersistenceMode", handle).persistence_mode

    def nvmlDeviceGetComputeMode(self, handle):
        return self._dev("nvmlDeviceGetComputeMode", handle).compute_mode

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_link[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._dev("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_link[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self._dev("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_link[3]

    def nvmlDeviceGetPcieThroughput(self, device, counter):
        d = self._dev("nvmlDeviceGetPcieThroughput", device, counter)
        return d.pcie_tx_kbps if counter == NVML_PCIE_UTIL_TX_BYTES else d.pcie_rx_kbps

    def nvmlDeviceGetPcieReplayCounter(self, handle):
        return self._dev("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetNvLinkState(self, device, link):
        d = self._dev("nvmlDeviceGetNvLinkState", device, link)
        if d.nvlink_links == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= d.nvlink_links or link in d.nvlink_gaps:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        # NVML reports the links of a MIG-enabled GPU down (DCGM's source cites NVIDIA bug
        # 200682374): no GPU-to-GPU NVLink under MIG
        return NVML_FEATURE_DISABLED if link in d.nvlink_disabled or d.mig else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device, link, counter):
        d = self._dev("nvmlDeviceGetNvLinkErrorCounter", device, link, counter)
        if link >= d.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.nvlink_errors.get(counter, 0)

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        return self._dev("nvmlDeviceGetTotalEccErrors", handle, errorType, counterType).ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRetiredPages(self, device, sourceFilter):
        return list(self._dev("nvmlDeviceGetRetiredPages", device, sourceFilter).retired_pages.get(sourceFilter, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device):
        return self._dev("nvmlDeviceGetRetiredPagesPendingStatus", device).retired_pending

    def nvmlDeviceGetRemappedRows(self, device):
        d = self._dev("nvmlDeviceGetRemappedRows", device)
        if d.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.remapped_rows

    def nvmlDeviceGetFanSpeed(self, handle):
        d = self._dev("nvmlDeviceGetFanSpeed", handle)
        if d.fan_speed is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.fan_speed

    def nvmlDeviceGetEncoderUtilization(self, handle):
        return [self._dev("nvmlDeviceGetEncoderUtilization", handle).encoder_util, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle):
        return [self._dev("nvmlDeviceGetDecoderUtilization", handle).decoder_util, 167000]

    # -- MIG ------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, device):
        d = self._dev("nvmlDeviceGetMigMode", device)
        if d.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if d.mig else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        self._dev("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        d = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not d.mig or index >= len(d.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigHandle(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device):
        self._check("nvmlDeviceGetGpuInstanceId", device.parent)
        return self.devices[device.parent].mig[device.slot].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device):
        self._check("nvmlDeviceGetComputeInstanceId", device.parent)
        return self.devices[device.parent].mig[device.slot].compute_instance_id

    # -- processes ------------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        d = self._dev("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory) for p in d.processes]

    # -- GPM (Hopper and later) -----------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device):
        d = self._dev("nvmlGpmQueryDeviceSupport", device)
        return _pynvml.c_nvmlGpmSupport_t(version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(d.gpm is not None))

    def nvmlGpmSampleAlloc(self):
        self._check("nvmlGpmSampleAlloc", None)
        buffer = ctypes.create_string_buffer(64)
        handle = ctypes.cast(buffer, _pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[_address(handle)] = _GpmSample(buffer)
        return handle

    def gpm_freed(self, handle: object) -> bool:
        """Whether a sample handle this fake handed out has been freed (a test control)."""
        return self._gpm_samples[_address(handle)].freed

    def _gpm_sample(self, handle: object) -> _GpmSample:
        """The sample a handle points at; a handle NVML did not hand out, or freed, is invalid."""
        sample = self._gpm_samples.get(_address(handle))
        # NVML's behaviour here is undefined (a freed or foreign buffer: heap corruption); the
        # fake fails the test instead of answering with an error code the exporter would swallow
        assert sample is not None and not sample.freed, "a GPM sample handle used after free, or never allocated"
        return sample

    def nvmlGpmSampleFree(self, gpmSample):
        self._check("nvmlGpmSampleFree", None)
        self._gpm_sample(gpmSample).freed = True

    def nvmlGpmSampleGet(self, device, gpmSample):
        d = self._dev("nvmlGpmSampleGet", device)
        # a MIG-enabled GPU is sampled per GPU instance (nvmlGpmMigSampleGet), which the
        # exporter does not call: the fake answers the whole GPU's sample NotSupported there
        if d.gpm is None or d.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample = self._gpm_sample(gpmSample)
        now = self._clock()
        then, cumulative = self._gpm_activity.get(device.index, (now, {}))
        cumulative = {m: cumulative.get(m, 0.0) + rate * (now - then) for m, rate in d.gpm.items()}
        self._gpm_activity[device.index] = (now, cumulative)
        sample.index, sample.taken_at, sample.cumulative = device.index, now, cumulative
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet):
        """Average rates between ``sample1`` and the later ``sample2`` of one GPU, written into
        the request's own metric slots; only pynvml's request structure is accepted."""
        self._check("nvmlGpmMetricsGet", None)
        if not isinstance(metricsGet, _pynvml.c_nvmlGpmMetricsGet_t):
            raise TypeError(f"nvmlGpmMetricsGet takes pynvml's c_nvmlGpmMetricsGet_t, not {type(metricsGet)}")
        if metricsGet.version != NVML_GPM_METRICS_GET_VERSION or metricsGet.numMetrics > NVML_GPM_METRIC_MAX:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        one, two = self._gpm_sample(metricsGet.sample1), self._gpm_sample(metricsGet.sample2)
        if one.index is None or one.index != two.index or two.taken_at <= one.taken_at:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        elapsed = two.taken_at - one.taken_at
        for metric in metricsGet.metrics[:metricsGet.numMetrics]:
            if metric.metricId in two.cumulative:
                metric.nvmlReturn = NVML_SUCCESS
                metric.value = (two.cumulative[metric.metricId] - one.cumulative[metric.metricId]) / elapsed
            else:
                metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        return metricsGet

    # -- events ---------------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._check("nvmlEventSetCreate", None)
        return object()

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        self._dev("nvmlDeviceRegisterEvents", handle)
        with self._event_cond:
            self._registered.add(handle.index)

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        self._check("nvmlEventSetWait_v2", None)
        with self._event_cond:
            if not self._events:
                self._event_cond.wait(timeoutms / 1000)
            if not self._events:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return self._events.popleft()

    def nvmlEventSetFree(self, eventSet):
        self._check("nvmlEventSetFree", None)


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _MigHandle:
    parent: int
    slot: int

