"""A stand-in for nvidia-ml-py (``pynvml``) on machines without a GPU.

It implements the subset of pynvml's API that the exporter calls, with the same names,
constants, return shapes and error classes (``NVMLError`` whose constructor maps an error
code to a subclass such as ``NVMLError_NotSupported``), so the exporter cannot tell it from
the real module. Readings are configured per device; errors can be injected per call and
device (or per call and arguments, as NVML answers NotSupported for one NVLink counter or one
clock type while answering the others); XID events can be emitted and are delivered through
``nvmlEventSetWait_v2``. GPM (Hopper profiling) follows NVML's two-sample method: a sample
records cumulative activity at the moment it is taken, and ``nvmlGpmMetricsGet`` returns the
average rate between two samples of the same GPU, so a caller that swaps or reuses samples
gets an error, not a plausible number.
"""

from __future__ import annotations

import string
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

# -- constants (values as in pynvml) ------------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

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


# -- errors: the same construction as pynvml's ----------------------------------------------
class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    for name, value in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(cls, *args, _value=value):
            return NVMLError.__new__(cls, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        globals()[class_name] = cls
        NVMLError._valClassMapping[value] = cls


_make_error_classes()


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
    nvlink_disabled: set[int] = field(default_factory=set)  # links present but down
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
    """An opaque sample buffer, as ``nvmlGpmSampleAlloc`` hands out."""

    index: int | None = None
    taken_at: float = 0.0
    cumulative: dict[int, float] = field(default_factory=dict)
    freed: bool = False


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class _GpmMetricsGet:
    """pynvml's ``c_nvmlGpmMetricsGet_t``: the same fields, as a plain object."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [_GpmMetric() for _ in range(NVML_GPM_METRIC_MAX)]


class FakeNVML:
    """An object that quacks like the ``pynvml`` module.

    ``fail(call, index, code, times)`` makes ``call`` raise ``NVMLError(code)`` for device
    ``index`` (None: every device, or the system call) ``times`` times (None: until cleared).
    ``library_missing=True`` makes ``nvmlInit`` raise LibraryNotFound, as on a host without
    a driver.
    """

    def __init__(self, devices: list[FakeDevice], driver: str = "550.54.15", cuda: int = 12040,
                 library_missing: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.devices = devices
        self.driver = driver
        self.cuda = cuda
        self.library_missing = library_missing
        self.initialized = False
        self.calls = 0
        self._faults: dict[tuple[str, int | None], list[int | None]] = {}
        self._events: deque[SimpleNamespace] = deque()
        self._event_cond = threading.Condition()
        self._registered: set[int] = set()
        self._lock = threading.Lock()
        self._clock = clock
        self._gpm_activity: dict[int, tuple[float, dict[int, float]]] = {}  # index -> (time, cumulative)
        for name, value in globals().items():  # constants and error classes, as module attributes
            if name.isupper() or name.startswith(("NVMLError", "nvmlEventType", "nvmlClocksEventReason", "NVML_",
                                                  "nvmlMemory")):
                setattr(self, name, value)

    c_nvmlGpmMetricsGet_t = _GpmMetricsGet

    # -- test controls -------------------------------------------------------------------
    def fail(self, call: str, index: int | None, code: int, times: int | None = None) -> None:
        with self._lock:
            self._faults[(call, index)] = [code, times]

    def clear(self, call: str, index: int | None) -> None:
        with self._lock:
            self._faults.pop((call, index), None)

    def emit_xid(self, index: int, xid: int) -> None:
        with self._event_cond:
            if index in self._registered:
                self._events.append(SimpleNamespace(device=_Handle(index), eventType=nvmlEventTypeXidCriticalError,
                                                    eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                                    computeInstanceId=0xFFFFFFFF))
                self._event_cond.notify_all()

    # -- plumbing ---------------------------------------------------------------------------
    def _check(self, call: str, index: int | None) -> None:
        self.calls += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        with self._lock:
            for key in ((call, index), (call, None)):
                fault = self._faults.get(key)
                if fault is None:
                    continue
                code, times = fault
                if times is not None:
                    fault[1] = times - 1
                    if fault[1] <= 0:
                        del self._faults[key]
                raise NVMLError(code)

    def _dev(self, call: str, handle: "_Handle", *args: object) -> FakeDevice:
        self._check(call, handle.index)
        device = self.devices[handle.index]
        if call in device.unsupported or (call, *args) in device.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device

    # -- system -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True
        self._check("nvmlInit", None)

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown", None)
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion", None)
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> "_Handle":
        self._check("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # -- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetIndex(self, h):
        self._check("nvmlDeviceGetIndex", h.index)
        return h.index

    def nvmlDeviceGetName(self, h):
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h):
        if isinstance(h, _MigHandle):
            self._check("nvmlDeviceGetUUID", h.parent)
            return self.devices[h.parent].mig[h.slot].uuid
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._dev("nvmlDeviceGetPciInfo", h).pci_bus_id)

    # -- readings -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h):
        d = self._dev("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=d.gpu_util, memory=d.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if isinstance(h, _MigHandle):
            self._check("nvmlDeviceGetMemoryInfo", h.parent)
            m = self.devices[h.parent].mig[h.slot]
            return SimpleNamespace(total=m.memory_total, used=m.memory_used, free=m.memory_total - m.memory_used)
        d = self._dev("nvmlDeviceGetMemoryInfo", h)
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

    def nvmlDeviceGetTemperature(self, h, sensor):
        d = self._dev("nvmlDeviceGetTemperature", h, sensor)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.temperature

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        d = self._dev("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in field_ids:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            ret, vtype, value = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_INT, 0
            if fid == NVML_FI_DEV_MEMORY_TEMP:
                if d.memory_temperature is None:
                    ret = NVML_ERROR_NOT_SUPPORTED
                else:
                    value = d.memory_temperature
            elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                vtype = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                if scope >= d.nvlink_links:
                    ret = NVML_ERROR_NOT_SUPPORTED
                else:
                    value = d.nvlink_tx_kib if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else d.nvlink_rx_kib
            elif fid in (NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL):
                if d.nvlink_links == 0:
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

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._dev("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetClockInfo(self, h, clock):
        d = self._dev("nvmlDeviceGetClockInfo", h, clock)
        return d.sm_clock if clock == NVML_CLOCK_SM else d.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        d = self._dev("nvmlDeviceGetMaxClockInfo", h, clock)
        return d.sm_clock_max if clock == NVML_CLOCK_SM else d.mem_clock_max

    def nvmlDeviceGetPerformanceState(self, h):
        return self._dev("nvmlDeviceGetPerformanceState", h).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).throttle_reasons

    def nvmlDeviceGetSupportedClocksEventReasons(self, h):
        return self._dev("nvmlDeviceGetSupportedClocksEventReasons", h).supported_clock_reasons

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return self._dev("nvmlDeviceGetPowerManagementDefaultLimit", h).power_default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        return list(self._dev("nvmlDeviceGetPowerManagementLimitConstraints", h).power_limit_constraints_mw)

    def nvmlDeviceGetTemperatureThreshold(self, h, threshold):
        d = self._dev("nvmlDeviceGetTemperatureThreshold", h, threshold)
        if threshold not in d.temperature_thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.temperature_thresholds[threshold]

    # -- modes and the PCIe link ----------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, h):
        return list(self._dev("nvmlDeviceGetEccMode", h).ecc_mode)

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._dev("nvmlDeviceGetPersistenceMode", h).persistence_mode

    def nvmlDeviceGetComputeMode(self, h):
        return self._dev("nvmlDeviceGetComputeMode", h).compute_mode

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_link[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_link[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_link[3]

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        d = self._dev("nvmlDeviceGetPcieThroughput", h, counter)
        return d.pcie_tx_kbps if counter == NVML_PCIE_UTIL_TX_BYTES else d.pcie_rx_kbps

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._dev("nvmlDeviceGetPcieReplayCounter", h).pcie_replays

    def nvmlDeviceGetNvLinkState(self, h, link):
        d = self._dev("nvmlDeviceGetNvLinkState", h, link)
        if d.nvlink_links == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= d.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_DISABLED if link in d.nvlink_disabled else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        d = self._dev("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
        if link >= d.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.nvlink_errors.get(counter, 0)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self._dev("nvmlDeviceGetTotalEccErrors", h, error_type, counter_type).ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return list(self._dev("nvmlDeviceGetRetiredPages", h, cause).retired_pages.get(cause, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._dev("nvmlDeviceGetRetiredPagesPendingStatus", h).retired_pending

    def nvmlDeviceGetRemappedRows(self, h):
        d = self._dev("nvmlDeviceGetRemappedRows", h)
        if d.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.remapped_rows

    def nvmlDeviceGetFanSpeed(self, h):
        d = self._dev("nvmlDeviceGetFanSpeed", h)
        if d.fan_speed is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return d.fan_speed

    def nvmlDeviceGetEncoderUtilization(self, h):
        return [self._dev("nvmlDeviceGetEncoderUtilization", h).encoder_util, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h):
        return [self._dev("nvmlDeviceGetDecoderUtilization", h).decoder_util, 167000]

    # -- MIG ------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h):
        d = self._dev("nvmlDeviceGetMigMode", h)
        if d.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if d.mig else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        self._dev("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        d = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if not d.mig or index >= len(d.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigHandle(h.index, index)

    def nvmlDeviceGetGpuInstanceId(self, h):
        self._check("nvmlDeviceGetGpuInstanceId", h.parent)
        return self.devices[h.parent].mig[h.slot].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, h):
        self._check("nvmlDeviceGetComputeInstanceId", h.parent)
        return self.devices[h.parent].mig[h.slot].compute_instance_id

    # -- processes ------------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        d = self._dev("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory) for p in d.processes]

    # -- GPM (Hopper and later) -----------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        d = self._dev("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(d.gpm is not None))

    def nvmlGpmSampleAlloc(self):
        self._check("nvmlGpmSampleAlloc", None)
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample):
        self._check("nvmlGpmSampleFree", None)
        sample.freed = True

    def nvmlGpmSampleGet(self, h, sample):
        d = self._dev("nvmlGpmSampleGet", h)
        if d.gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if sample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        now = self._clock()
        then, cumulative = self._gpm_activity.get(h.index, (now, {}))
        cumulative = {m: cumulative.get(m, 0.0) + rate * (now - then) for m, rate in d.gpm.items()}
        self._gpm_activity[h.index] = (now, cumulative)
        sample.index, sample.taken_at, sample.cumulative = h.index, now, cumulative
        return sample

    def nvmlGpmMetricsGet(self, request):
        """Average rates between ``sample1`` and the later ``sample2`` of one GPU."""
        self._check("nvmlGpmMetricsGet", None)
        one, two = request.sample1, request.sample2
        if (request.version != NVML_GPM_METRICS_GET_VERSION or one is None or two is None or one.freed or two.freed
                or one.index is None or one.index != two.index or two.taken_at <= one.taken_at):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        elapsed = two.taken_at - one.taken_at
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in two.cumulative:
                metric.nvmlReturn = NVML_SUCCESS
                metric.value = (two.cumulative[metric.metricId] - one.cumulative[metric.metricId]) / elapsed
            else:
                metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        return request

    # -- events ---------------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._check("nvmlEventSetCreate", None)
        return object()

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        self._dev("nvmlDeviceRegisterEvents", h)
        with self._event_cond:
            self._registered.add(h.index)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self._check("nvmlEventSetWait_v2", None)
        with self._event_cond:
            if not self._events:
                self._event_cond.wait(timeout_ms / 1000)
            if not self._events:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return self._events.popleft()

    def nvmlEventSetFree(self, event_set):
        self._check("nvmlEventSetFree", None)


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _MigHandle:
    parent: int
    slot: int

