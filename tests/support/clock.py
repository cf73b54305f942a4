"""The one hand-moved clock for code that takes its time source as an argument (admission,
the supervisor's backoff, the fake NVML's GPM samples, the drift windows): the test decides
when time passes, so nothing depends on how fast the machine runs it."""

from __future__ import annotations


class Clock:
    """Returns ``now`` until the test moves it (``clock.now += 1.5``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
