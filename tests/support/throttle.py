"""Processes throttled as a CPU-limited container is: stopped for most of each period, as
the kernel's CFS quota does (with SIGSTOP/SIGCONT, since cgroups may not be writable here).
A real process made slow by a real constraint, whatever the speed of the machine."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psutil

LOWEST_PRIORITY = 19


def descendants(pid: int) -> list[int]:
    """The process's children, not itself: for vLLM, its engine core without its API server,
    which then keeps answering HTTP (and relaying aborts) at full speed while generation
    slows down."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


@contextmanager
def frozen(pids: Sequence[int]) -> Iterator[None]:
    """``pids`` stopped for the whole block: nothing they were asked meanwhile can finish
    before whatever the block does, on a machine of any speed."""
    _signal_all(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        _signal_all(pids, signal.SIGCONT)


@contextmanager
def throttled(pids: Sequence[int], run_s: float, period_s: float = 0.2) -> Iterator[Callable[[], None]]:
    """``pids`` run ``run_s`` of every ``period_s``; all run again when the block ends.

    Yields ``hold``: once called, ``pids`` stay stopped until the block ends (it returns when
    they are), so a test can let a slowed process start something and then stop it at a
    point it observed, with the process's full speed never in between.

    They run at the lowest priority meanwhile: vLLM's engine spins a thread per core, and at
    equal priority it can keep this process's stopping thread off both cores for a whole
    period (measured: a replica meant to run 5% of the time took 12 s of CPU in 17 s)."""
    done, holding, held = threading.Event(), threading.Event(), threading.Event()
    niceness = {pid: _renice(pid, LOWEST_PRIORITY) for pid in pids}

    def duty() -> None:
        while not done.is_set():
            _signal_all(pids, signal.SIGSTOP)
            if holding.is_set():
                held.set()
                done.wait()
                return
            done.wait(period_s - run_s)
            _signal_all(pids, signal.SIGCONT)
            done.wait(run_s)

    def hold() -> None:
        holding.set()
        assert held.wait(10 * period_s), "the throttled processes were not stopped"

    thread = threading.Thread(target=duty, daemon=True)
    thread.start()
    try:
        yield hold
    finally:
        done.set()
        thread.join()
        _signal_all(pids, signal.SIGCONT)
        for pid, value in niceness.items():
            if value is not None:
                _renice(pid, value)


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _renice(pid: int, value: int) -> int | None:
    """Sets the process's nice value, returns the one it had (None: the process is gone, or
    raising it back needs a privilege this user lacks, and it stays low)."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, pid)
        for thread in psutil.Process(pid).threads():  # on Linux the nice value is per thread
            os.setpriority(os.PRIO_PROCESS, thread.id, value)
    except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
        return None
    return before
