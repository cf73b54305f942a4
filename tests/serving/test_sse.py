"""SSE splitting, token accounting and the relay's per-event decisions."""

import orjson
import pytest

from inferwatch.serving.sse import EventProcessor, SSESplitter, StreamAccount, chunk_logprobs, is_token_event


def chat_chunk(content=None, role=None, finish=None, logprobs=None) -> bytes:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})


USAGE = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'
DONE = b"data: [DONE]"


def stream_bytes(*events: bytes) -> bytes:
    return b"".join(e + b"\n\n" for e in events)


def test_splitter_reassembles_events_cut_anywhere():
    raw = stream_bytes(chat_chunk(role="assistant", content=""), chat_chunk("Hel"), chat_chunk("lo"), USAGE, DONE)
    for cut in range(1, len(raw)):
        splitter = SSESplitter()
        events = splitter.feed(raw[:cut]) + splitter.feed(raw[cut:])
        assert events == [chat_chunk(role="assistant", content=""), chat_chunk("Hel"), chat_chunk("lo"), USAGE, DONE]
        assert splitter.pending == b""


def test_splitter_accepts_crlf_line_endings():
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\r\n\r\ndata: b\r\n\r\n") == [b"data: a", b"data: b"]


@pytest.mark.parametrize("event, expected", [
    (chat_chunk(role="assistant", content=""), False),
    (chat_chunk("x"), True),
    (chat_chunk("", finish="stop"), False),
    (chat_chunk("x", finish="stop"), True),
    (chat_chunk("", logprobs={"content": [{"token": "", "logprob": -1.0}]}), True),  # half a UTF-8 char
    (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', False),
    (b'data: {"choices":[{"index":0,"text":"ab","finish_reason":null}]}', True),
    (b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}', False),
    (USAGE, False),
    (DONE, False),
    # a generated text that looks like a marker is escaped inside JSON and stays a token
    (chat_chunk('"content":""'), True),
])
def test_token_event_detection(event, expected):
    assert is_token_event(event) is expected


def test_account_timing_math():
    acc = StreamAccount(started=10.0)
    for t in (10.5, 10.6, 10.8, 11.1):
        acc.on_token(t)
    acc.on_usage({"prompt_tokens": 5, "completion_tokens": 4})
    assert acc.ttft == pytest.approx(0.5)
    assert acc.gaps == pytest.approx([0.1, 0.2, 0.3])
    assert acc.tpot() == pytest.approx(0.6 / 3)


def test_tpot_uses_usage_tokens_when_chunks_carry_several_tokens():
    acc = StreamAccount(started=0.0)
    acc.on_token(1.0)
    acc.on_token(2.0)  # two chunks, but upstream says 11 tokens were generated
    acc.on_usage({"prompt_tokens": 1, "completion_tokens": 11})
    assert acc.tpot() == pytest.approx(0.1)


def test_tpot_undefined_for_single_token_and_no_tokens():
    acc = StreamAccount(started=0.0)
    assert acc.ttft is None and acc.tpot() is None
    acc.on_token(1.0)
    acc.on_usage({"completion_tokens": 1})
    assert acc.tpot() is None


def run(processor: EventProcessor, *events: bytes, now: float = 1.0) -> bytes:
    return processor.process(list(events), now)


def test_processor_strips_usage_the_client_did_not_ask_for():
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=True, read_logprobs=False, strip_logprobs=False)
    out = run(p, chat_chunk("a"), chat_chunk("b", finish="length"), USAGE, DONE)
    assert out == stream_bytes(chat_chunk("a"), chat_chunk("b", finish="length"), DONE)
    assert (acc.prompt_tokens, acc.completion_tokens, acc.token_events) == (7, 3, 2)
    assert acc.finish_reasons == ["length"] and acc.done


def test_processor_keeps_usage_when_client_asked():
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=False, read_logprobs=False, strip_logprobs=False)
    assert run(p, USAGE, DONE) == stream_bytes(USAGE, DONE)


def test_processor_forwards_bytes_untouched_without_capture():
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=True, read_logprobs=False, strip_logprobs=False)
    weird = b'data: {"choices":[{"delta":{"content":"\\u00e9t\\u00e9"},"index":0}],"extra":1}'
    assert run(p, weird) == weird + b"\n\n"


def test_processor_reads_and_strips_logprobs_it_added():
    lp = {"content": [{"token": "a", "logprob": -1.5, "top_logprobs": []}]}
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=True, read_logprobs=True, strip_logprobs=True)
    out = run(p, chat_chunk("a", logprobs=lp), chat_chunk("", logprobs={"content": [{"logprob": -0.5}]}),
              chat_chunk("", finish="stop"))
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["choices"][0]["logprobs"] for e in events] == [None, None, None]
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["a", "", ""]
    assert acc.mean_logprob == pytest.approx(-1.0)
    assert acc.token_events == 2


def test_processor_reads_but_keeps_logprobs_the_client_asked_for():
    lp = {"content": [{"token": "a", "logprob": -2.0}]}
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=True, read_logprobs=True, strip_logprobs=False)
    event = chat_chunk("a", logprobs=lp)
    assert run(p, event) == event + b"\n\n"
    assert acc.mean_logprob == -2.0


def test_processor_records_upstream_error_event():
    acc = StreamAccount(0.0)
    p = EventProcessor(acc, "chat", strip_usage=True, read_logprobs=False, strip_logprobs=False)
    err = b'data: {"error":{"message":"boom","code":500}}'
    assert run(p, err) == err + b"\n\n"
    assert acc.upstream_error == b'{"error":{"message":"boom","code":500}}'


def test_completion_logprobs_shape():
    choices = [{"logprobs": {"token_logprobs": [None, -1.0, -3.0]}}, {"logprobs": None}]
    assert chunk_logprobs(choices, "completions") == [-1.0, -3.0]


def completion_chunk(text, finish=None, logprobs=None, index=0) -> bytes:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}
    return b"data: " + orjson.dumps({"id": "c2", "object": "text_completion", "created": 5, "model": "m",
                                     "choices": [choice]})


def _both_ways(route: str, events: list[bytes], read_logprobs: bool = False):
    """Each event through ``process`` alone, and through ``token_as_is`` first (as the relay
    does): the accounts and the bytes relayed must come out the same."""
    results = []
    for shortcut in (False, True):
        account = StreamAccount(0.0)
        processor = EventProcessor(account, route, strip_usage=False, read_logprobs=read_logprobs,
                                   strip_logprobs=False)
        out, taken = [], 0
        for i, event in enumerate(events):
            chunk = event + b"\n\n"
            if shortcut and processor.token_as_is(chunk, float(i + 1)):
                out.append(chunk)
                taken += 1
            else:
                out.append(processor.process([event], float(i + 1)))
        results.append((b"".join(out), account, taken))
    (plain_out, plain, _), (short_out, short, taken) = results
    assert short_out == plain_out
    assert (short.token_events, short.gaps, short.first_token, short.last_token, short.finish_reasons,
            short.prompt_tokens, short.completion_tokens, short.logprob_count, short.done, short.units.tolist(),
            short.text_seen) == \
           (plain.token_events, plain.gaps, plain.first_token, plain.last_token, plain.finish_reasons,
            plain.prompt_tokens, plain.completion_tokens, plain.logprob_count, plain.done, plain.units.tolist(),
            plain.text_seen)
    return taken


TRICKY_TEXTS = ["Hel", "", 'say "hi"', "back\\slash", "new\nline", "ünïcödé 🙂", '"},{"index":1', "\\", "tab\t"]


def test_token_shortcut_agrees_with_the_full_path_for_chat():
    events = [chat_chunk(role="assistant", content=""), *[chat_chunk(t) for t in TRICKY_TEXTS],
              chat_chunk("x", finish="stop"), chat_chunk("y", logprobs={"content": [{"logprob": -0.5}]}),
              b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},'
              b'"logprobs":null,"finish_reason":"stop"},{"index":1,"delta":{"content":"b"},"logprobs":null,'
              b'"finish_reason":null}]}',  # two choices, the first finishing: starts and ends like a plain token
              chat_chunk("z"), USAGE, DONE]
    taken = _both_ways("chat", events)
    assert taken >= 5  # the quote-free texts after the first one took the shortcut


def test_token_shortcut_agrees_with_the_full_path_for_completions_and_logprob_capture():
    events = [completion_chunk(t) for t in TRICKY_TEXTS] + [
        completion_chunk("q", logprobs={"token_logprobs": [-1.0]}), completion_chunk("r", finish="length"),
        completion_chunk("s", index=1), USAGE, DONE]
    assert _both_ways("completions", events) >= 4
    assert _both_ways("completions", events, read_logprobs=True) >= 4


def test_a_chunk_of_two_events_or_a_changed_shape_takes_the_full_path():
    account = StreamAccount(0.0)
    processor = EventProcessor(account, "chat", strip_usage=False, read_logprobs=False, strip_logprobs=False)
    processor.process([chat_chunk("a")], 1.0)
    assert processor.token_as_is(chat_chunk("b") + b"\n\n", 2.0)
    assert not processor.token_as_is(chat_chunk("c") + b"\n\n" + chat_chunk("d") + b"\n\n", 3.0)
    assert not processor.token_as_is(chat_chunk("e", finish="stop") + b"\n\n", 3.0)
    assert not processor.token_as_is(chat_chunk("f") + b"\r\n\r\n", 3.0)
    assert not processor.token_as_is(DONE + b"\n\n", 3.0)
    assert account.token_events == 2
