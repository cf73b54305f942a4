"""An OpenAPI document for the gateway's own endpoints, for fuzzing.

The gateway publishes none (``openapi_url=None``: it proxies OpenAI's API, whose contract
is OpenAI's and vLLM's). This one states what the gateway itself promises: the fields it
checks before vLLM sees a request (model, messages or prompt, stream, stream_options, the
token limits), the error object of every 4xx it answers, and the probes and /metrics.
Fields it passes through untouched are left open (``additionalProperties``)."""

from __future__ import annotations

ERROR = {"$ref": "#/components/schemas/Error"}
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string", "minLength": 1}}}
JSON_ERROR = {"content": {"application/json": {"schema": ERROR}}}


def _errors(*codes: int) -> dict:
    return {str(code): {"description": "an OpenAI error object", **JSON_ERROR} for code in codes}


def _generation(route: str, models: list[str], max_tokens: int) -> dict:
    limit = {"type": "integer", "minimum": 1, "maximum": max_tokens}
    properties: dict = {
        "model": {"type": "string", "enum": models},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": limit,
        "n": {"type": "integer", "minimum": 1, "maximum": 4},
    }
    if route == "chat":
        properties["messages"] = {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["system", "user", "assistant"]},
                           "content": {"type": "string", "maxLength": 200}}}}
        properties["max_completion_tokens"] = limit
        required = ["model", "messages"]
    else:
        properties["prompt"] = {"type": "string", "minLength": 1, "maxLength": 200}
        required = ["model", "prompt"]
    answer = {"type": "object", "required": ["choices"], "properties": {"choices": {"type": "array"}}}
    return {"post": {
        "operationId": route,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": required, "properties": properties}}}},
        "responses": {"200": {"description": "the answer, or its stream",
                              "content": {"application/json": {"schema": answer},
                                          "text/event-stream": {"schema": SSE_EVENT}}},
                      **_errors(400, 404, 413)},
    }}


def gateway_openapi(models: list[str], max_tokens: int) -> dict:
    """The document, for a gateway whose upstream serves ``models`` with its token limit."""
    plain = {"type": "object"}
    return {
        "openapi": "3.0.3",
        "info": {"title": "inferwatch gateway (its own contract)", "version": "1"},
        "paths": {
            "/v1/chat/completions": _generation("chat", models, max_tokens),
            "/v1/completions": _generation("completions", models, max_tokens),
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
