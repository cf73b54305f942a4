"""A request's sampling parameters as small categoricals: bounded label values for the
gateway's counter, and the same strings in the feature record, so the drift service sees
a change of client configuration (a rollout that turned temperature up, a client that
started asking for JSON) with the counter's words. Part of the record's contract
(drift/feature_record.py), so like it this imports neither side.

Bins, not values: a float in a label is unbounded, and what changes a model's behaviour is
the regime (greedy, low, default-like, hot), not the third decimal. ``default`` is a
parameter the client left out (vLLM then takes the model's generation config), ``invalid``
one vLLM will refuse (a string where a number belongs): the request still counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

DEFAULT, INVALID = "default", "invalid"

# (upper bound, label) in order, within what vLLM takes: temperature in [0, 2], top_p in (0, 1]
TEMPERATURE_BINS = ((0.0, "0"), (0.5, "0-0.5"), (1.0, "0.5-1"), (2.0, "1-2"))
TOP_P_BINS = ((0.5, "0-0.5"), (0.9, "0.5-0.9"), (0.999999, "0.9-1"), (1.0, "1"))
MAX_TOKENS_BINS = ((64, "1-64"), (256, "65-256"), (1024, "257-1024"), (4096, "1025-4096"))
N_BINS = ((1, "1"), (4, "2-4"))
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class SamplingBins(NamedTuple):
    """One request's bins, in ``PARAMS`` order."""

    temperature: str
    top_p: str
    max_tokens: str
    n: str
    stream: str
    tools: str
    response_format: str


PARAMS = SamplingBins._fields
VALUES: dict[str, tuple[str, ...]] = {  # every label value each parameter can take
    "temperature": (DEFAULT, *(label for _, label in TEMPERATURE_BINS), INVALID),
    "top_p": (DEFAULT, *(label for _, label in TOP_P_BINS), INVALID),
    "max_tokens": (DEFAULT, *(label for _, label in MAX_TOKENS_BINS), ">4096", INVALID),
    "n": (*(label for _, label in N_BINS), ">4", INVALID),
    "stream": ("true", "false"),
    "tools": ("true", "false"),
    "response_format": ("none", *RESPONSE_FORMATS, "other"),
}


def _bin(value: Any, bins: tuple[tuple[float, str], ...], above: str, *, above_zero: bool = False) -> str:
    """``above``: the label past the last bound (``invalid`` where vLLM refuses it)."""
    if value is None:
        return DEFAULT
    number = _number(value)
    if number is None or number < 0 or (above_zero and number == 0):
        return INVALID
    for bound, label in bins:
        if number <= bound:
            return label
    return above


def _number(value: Any) -> float | None:
    """A sampling parameter as vLLM reads it: its request model (pydantic, lax) takes
    ``"0.7"`` and ``true`` as numbers too."""
    if isinstance(value, (bool, int, float, str)):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if number == number else None  # NaN is no number vLLM takes
    return None


def response_format(payload: Mapping[str, Any]) -> str:
    fmt = payload.get("response_format")
    if fmt is None:
        return "none"
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    return kind if kind in RESPONSE_FORMATS else "other"


def sampling_bins(payload: Mapping[str, Any], *, stream: bool, default_max_tokens: bool) -> SamplingBins:
    """``default_max_tokens``: the client set no limit (the gateway sent one), which is the
    client's configuration that counts here."""
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    return SamplingBins(
        _bin(payload.get("temperature"), TEMPERATURE_BINS, INVALID),
        _bin(payload.get("top_p"), TOP_P_BINS, INVALID, above_zero=True),
        DEFAULT if default_max_tokens else _bin(max_tokens, MAX_TOKENS_BINS, ">4096"),
        _bin(1 if payload.get("n") is None else payload["n"], N_BINS, ">4"),
        "true" if stream else "false",
        "true" if payload.get("tools") or payload.get("functions") else "false",
        response_format(payload),
    )
