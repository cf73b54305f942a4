"""Check an OpenAI-style request body before it costs the upstream anything.

Pure functions: bytes and the known models in, a ``ParsedRequest`` or a ``GatewayError``
out. The gateway only checks what it must to route, meter and protect vLLM; everything
else (sampling parameters, tools, ...) is vLLM's to validate and passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

import orjson

from serving.errors import NOT_FOUND, GatewayError

Route = Literal["chat", "completions"]

ROUTE_PATHS: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_model_len: int | None = None


@dataclass(frozen=True)
class ParsedRequest:
    route: Route
    model: str
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage asked by the client
    client_wants_logprobs: bool
    max_tokens: int | None
    payload: dict[str, Any]


def parse_request(route: Route, body: bytes, models: Mapping[str, ModelInfo], max_tokens_limit: int) -> ParsedRequest:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, "invalid_json", f"Request body is not valid JSON: {exc}.") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "invalid_body", "Request body must be a JSON object.")

    model = payload.get("model")
    if model is None or model == "":
        raise GatewayError(400, "missing_model", "Field 'model' is required; GET /v1/models lists the served models.",
                           param="model")
    if not isinstance(model, str):
        raise GatewayError(400, "invalid_model", "Field 'model' must be a string.", param="model")
    info = models.get(model)
    if info is None:
        served = ", ".join(sorted(models)) or "none"
        raise GatewayError(404, "model_not_found", f"The model '{model[:200]}' does not exist. Served models: {served}.",
                           param="model", error_type=NOT_FOUND)

    if route == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise GatewayError(400, "invalid_messages", "Field 'messages' must be a non-empty list of messages.",
                               param="messages")
    else:
        prompt = payload.get("prompt")
        if prompt is None or isinstance(prompt, (bool, int, float, dict)) or prompt == "" or prompt == []:
            raise GatewayError(400, "invalid_prompt",
                               "Field 'prompt' must be a non-empty string, list of strings or list of token ids.",
                               param="prompt")

    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise GatewayError(400, "invalid_stream", "Field 'stream' must be true or false.", param="stream")

    stream_options = payload.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise GatewayError(400, "invalid_stream_options", "Field 'stream_options' must be an object.",
                           param="stream_options")
    client_wants_usage = bool(stream_options and stream_options.get("include_usage"))

    max_tokens = _max_tokens(route, payload, info, max_tokens_limit)

    logprobs = payload.get("logprobs")
    client_wants_logprobs = logprobs is not None and logprobs is not False

    return ParsedRequest(route, model, stream, client_wants_usage, client_wants_logprobs, max_tokens, payload)


def _max_tokens(route: Route, payload: dict[str, Any], info: ModelInfo, limit: int) -> int | None:
    field = "max_tokens"
    value = payload.get("max_tokens")
    if route == "chat" and value is None and payload.get("max_completion_tokens") is not None:
        field, value = "max_completion_tokens", payload["max_completion_tokens"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise GatewayError(400, "invalid_max_tokens", f"Field '{field}' must be an integer.", param=field)
    ceiling = min(limit, info.max_model_len) if info.max_model_len else limit
    if not 1 <= value <= ceiling:
        raise GatewayError(400, "invalid_max_tokens",
                           f"Field '{field}' is {value}; it must be between 1 and {ceiling} for model '{info.id}'.",
                           param=field)
    return value


def upstream_payload(req: ParsedRequest, capture_logprobs: bool) -> tuple[dict[str, Any], bool]:
    """The body to send upstream and whether it differs from what the client sent.

    Streams always ask for usage (token counts must come from vLLM, not be guessed), and
    logprobs are requested when confidence capture is on; the relay removes whatever the
    client did not ask for, so the client sees the answer it would have got directly.
    """
    payload = req.payload
    changed = False
    if req.stream and not req.client_wants_usage:
        payload = {**payload, "stream_options": {**(payload.get("stream_options") or {}), "include_usage": True}}
        changed = True
    if capture_logprobs and not req.client_wants_logprobs:
        payload = {**payload, "logprobs": True if req.route == "chat" else 0}
        changed = True
    return payload, changed
