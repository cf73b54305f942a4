"""The fake NVML against the real nvidia-ml-py: same constants, errors and call shapes."""

import inspect

import pynvml
import pytest

from exporters import fake_nvml
from exporters.fake_nvml import FakeNVML, NVMLError


def test_constants_match_pynvml():
    ours = {k: v for k, v in vars(fake_nvml).items()
            if k.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason")) and isinstance(v, int)}
    assert len(ours) > 40
    for name, value in ours.items():
        assert getattr(pynvml, name) == value, name


@pytest.mark.parametrize("code", [1, 2, 3, 4, 6, 9, 10, 12, 15, 999])
def test_error_classes_behave_like_pynvml(code):
    ours, theirs = NVMLError(code), pynvml.NVMLError(code)
    assert type(ours).__name__ == type(theirs).__name__
    assert isinstance(ours, NVMLError) and ours.value == theirs.value == code
    assert str(ours) == str(theirs)
    sub = getattr(fake_nvml, type(theirs).__name__)
    assert sub() == ours and isinstance(sub(), NVMLError)  # NVMLError_X() takes no code, as in pynvml


def test_every_fake_call_exists_in_pynvml_with_compatible_arguments():
    fake = FakeNVML([])
    calls = [n for n, f in inspect.getmembers(fake, inspect.ismethod) if n.startswith("nvml")]
    assert len(calls) > 30
    for name in calls:
        real = getattr(pynvml, name)
        want = [p for p in inspect.signature(real).parameters.values() if p.default is inspect.Parameter.empty]
        ours = inspect.signature(getattr(fake, name)).parameters
        assert len(ours) >= len(want), name


def test_uninitialised_calls_fail_like_the_library():
    fake = FakeNVML([])
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_real_pynvml_without_a_driver_raises_library_not_found():
    """What the exporter sees on this machine, and on any host without the driver."""
    with pytest.raises(pynvml.NVMLError) as info:
        pynvml.nvmlInit()
    assert info.value.value in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
