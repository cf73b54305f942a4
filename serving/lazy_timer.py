"""A deadline that moves often and is rarely reached, kept on one event-loop timer.

Starting and cancelling a loop timer costs ~2 µs (bench/gateway_overhead.py), and the
gateway keeps deadlines that move with every request or chunk and almost never expire: a
request head's, a keep-alive connection's, vLLM's answer, a stream's idle time. So the timer
is left running when the deadline moves later; when it fires, ``check`` says whether the
deadline really passed (and acts on it) or which deadline holds now, to be woken again then.
The monotonic clock throughout: uvloop's own steps in milliseconds and is read at the start
of a loop iteration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

SLACK_S = 0.001  # a deadline this close counts as reached (loop timers fire in millisecond steps)


def reached(deadline: float) -> bool:
    return deadline - time.monotonic() <= SLACK_S


def _closed() -> None:
    return None


class LazyTimer:
    """``check`` runs when the timer fires: it returns None when done (the deadline passed and
    was acted on, or nothing waits), or the deadline in force, ``time.monotonic()`` seconds."""

    __slots__ = ("_at", "_check", "_handle")

    def __init__(self, check: Callable[[], float | None]) -> None:
        self._check = check
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0

    def fire_by(self, deadline: float) -> None:
        """Make sure the timer fires no later than ``deadline``."""
        if self._handle is not None:
            if self._at <= deadline + SLACK_S:
                return
            self._handle.cancel()
        self._at = deadline
        self._handle = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        """Cancel for good. ``check`` is mostly a method of the timer's owner, so owner and
        timer hold each other: a cycle only the garbage collector would free, once per
        request for a per-request owner (tests/serving/test_no_cycles.py)."""
        self.cancel()
        self._check = _closed

    def _fire(self) -> None:
        self._handle = None
        deadline = self._check()
        if deadline is not None:
            self.fire_by(deadline)
