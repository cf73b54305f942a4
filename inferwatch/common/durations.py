"""Prometheus durations ('5m', '1d'), in the single-unit form the rules and settings use."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def seconds(duration: str) -> int:
    """Prometheus duration ('5m', '1d') in seconds; only the single-unit form is used here."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"not a single-unit Prometheus duration: {duration!r}")
    return int(match[1]) * _UNIT_S[match[2]]
