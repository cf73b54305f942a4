"""The one way tests wait for something another thread or process does: poll a probe until it
holds, and fail with what it last returned, never sleep for a guessed time and hope."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05) -> T:
    """Call ``probe`` until it returns something truthy, and return that. After ``timeout_s``
    raise an AssertionError naming the probe and its last value, so a timeout says what was
    awaited and what was seen instead."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout_s:g} s: {_described(probe)}\nlast returned: {value!r}")
        time.sleep(interval_s)


def _described(probe: Callable) -> str:
    """The probe's source (a lambda says best what was awaited), else its name."""
    try:
        return inspect.getsource(probe).strip()
    except (OSError, TypeError):
        return getattr(probe, "__qualname__", repr(probe))
