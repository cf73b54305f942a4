"""How many NVLinks a GPU has, where the driver answers the link-count field and where it
does not (then each link is probed until NVML says it does not exist), on fake GPUs of each
kind. The fake answers as NVML does: NotSupported for the field on such a driver and for a
GPU without NVLink, InvalidArgument for a link index past the last."""

from __future__ import annotations

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.sampler import Sampler
from tests.exporters.test_exporter import scrape
from tests.support.fleet import FakeNVML, h100

NVLINK_SERIES = ("inferwatch_gpu_nvlink_up", "inferwatch_gpu_nvlink_tx_bytes", "inferwatch_gpu_nvlink_errors",
                 "inferwatch_gpu_nvlink_ecc_data_errors")


def links(families, series: str = "inferwatch_gpu_nvlink_up", gpu: str = "0") -> dict[str, float]:
    if series not in families:
        return {}
    return {s.labels["link"]: s.value for s in families[series].samples
            if s.labels.get("gpu") == gpu and "link" in s.labels and s.name in (series, series + "_total")}


def errors(families) -> float:
    family = families.get("inferwatch_gpu_collection_errors")
    return sum(s.value for s in family.samples) if family else 0.0


def test_the_count_field_and_the_probe_find_the_same_links():
    for count_field in (True, False):
        device = h100(0, nvlink_links=18, nvlink_disabled={3}, nvlink_count_field=count_field)
        families, _ = scrape(FakeNVML([device]))
        assert links(families) == {str(i): (0.0 if i == 3 else 1.0) for i in range(18)}, count_field
        assert set(links(families, "inferwatch_gpu_nvlink_tx_bytes")) == {str(i) for i in range(18)} - {"3"}
        assert [s.value for s in families["inferwatch_gpu_nvlink_ecc_data_errors"].samples] == [0.0]
        assert errors(families) == 0


def test_a_link_whose_state_is_not_supported_is_left_out_and_the_probe_goes_on():
    device = h100(0, nvlink_links=18, nvlink_count_field=False, unsupported={("nvmlDeviceGetNvLinkState", 5)})
    families, _ = scrape(FakeNVML([device]))
    assert set(links(families)) == {str(i) for i in range(18)} - {"5"}


def test_a_gpu_without_nvlink_exports_none_and_counts_no_error():
    for count_field in (True, False):
        families, _ = scrape(FakeNVML([h100(0, nvlink_links=0, nvlink_count_field=count_field)]))
        assert not any(links(families, series) for series in NVLINK_SERIES if series in families), count_field
        assert errors(families) == 0
        assert families["inferwatch_gpu_device_failed"].samples[0].value == 0


def test_a_gap_in_the_link_numbering_skips_that_link_only():
    """A part with links fused off: NVML calls link 3 invalid, with the count field (which
    counts it) and without (the probe goes on past it, as DCGM's does)."""
    for count_field in (True, False):
        device = h100(0, nvlink_links=8, nvlink_gaps={3}, nvlink_count_field=count_field)
        families, _ = scrape(FakeNVML([device]))
        assert set(links(families)) == {str(i) for i in range(8)} - {"3"}, count_field
        assert set(links(families, "inferwatch_gpu_nvlink_tx_bytes")) == {str(i) for i in range(8)} - {"3"}
        assert families["inferwatch_gpu_device_failed"].samples[0].value == 0 and errors(families) == 0


def test_a_gpu_lost_while_its_links_are_probed_is_a_failed_gpu_not_a_gpu_without_links():
    nvml = FakeNVML([h100(0, nvlink_links=18, nvlink_count_field=False)])
    nvml.fail("nvmlDeviceGetNvLinkState", 0, pynvml.NVML_ERROR_GPU_IS_LOST)
    families, _ = scrape(nvml)
    assert families["inferwatch_gpu_device_failed"].samples[0].value == 1
    assert [s.labels["query"] for s in families["inferwatch_gpu_collection_errors"].samples] == [
        "nvmlDeviceGetNvLinkState"]
    assert not links(families)


def test_a_probe_error_that_passes_is_rediscovered_with_every_link():
    """The discovery at start meets an unknown error in the probe; the next cycle discovers
    the GPU again, with every link, and the error stays counted."""
    nvml = FakeNVML([h100(0, nvlink_links=4, nvlink_count_field=False)])
    nvml.fail("nvmlDeviceGetNvLinkState", 0, pynvml.NVML_ERROR_UNKNOWN, times=1)
    sampler = Sampler(nvml)
    sampler.start()
    assert not sampler.devices
    families = {f.name: f for f in text_string_to_metric_families(
        CachedExposition(SnapshotStore(sampler.sample())).render().decode())}
    assert families["inferwatch_gpu_device_failed"].samples[0].value == 0
    assert set(links(families)) == {"0", "1", "2", "3"}
    assert [(s.labels["query"], s.value) for s in families["inferwatch_gpu_collection_errors"].samples] == [
        ("nvmlDeviceGetNvLinkState", 1.0)]
