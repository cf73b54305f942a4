"""Fake GPU fleets with known readings, shared by exporter tests and benchmarks."""

from __future__ import annotations

from tests.support.fake_nvml import FakeDevice, FakeMig, FakeNVML, FakeProcess


def h100(index: int, **overrides) -> FakeDevice:
    base = dict(
        name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        pci_bus_id=f"00000000:{index + 1:02X}:00.0", gpu_util=40 + index, mem_util=10 + index,
        memory_total=85_520_809_984, memory_used=(index + 1) * 1_000_000_000, temperature=50 + index,
        memory_temperature=60 + index, power_mw=250_000 + index * 1000, power_limit_mw=700_000,
        energy_mj=1_000_000 * (index + 1), sm_clock=1755, mem_clock=2619, sm_clock_max=1980, mem_clock_max=2619,
        pstate=0, throttle_reasons=0x4 | 0x40, pcie_tx_kbps=100 * (index + 1), pcie_rx_kbps=200 * (index + 1),
        pcie_replays=index, nvlink_links=2, nvlink_tx_kib=10 * (index + 1), nvlink_rx_kib=20 * (index + 1),
        nvlink_errors={2: 3, 0: 1}, ecc={(0, 0): 5, (1, 1): 2}, retired_pages={}, remapped_rows=(1, 0, 1, 0),
        fan_speed=None, encoder_util=0, decoder_util=7, memory_reserved=512 * 2**20, nvlink_ecc_data_errors=index,
        # NVML_GPM_METRIC_*: graphics, SM, occupancy, any tensor, DRAM (%); PCIe tx/rx, NVLink rx/tx (MiB/s)
        gpm={1: 90.0, 2: 40.0 + index, 3: 25.0, 5: 30.0 + index, 10: 55.0, 20: 100.0, 21: 200.0, 60: 1000.0,
             61: 2000.0},
    )
    base.update(overrides)
    return FakeDevice(**base)


def fleet(n: int = 2, **kwargs) -> FakeNVML:
    """``n`` H100s with GPM; ``kwargs`` go to FakeNVML (clock, library_missing, ...)."""
    return FakeNVML([h100(i) for i in range(n)], **kwargs)


__all__ = ["FakeMig", "FakeNVML", "FakeProcess", "fleet", "h100"]
