"""Whether this host has the NVIDIA kernel driver, read from /proc, not from NVML: the
independent truth for tests that run both here (no driver) and on a GPU host."""

from __future__ import annotations

from pathlib import Path

GPUS = Path("/proc/driver/nvidia/gpus")


def kernel_gpus() -> int | None:
    """GPUs the NVIDIA kernel driver has bound (one folder per PCI device); None without it."""
    return sum(1 for _ in GPUS.iterdir()) if GPUS.is_dir() else None
