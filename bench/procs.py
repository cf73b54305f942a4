"""Processes under benchmark: started (optionally pinned to CPUs), healthy, then stopped."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferwatch.common.supervise import ManagedProcess  # noqa: E402


@contextmanager
def running(name: str, argv: list[str], health_url: str, cpus: str | None = None,
            env: Mapping[str, str] | None = None) -> Iterator[ManagedProcess]:
    """``taskset`` execs the program, so the pid is the program's own (for /proc CPU stats)."""
    full = ["taskset", "-c", cpus, *argv] if cpus else argv
    log = Path(tempfile.mkdtemp(prefix="inferwatch-bench-")) / f"{name}.log"
    proc = ManagedProcess(name, full, log_path=log, health_url=health_url, env={**os.environ, **(env or {})})
    proc.start()
    try:
        proc.wait_healthy(60, poll_s=0.1)
        yield proc
    finally:
        proc.stop(grace_s=10)
