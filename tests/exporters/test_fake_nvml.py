"""The fake NVML against the real nvidia-ml-py: same constants, errors and call shapes."""

import inspect
import types

import pynvml
import pytest

from tests.exporters.driver import kernel_gpus
from tests.support import fake_nvml
from tests.support.clock import Clock
from tests.support.fake_nvml import FakeDevice, FakeNVML


def test_constants_match_pynvml():
    ours = {k: v for k, v in vars(fake_nvml).items()
            if k.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason", "nvmlMemory")) and isinstance(v, int)}
    assert len(ours) > 40
    for name, value in ours.items():
        assert getattr(pynvml, name) == value, name


@pytest.mark.parametrize("code", [1, 2, 3, 4, 6, 9, 10, 12, 13, 15, 18, 25, 999])
def test_injected_errors_are_pynvmls_own_classes(code):
    """An injected code raises the subclass pynvml's own table maps it to, so an ``except``
    in the exporter meets exactly what it meets on a GPU host (18: the driver was upgraded
    under a running process)."""
    fake = FakeNVML([FakeDevice()])
    fake.nvmlInit()
    fake.fail("nvmlDeviceGetPowerUsage", 0, code)
    with pytest.raises(pynvml.NVMLError) as info:
        fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0))
    assert type(info.value) is type(pynvml.NVMLError(code)) is not pynvml.NVMLError
    assert info.value.value == code and fake.NVMLError is pynvml.NVMLError
    assert getattr(fake, type(info.value).__name__) is type(info.value)


def test_every_fake_call_exists_in_pynvml_with_the_same_parameters():
    """Names, order and which have defaults: a call by keyword works on both."""
    fake = FakeNVML([])
    calls = [n for n, f in inspect.getmembers(fake, inspect.ismethod) if n.startswith("nvml")]
    assert len(calls) > 30
    for name in calls:
        theirs = [(p.name, p.default is inspect.Parameter.empty)
                  for p in inspect.signature(getattr(pynvml, name)).parameters.values()]
        ours = [(p.name, p.default is inspect.Parameter.empty)
                for p in inspect.signature(getattr(fake, name)).parameters.values()]
        assert ours == theirs, name


def test_uninitialised_calls_fail_like_the_library():
    fake = FakeNVML([])
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_init_is_reference_counted_like_nvml():
    """Every successful nvmlInit needs its nvmlShutdown; a failed one needs none."""
    fake = FakeNVML([FakeDevice()])
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 1 and fake.inits == 1
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlShutdown()
    fake.fail("nvmlInit", None, pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=1)
    with pytest.raises(fake.NVMLError_DriverNotLoaded):
        fake.nvmlInit()
    assert fake.inits == 0


def test_a_library_wide_fault_fails_every_call_but_shutdown():
    fake = FakeNVML([FakeDevice()])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.fail("*", None, pynvml.NVML_ERROR_GPU_IS_LOST)
    for call in (fake.nvmlDeviceGetCount, lambda: fake.nvmlDeviceGetPowerUsage(handle), fake.nvmlInit):
        with pytest.raises(fake.NVMLError_GpuIsLost):
            call()
    fake.nvmlShutdown()
    assert fake.inits == 0


def test_the_gpm_binding_is_the_one_the_exporter_and_the_fake_were_written_for():
    """The exporter fills pynvml's own request structure and reads its metric slots; the fake
    writes into the same structure. A new nvidia-ml-py that changes the layout, the version
    or a metric id fails here, before a GPU host reads wrong numbers. The ids are nvml.h's
    ``nvmlGpmMetricId_t`` values; the exporter's factors assume its units (% and MiB/s)."""
    import ctypes

    from inferwatch.exporters.metrics import GPM_METRICS

    assert FakeNVML.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    fields = dict(pynvml.c_nvmlGpmMetricsGet_t._fields_)
    assert list(fields) == ["version", "numMetrics", "sample1", "sample2", "metrics"]
    assert fields["version"] is ctypes.c_uint and fields["numMetrics"] is ctypes.c_uint
    assert fields["sample1"] is fields["sample2"] is pynvml.c_nvmlGpmSample_t
    assert fields["metrics"]._type_ is pynvml.c_nvmlGpmMetric_t
    metric = dict(pynvml.c_nvmlGpmMetric_t._fields_)
    assert list(metric)[:3] == ["metricId", "nvmlReturn", "value"]
    assert (metric["metricId"], metric["nvmlReturn"], metric["value"]) == (ctypes.c_uint, ctypes.c_uint,
                                                                           ctypes.c_double)
    # the bytes the driver writes: nvml.h's nvmlGpmMetric_t (with its metricInfo) is 40 bytes,
    # the request's metrics start at 24; a slot of another size shifts every slot after the first
    request, slot = pynvml.c_nvmlGpmMetricsGet_t, pynvml.c_nvmlGpmMetric_t
    assert ctypes.sizeof(slot) == 40 and (slot.metricId.offset, slot.nvmlReturn.offset, slot.value.offset) == (0, 4, 8)
    assert (request.sample1.offset, request.sample2.offset, request.metrics.offset) == (8, 16, 24)
    assert (pynvml.NVML_GPM_METRICS_GET_VERSION, pynvml.NVML_GPM_SUPPORT_VERSION) == (1, 1)
    nvml_h = {"NVML_GPM_METRIC_GRAPHICS_UTIL": 1, "NVML_GPM_METRIC_SM_UTIL": 2, "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
              "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5, "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
              "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 20, "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 21,
              "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 60, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 61}
    assert set(GPM_METRICS) == set(nvml_h)
    assert {name: getattr(pynvml, name) for name in nvml_h} == nvml_h
    assert max(nvml_h.values()) < fields["metrics"]._length_  # the binding has a slot for each id asked


def test_gpm_goes_through_pynvmls_structures():
    """A request built as the exporter builds it, filled by the fake: the values land in the
    ctypes slots, and a plain object in place of pynvml's request is refused."""
    clock = [0.0]
    fake = FakeNVML([FakeDevice(gpm={pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0})], clock=lambda: clock[0])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    one, two = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    assert isinstance(one, pynvml.c_nvmlGpmSample_t)
    fake.nvmlGpmSampleGet(h, one)
    clock[0] = 1.0
    fake.nvmlGpmSampleGet(h, two)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 2
    request.sample1, request.sample2 = one, two
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    fake.nvmlGpmMetricsGet(request)
    assert (request.metrics[0].nvmlReturn, request.metrics[0].value) == (pynvml.NVML_SUCCESS, pytest.approx(40.0))
    assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(TypeError):
        fake.nvmlGpmMetricsGet(types.SimpleNamespace(**{n: getattr(request, n) for n, _ in request._fields_}))
    fake.nvmlGpmSampleFree(one)
    with pytest.raises(AssertionError):  # undefined in NVML: the fake fails the test, never answers
        fake.nvmlGpmSampleGet(h, one)


def test_memory_v2_has_pynvml_field_names_and_v1_counts_reserved_as_used():
    fake = FakeNVML([FakeDevice(memory_total=1000, memory_used=300, memory_reserved=100)])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    v2 = fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert {name for name, _ in pynvml.c_nvmlMemory_v2_t._fields_} == set(vars(v2))
    v1 = fake.nvmlDeviceGetMemoryInfo(h)
    assert (v2.used, v2.reserved, v2.free, v1.used, v1.free) == (300, 100, 600, 400, 600)


def test_gpm_metrics_need_two_samples_of_one_gpu_in_order():
    """As NVML: a metric is defined between an earlier and a later sample of the same GPU."""
    clock = Clock(0.0)
    fake = FakeNVML([FakeDevice(gpm={2: 50.0}), FakeDevice(gpm={2: 10.0}), FakeDevice(gpm=None)],
                    clock=clock)
    fake.nvmlInit()
    h0, h1, h2 = (fake.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    assert [fake.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in (h0, h1, h2)] == [1, 1, 0]
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlGpmSampleGet(h2, fake.nvmlGpmSampleAlloc())
    a, b, other = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()

    def metrics(one, two):
        request = fake.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics, request.sample1, request.sample2 = 1, 2, one, two
        request.metrics[0].metricId, request.metrics[1].metricId = 2, 5
        return fake.nvmlGpmMetricsGet(request).metrics[:2]

    fake.nvmlGpmSampleGet(h0, a)
    fake.nvmlGpmSampleGet(h1, other)
    clock.now = 2.0
    fake.nvmlGpmSampleGet(h0, b)
    sm, tensor = metrics(a, b)
    assert (sm.nvmlReturn, sm.value, tensor.nvmlReturn) == (0, 50.0, pynvml.NVML_ERROR_NOT_SUPPORTED)
    for one, two in ((b, a), (a, a), (a, other)):
        with pytest.raises(fake.NVMLError_InvalidArgument):
            metrics(one, two)


def test_real_pynvml_fails_cleanly_without_a_driver_and_counts_gpus_with_one():
    """What the exporter sees from the real bindings: LibraryNotFound or DriverNotLoaded on a
    host without the kernel driver (this one), every bound GPU on a host with it."""
    gpus = kernel_gpus()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        assert gpus is None, f"the NVIDIA driver has {gpus} GPU(s) bound, yet NVML failed: {error}"
        assert error.value in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        return
    try:
        assert gpus is not None and pynvml.nvmlDeviceGetCount() == gpus
    finally:
        pynvml.nvmlShutdown()


def test_the_energy_counter_moves_at_the_power_drawn():
    """As the driver's: millijoules since load, growing by power × time (a flat counter would
    draw "0 kJ in range" beside a GPU drawing 250 W)."""
    clock = Clock()
    fake = FakeNVML([FakeDevice(power_mw=250_000, energy_mj=1_000)], clock=clock)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000
    clock.now += 10
    assert fake.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000 + 2_500_000  # 250 W for 10 s: 2.5 kJ
    fake.devices[0].power_mw = 100_000
    clock.now += 1
    assert fake.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000 + 2_600_000
