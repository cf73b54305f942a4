"""The answer's quality signals: repetition against a count of n-grams written out here,
loops and blanks at their boundaries, and the stream's units against the texts vLLM sent."""

from array import array
from collections import Counter
from pathlib import Path

import orjson
import pytest

from inferwatch.serving.output_quality import (
    LOOP_MIN_UNITS,
    MIN_UNITS,
    assess,
    ends_in_loop,
    is_blank,
    is_blank_escaped,
    repetition,
    words,
)
from inferwatch.serving.sse import EventProcessor, SSESplitter, StreamAccount

RECORDED = Path(__file__).parent / "data" / "vllm-0.32-chat-stream.sse"


def units(*texts: str) -> array:
    return array("q", map(hash, texts))


def seq_rep(tokens: list[str], n: int = 4) -> float:
    """Welleck et al.'s seq-rep-n, counted on the strings themselves."""
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return 1 - len(grams) / sum(grams.values())


@pytest.mark.parametrize("tokens, expected", [
    (["a", "b", "c", "d", "a", "b", "c", "d", "a", "b", "c", "d"], 1 - 4 / 9),  # 9 four-grams, 4 distinct
    (["a", "b", "c", "d", "e", "f", "g", "h"], 0.0),
    (["x"] * 20, 1 - 1 / 17),
])
def test_repetition_is_the_share_of_repeated_four_grams(tokens, expected):
    assert repetition(units(*tokens)) == pytest.approx(expected)
    assert repetition(units(*tokens)) == pytest.approx(seq_rep(tokens))


def test_short_answers_have_no_repetition():
    assert repetition(units(*["a", "b", "c", "d", "e", "f", "g"])) is None
    assert repetition(units(*["a", "b", "c", "d", "e", "f", "g", "h"][:MIN_UNITS])) is not None


def test_a_loop_is_a_tail_of_one_span_repeated():
    assert ends_in_loop(units(*["some", "words", "first"], *["the"] * LOOP_MIN_UNITS))
    assert not ends_in_loop(units(*["the"] * (LOOP_MIN_UNITS - 1)))
    assert ends_in_loop(units(*["intro"], *["a", "b", "c", "d"] * 8))  # 8 copies of 4: 32 units
    assert not ends_in_loop(units(*["a", "b", "c", "d"] * 7))  # 28 units: too short
    assert not ends_in_loop(units(*[f"w{i}" for i in range(10)] * 3))  # 3 copies of 10: too few
    assert ends_in_loop(units(*[f"w{i}" for i in range(10)] * 4))
    # a repeated stretch the answer then leaves is repetition, not a loop
    looped_then_moved_on = units(*["the"] * 40, *[f"new{i}" for i in range(20)])
    assert not ends_in_loop(looped_then_moved_on) and repetition(looped_then_moved_on) > 0.5


@pytest.mark.parametrize("text", ["", "  ", "\n\n", " \t\r\n", "\u3000\n", "\u00a0", "\f", "\u000b", "\u2003 ",
                                  "a", "\\n", " .", "\u3000x"])
def test_one_blank_test_for_streamed_tokens_and_whole_answers(text):
    """The streamed path reads a token JSON-escaped as vLLM sends it (orjson and json both),
    the whole answer as text: both are ``str.isspace``'s verdict."""
    import json

    import orjson

    expected = not text or text.isspace()
    assert is_blank(text) is expected
    for encoded in (orjson.dumps(text), json.dumps(text).encode(), json.dumps(text, ensure_ascii=False).encode()):
        assert is_blank_escaped(encoded[1:-1]) is expected, encoded


def test_assess_names_empty_single_token_and_tool_calls():
    assert assess(array("q"), False, "stop", 0).empty
    assert not assess(array("q"), False, "tool_calls", 5).empty
    assert not assess(array("q"), False, "stop", 5, tool_called=True).empty  # a named function's call
    assert assess(units("Yes"), True, "stop", 1).single_token
    assert not assess(units("Yes"), True, "length", 1).single_token


def test_words_of_a_whole_answer():
    assert words("Hi, you. Hi, you.") == units("Hi", ",", "you", ".", "Hi", ",", "you", ".")


def _stream_units(data: bytes, shortcut: bool) -> StreamAccount:
    account = StreamAccount(0.0)
    processor = EventProcessor(account, "chat", strip_usage=False, read_logprobs=False, strip_logprobs=False)
    splitter = SSESplitter()
    for i, event in enumerate(data.split(b"\n\n")):
        chunk = event + b"\n\n"
        if not event or (shortcut and not splitter.pending and processor.token_as_is(chunk, float(i))):
            continue
        processor.process(splitter.feed(chunk), float(i))
    return account


def test_a_recorded_vllm_stream_gives_the_units_of_its_texts():
    """The units the relay keeps, shortcut or not, are the texts vLLM sent, one per token event."""
    data = RECORDED.read_bytes()
    texts = [choice["delta"]["content"]
             for event in data.split(b"\n\n") if event.startswith(b"data: {")
             for choice in orjson.loads(event[6:])["choices"]
             if "content" in choice["delta"] and "role" not in choice["delta"]
             and not (choice["finish_reason"] and choice["delta"]["content"] == "")]
    for shortcut in (False, True):
        account = _stream_units(data, shortcut)
        assert len(account.units) == len(texts) == account.token_events
        # equal texts, equal units: the repetition of the units is the texts'
        assert repetition(account.units) == pytest.approx(seq_rep(texts))
        assert account.text_seen is any(t.strip() for t in texts)
