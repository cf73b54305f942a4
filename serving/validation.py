"""Check an OpenAI-style request body before it costs the upstream anything.

Pure functions: bytes and the known models in, a ``ParsedRequest`` or a ``GatewayError``
out. The gateway only checks what it must to route, meter and protect vLLM; everything
else (sampling parameters, tools, ...) is vLLM's to validate and passes through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from inferwatch.serving.errors import NOT_FOUND, GatewayError

Route = Literal["chat", "completions"]

ROUTE_PATHS: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_model_len: int | None = None
    # a LoRA adapter's base model (vLLM's /v1/models says it as ``parent``): the model the
    # metrics count the adapter's requests under, as vLLM's own counters do
    parent: str | None = None

    @property
    def base(self) -> str:
        return self.parent or self.id


@dataclass(frozen=True)
class ParsedRequest:
    route: Route
    model: str
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage asked by the client
    client_wants_logprobs: bool
    max_tokens: int | None  # what vLLM will generate at most, as far as the request says
    payload: dict[str, Any]
    default_max_tokens: bool = False  # the client set no limit: the gateway sends max_tokens
    n: int = 1  # choices asked for: vLLM processes (and counts) the prompt once per choice
    base_model: str = ""  # the adapter's base model, or the model itself (ModelInfo.base)


MAX_CHOICES = 128  # OpenAI's own bound on n


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

    max_tokens, default = _max_tokens(route, payload, info, max_tokens_limit)

    logprobs = payload.get("logprobs")
    client_wants_logprobs = logprobs is not None and logprobs is not False

    n = payload.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        # vLLM would coerce "2" or 2.0 and answer n choices; counting and admission need the
        # number (JSON integers past 64 bits arrive as floats, and are refused here too)
        raise GatewayError(400, "invalid_n", f"Field 'n' must be a whole number of choices from 1 to {MAX_CHOICES}.",
                           param="n")
    choices = n

    return ParsedRequest(route, model, stream, client_wants_usage, client_wants_logprobs, max_tokens, payload,
                         default_max_tokens=default, n=choices, base_model=info.base)


# The fields that cap generation, in the order vLLM reads them (the first one set wins):
# chat takes max_completion_tokens over max_tokens; completions know only max_tokens.
LIMIT_FIELDS: dict[Route, tuple[str, ...]] = {"chat": ("max_completion_tokens", "max_tokens"),
                                               "completions": ("max_tokens",)}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI API's (and vLLM's) default for /v1/completions


def _max_tokens(route: Route, payload: dict[str, Any], info: ModelInfo, limit: int) -> tuple[int | None, bool]:
    """The most tokens vLLM may generate for this request, and whether the gateway must send
    it because the client set none.

    Every limit field the client sets must be within the limit, whichever vLLM reads, so no
    field can carry a larger value past the check. A chat request without one would run to
    the end of the context, so it gets the limit (when the model's context is longer); a
    completion without one gets the API's default of 16, capped by the limit.
    """
    ceiling = min(limit, info.max_model_len) if info.max_model_len else limit
    effective = None
    for field in LIMIT_FIELDS[route]:
        value = payload.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise GatewayError(400, "invalid_max_tokens", f"Field '{field}' must be an integer.", param=field)
        if not 1 <= value <= ceiling:
            raise GatewayError(400, "invalid_max_tokens",
                               f"Field '{field}' is {value}; it must be between 1 and {ceiling} for model "
                               f"'{info.id}'.", param=field)
        if effective is None:
            effective = value
    if effective is not None:
        return effective, False
    if route == "completions":
        return min(COMPLETIONS_DEFAULT_MAX_TOKENS, limit), limit < COMPLETIONS_DEFAULT_MAX_TOKENS
    if info.max_model_len is not None and info.max_model_len <= limit:
        return None, False  # vLLM stops at the end of the context, which is within the limit
    return limit, True


def upstream_payload(req: ParsedRequest, capture_logprobs: bool) -> tuple[dict[str, Any], bool]:
    """The body to send upstream and whether it differs from what the client sent.

    A request that sets no token limit gets the gateway's (see ``_max_tokens``). Streams
    always ask for usage (token counts must come from vLLM, not be guessed), and logprobs are
    requested when confidence capture is on; the relay removes whatever the
    client did not ask for, so the client sees the answer it would have got directly.
    """
    payload = req.payload
    changed = False
    if req.default_max_tokens:
        payload = {**payload, "max_tokens": req.max_tokens}
        changed = True
    if req.stream and not req.client_wants_usage:
        payload = {**payload, "stream_options": {**(payload.get("stream_options") or {}), "include_usage": True}}
        changed = True
    if capture_logprobs and not req.client_wants_logprobs:
        payload = {**payload, "logprobs": True if req.route == "chat" else 0}
        changed = True
    return payload, changed
