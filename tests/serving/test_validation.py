"""Request validation: what reaches vLLM, and the 4xx a client gets otherwise."""

import orjson
import pytest

from inferwatch.serving.errors import GatewayError
from inferwatch.serving.validation import ModelInfo, parse_request, upstream_payload

MODELS = {"m": ModelInfo("m", max_model_len=512)}


def parse(route, body, limit=32768):
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse_request(route, raw, MODELS, limit)


def rejects(route, body, status, code, param=None, limit=32768):
    with pytest.raises(GatewayError) as info:
        parse(route, body, limit)
    err = info.value
    assert (err.status, err.code, err.param) == (status, code, param)
    body = orjson.loads(err.body())["error"]
    assert body["message"] and body["code"] == code and body["type"]
    return err


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, status, code, param", [
    (b"{not json", 400, "invalid_json", None),
    (b"[1,2]", 400, "invalid_body", None),
    ({"messages": CHAT["messages"]}, 400, "missing_model", "model"),
    ({**CHAT, "model": 3}, 400, "invalid_model", "model"),
    ({**CHAT, "model": "gpt-9"}, 404, "model_not_found", "model"),
    ({"model": "m"}, 400, "invalid_messages", "messages"),
    ({"model": "m", "messages": []}, 400, "invalid_messages", "messages"),
    ({**CHAT, "stream": "yes"}, 400, "invalid_stream", "stream"),
    ({**CHAT, "stream_options": 1}, 400, "invalid_stream_options", "stream_options"),
    ({**CHAT, "max_tokens": 0}, 400, "invalid_max_tokens", "max_tokens"),
    ({**CHAT, "max_tokens": -5}, 400, "invalid_max_tokens", "max_tokens"),
    ({**CHAT, "max_tokens": 10**12}, 400, "invalid_max_tokens", "max_tokens"),
    ({**CHAT, "max_tokens": 1.5}, 400, "invalid_max_tokens", "max_tokens"),
    ({**CHAT, "max_tokens": True}, 400, "invalid_max_tokens", "max_tokens"),
    ({**CHAT, "max_completion_tokens": 513}, 400, "invalid_max_tokens", "max_completion_tokens"),
    ({**CHAT, "n": "2"}, 400, "invalid_n", "n"),  # vLLM would coerce it and answer two choices
    ({**CHAT, "n": 2.0}, 400, "invalid_n", "n"),
    ({**CHAT, "n": 0}, 400, "invalid_n", "n"),
    ({**CHAT, "n": True}, 400, "invalid_n", "n"),
])
def test_chat_rejections(body, status, code, param):
    rejects("chat", body, status, code, param)


@pytest.mark.parametrize("prompt", [None, "", [], 5, {"a": 1}, True])
def test_completion_prompt_rejections(prompt):
    body = {"model": "m"} if prompt is None else {"model": "m", "prompt": prompt}
    rejects("completions", body, 400, "invalid_prompt", "prompt")


def test_max_tokens_ceiling_is_the_smaller_of_limit_and_model_length():
    err = rejects("chat", {**CHAT, "max_tokens": 200}, 400, "invalid_max_tokens", "max_tokens", limit=100)
    assert "between 1 and 100" in err.message
    err = rejects("chat", {**CHAT, "max_tokens": 600}, 400, "invalid_max_tokens", "max_tokens")
    assert "between 1 and 512" in err.message
    assert parse("chat", {**CHAT, "max_tokens": 512}).max_tokens == 512


def test_no_limit_field_gets_past_the_check_whichever_vllm_reads():
    """vLLM reads max_completion_tokens before max_tokens: a small max_tokens must not carry
    a large max_completion_tokens through."""
    rejects("chat", {**CHAT, "max_tokens": 4, "max_completion_tokens": 300}, 400, "invalid_max_tokens",
            "max_completion_tokens", limit=16)
    rejects("chat", {**CHAT, "max_tokens": 300, "max_completion_tokens": 4}, 400, "invalid_max_tokens",
            "max_tokens", limit=16)
    both = parse("chat", {**CHAT, "max_tokens": 12, "max_completion_tokens": 3}, limit=16)
    assert (both.max_tokens, both.default_max_tokens) == (3, False)
    assert upstream_payload(both, capture_logprobs=False) == (both.payload, False)


@pytest.mark.parametrize("route, body, limit, sent", [
    ("chat", CHAT, 16, 16),  # the context (512) is longer than the limit: the limit is sent
    ("chat", CHAT, 512, None),  # vLLM stops at the end of the context, within the limit
    ("completions", {"model": "m", "prompt": "x"}, 8, 8),  # the API default of 16 is over the limit
    ("completions", {"model": "m", "prompt": "x"}, 100, None),  # vLLM's own default of 16 applies
])
def test_a_request_without_a_limit_gets_the_gateways(route, body, limit, sent):
    req = parse(route, body, limit)
    payload, changed = upstream_payload(req, capture_logprobs=False)
    assert payload.get("max_tokens") == sent and changed == (sent is not None)
    assert req.max_tokens == (sent if sent is not None else (16 if route == "completions" else None))


def test_unknown_model_message_lists_served_models():
    err = rejects("chat", {**CHAT, "model": "x"}, 404, "model_not_found", "model")
    assert "Served models: m" in err.message


def test_parsed_fields():
    req = parse("completions", {"model": "m", "prompt": ["a", "b"], "stream": True,
                                "stream_options": {"include_usage": True}, "logprobs": 2})
    assert (req.route, req.model, req.stream, req.client_wants_usage, req.client_wants_logprobs) == \
        ("completions", "m", True, True, True)


def test_upstream_payload_asks_for_usage_and_logprobs_only_when_needed():
    plain = parse("chat", CHAT)
    assert upstream_payload(plain, capture_logprobs=False) == (CHAT, False)

    stream = parse("chat", {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": False}})
    payload, changed = upstream_payload(stream, capture_logprobs=True)
    assert changed and payload["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert payload["logprobs"] is True
    assert "logprobs" not in stream.payload  # the client's request object is not mutated

    comp = parse("completions", {"model": "m", "prompt": "x"})
    assert upstream_payload(comp, capture_logprobs=True)[0]["logprobs"] == 0

    asked = parse("completions", {"model": "m", "prompt": "x", "logprobs": 3})
    assert upstream_payload(asked, capture_logprobs=True) == (asked.payload, False)
