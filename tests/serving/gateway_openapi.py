"""An OpenAPI document for the gateway's own endpoints, for fuzzing.

The gateway publishes none (``openapi_url=None``: it proxies OpenAI's API, whose contract
is OpenAI's and vLLM's). This one states exactly what the gateway itself accepts
(serving/validation.py, serving/feedback.py): the fields it checks before vLLM sees a
request (model, messages or prompt, stream, stream_options, the token limits, n), the
rating of an answer, the error object of every 4xx it answers, and the probes and
/metrics. Fields it passes through untouched are left open (any value, any extra field):
what vLLM makes of them is vLLM's contract, not the gateway's."""

from __future__ import annotations

from inferwatch.serving.feedback import MAX_ID_CHARS
from inferwatch.serving.validation import MAX_CHOICES

ERROR = {"$ref": "#/components/schemas/Error"}
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string", "minLength": 1}}}
JSON_ERROR = {"content": {"application/json": {"schema": ERROR}}}
LIMITS = "Integers are JSON integers written without a fraction (a 2.0 is refused)."


def _errors(*codes: int) -> dict:
    return {str(code): {"description": "an OpenAI error object", **JSON_ERROR} for code in codes}


def _generation(route: str, models: list[str], max_tokens: int) -> dict:
    limit = {"type": ["integer", "null"], "minimum": 1, "maximum": max_tokens}
    properties: dict = {
        "model": {"type": "string", "enum": models},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": ["object", "null"], "description": "include_usage: whether the client gets the "
                                                                      "usage chunk (read as true or false)"},
        "max_tokens": limit,
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_CHOICES},
    }
    if route == "chat":
        properties["messages"] = {"type": "array", "minItems": 1, "description": "the messages, vLLM's to check"}
        properties["max_completion_tokens"] = limit
        required = ["model", "messages"]
    else:
        properties["prompt"] = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1}],
                                "description": "text, texts or token ids, vLLM's to check"}
        required = ["model", "prompt"]
    answer = {"type": "object", "required": ["choices"], "properties": {"choices": {"type": "array"}}}
    return {"post": {
        "operationId": route,
        "description": LIMITS,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": required, "properties": properties}}}},
        "responses": {"200": {"description": "the answer, or its stream",
                              "content": {"application/json": {"schema": answer},
                                          "text/event-stream": {"schema": SSE_EVENT}}},
                      **_errors(400, 404, 413)},
    }}


FEEDBACK = {"post": {
    "operationId": "feedback",
    "description": "A rating of an answer the gateway relayed, by its id: exactly one of score and thumbs.",
    "requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False, "required": ["response_id"],
        "properties": {"response_id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                       "score": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                       "thumbs": {"enum": ["up", "down", None]}},
        "oneOf": [{"required": ["score"], "properties": {"score": {"type": "number"}}},
                  {"required": ["thumbs"], "properties": {"thumbs": {"enum": ["up", "down"]}}}]}}}},
    "responses": {"200": {"description": "the rating, as forwarded", "content": {"application/json": {"schema": {
        "type": "object", "required": ["response_id", "model", "variant", "score"]}}}},
        **_errors(400, 404, 409, 413, 503)},
}}


def gateway_openapi(models: list[str], max_tokens: int) -> dict:
    """The document, for a gateway whose upstream serves ``models`` with its token limit."""
    plain = {"type": "object"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferwatch gateway (its own contract)", "version": "1"},
        "paths": {
            "/v1/chat/completions": _generation("chat", models, max_tokens),
            "/v1/completions": _generation("completions", models, max_tokens),
            "/v1/feedback": FEEDBACK,
            "/v1/models": {"get": {"responses": {"200": {"description": "upstream's model list", "content": {
                "application/json": {"schema": {"type": "object", "required": ["data"],
                                                "properties": {"data": {"type": "array"}}}}}}}}},
            "/health": {"get": {"responses": {"200": {"description": "alive",
                                                      "content": {"application/json": {"schema": plain}}}}}},
            "/ready": {"get": {"responses": {"200": {"description": "upstream answers",
                                                     "content": {"application/json": {"schema": plain}}}}}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus exposition",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"schemas": {"Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["message", "type", "code"],
                                     "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                                    "param": {"type": ["string", "null"]},
                                                    "code": {"type": ["string", "integer", "null"]}}}}}}},
    }
