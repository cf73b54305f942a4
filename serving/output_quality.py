"""What is wrong with an answer, read from the units the gateway relays, without keeping text.

A unit is a streamed token event's text (vLLM sends one token per event) or, for an answer
read whole, a word or punctuation mark (``words``): the gateway never sees token ids of a
non-streamed answer. Each unit is kept only as its hash in the request's ``StreamAccount``
while the request runs (``array('q')``, 8 bytes a unit); the text itself is never stored,
logged, traced or sent, and the hashes go with the request.

Repetition is the share of n-grams that repeat an earlier one, 1 - distinct / total, with
n = 4: Welleck et al.'s seq-rep-4 ("Neural Text Generation with Unlikelihood Training",
2019), the measure degenerate repetition is usually reported in. Shorter n-grams repeat in
fluent text (articles, "of the"); 4-grams of fluent text rarely do, so fluent answers sit
under 0.05 and a looping one near 1. Answers of fewer than ``MIN_UNITS`` units have none:
three 4-grams say nothing about a habit.

A loop is an answer whose tail is one span repeated: the last ``LOOP_MIN_REPEATS`` or more
copies of a span of 1..``LOOP_MAX_PERIOD`` units, covering at least ``LOOP_MIN_UNITS``
(32 of one token, 8 copies of four, 4 of eight or more). A repeated phrase inside an
answer that then moves on is repetition, not a loop: the flag is for the decoder caught
in a cycle until max_tokens cut it.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass

import orjson

N = 4
MIN_UNITS = 2 * N
LOOP_MAX_PERIOD = 64
LOOP_MIN_REPEATS = 4
LOOP_MIN_UNITS = 32
LOOP_TAIL = 1024  # units looked back at for a loop: bounds the work per answer

_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True, slots=True)
class OutputQuality:
    repetition: float | None  # seq-rep-4; None below MIN_UNITS units
    loop: bool
    empty: bool  # no text, or whitespace only
    single_token: bool  # stopped after its first token


def is_blank(text: str) -> bool:
    """Whether an answer's text is whitespace only, as Python's ``str.isspace`` has it (U+3000,
    U+00A0, form feed and vertical tab included): the one test of a streamed answer's tokens
    and of an answer read whole, so the two cannot disagree."""
    return not text or text.isspace()


def is_blank_escaped(raw: bytes) -> bool:
    """``is_blank`` of a streamed token's text as it came, JSON-escaped (``\\n``, ``\\u3000``).
    Decoded only until an answer's first text that is not blank."""
    try:
        text = orjson.loads(b'"' + raw + b'"')
    except orjson.JSONDecodeError:
        return False
    return isinstance(text, str) and is_blank(text)


def words(text: str) -> array:
    """A whole answer's units: words and punctuation marks, hashed."""
    return array("q", map(hash, _WORD.findall(text)))


def repetition(units: array) -> float | None:
    if len(units) < MIN_UNITS:
        return None
    grams = list(zip(units, units[1:], units[2:], units[3:]))
    return 1.0 - len(set(grams)) / len(grams)


def ends_in_loop(units: array) -> bool:
    tail = units[-LOOP_TAIL:]
    size = len(tail)
    for period in range(1, min(LOOP_MAX_PERIOD, size // LOOP_MIN_REPEATS) + 1):
        run = 0  # units at the end that equal the unit one period before
        i = size - 1
        while i >= period and tail[i] == tail[i - period]:
            run += 1
            i -= 1
        covered = run + period
        if covered >= LOOP_MIN_UNITS and covered >= LOOP_MIN_REPEATS * period:
            return True
    return False


def assess(units: array, text_seen: bool, finish_reason: str | None, completion_tokens: int | None,
           tool_called: bool = False) -> OutputQuality:
    """An answer that ended (a finish reason came). Tool calls are an answer without text,
    not an empty one, whatever the finish reason: vLLM ends a call of a function named in
    ``tool_choice`` with ``stop``, and ``tool_calls`` only for ``auto`` or ``required``."""
    return OutputQuality(
        repetition=repetition(units),
        loop=ends_in_loop(units),
        empty=not text_seen and not tool_called and finish_reason != "tool_calls",
        single_token=completion_tokens == 1 and finish_reason == "stop",
    )
