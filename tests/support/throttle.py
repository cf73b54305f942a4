"""Processes throttled as a CPU-limited container is: stopped for most of each period, as
the kernel's CFS quota does (with SIGSTOP/SIGCONT, since cgroups may not be writable here).
A real process made slow by a real constraint, whatever the speed of the machine."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psutil


def descendants(pid: int) -> list[int]:
    """The process's children, not itself: for vLLM, its engine core without its API server,
    which then keeps answering HTTP (and relaying aborts) at full speed while generation
    slows down."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


@contextmanager
def throttled(pids: Sequence[int], run_s: float, period_s: float = 0.2) -> Iterator[None]:
    """``pids`` run ``run_s`` of every ``period_s``; all run again when the block ends."""
    done = threading.Event()

    def signal_all(sig: signal.Signals) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def duty() -> None:
        while not done.is_set():
            signal_all(signal.SIGSTOP)
            done.wait(period_s - run_s)
            signal_all(signal.SIGCONT)
            done.wait(run_s)

    thread = threading.Thread(target=duty, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        signal_all(signal.SIGCONT)
