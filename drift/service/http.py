"""What every route of the service shares: the bearer token, bodies read within the size
limit, the error answers, and the documented schemas of hand-parsed bodies."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from fastapi import FastAPI
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from inferwatch.drift import api
from inferwatch.drift.errors import error_response


def responses(model: type | None = None, *errors: int) -> dict[int | str, dict[str, Any]]:
    """An operation's documented answers: ``model`` on 200, the error shape on ``errors``."""
    out: dict[int | str, dict[str, Any]] = {code: {"model": api.ErrorResponse} for code in errors}
    if model is not None:
        out[200] = {"model": model}
    return out


class Bodies:
    """Reads the bodies of the write routes: authorised, within ``max_bytes``, JSON objects,
    each refusal counted in ``rejected`` and answered in the service's error shape."""

    def __init__(self, token: bytes | None, max_bytes: int, rejected: Counter) -> None:
        self.token, self.max_bytes, self.rejected = token, max_bytes, rejected
        self.schemas: dict[str, dict[str, Any]] = {}  # of the hand-parsed bodies, published with the app's document

    def authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self.token)

    async def read(self, request: Request) -> bytes | Response:
        if not self.authorized(request):
            self.rejected.labels("unauthorized").inc()
            return error_response(401, "Missing or invalid token: send 'Authorization: Bearer <token>'.",
                                  "invalid_token")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            self.rejected.labels("too_large").inc()
            return error_response(413, f"Body is {declared} bytes; the limit is {self.max_bytes}.", "body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_bytes:
                self.rejected.labels("too_large").inc()
                return error_response(413, f"Body exceeds {self.max_bytes} bytes.", "body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_object(self, request: Request, empty: bool = False) -> dict[str, Any] | Response:
        """An authorised, size-checked JSON object body (``empty``: ``{}`` too), or the error
        response to send."""
        body = await self.read(request)
        if isinstance(body, Response):
            return body
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return error_response(422, f"body is not valid JSON: {exc}", "invalid_json", field="body")
        if not isinstance(doc, dict) or not (doc or empty):
            return error_response(422, "body must be a non-empty JSON object", "invalid_body", field="body")
        return doc

    def documented(self, model: type[BaseModel]) -> dict[str, Any]:
        """Document a hand-parsed JSON body with ``model``'s schema (published by ``publish``)."""
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        self.schemas.update(schema.pop("$defs", {}))
        self.schemas[model.__name__] = schema
        return {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}

    def publish(self, app: FastAPI) -> None:
        """Add the hand-parsed bodies' schemas, and drop FastAPI's automatic 422: query errors
        are a 400 in the service's error shape (routes that answer 422 declare it themselves)."""
        build, request_schemas = app.openapi, self.schemas

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                doc = build()
                schemas = doc.setdefault("components", {}).setdefault("schemas", {})
                schemas.update(request_schemas)
                for operation in (op for path in doc["paths"].values() for op in path.values()):
                    automatic = operation["responses"].get("422", {}).get("content", {}).get("application/json", {})
                    if automatic.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                        del operation["responses"]["422"]
                for name in ("HTTPValidationError", "ValidationError"):
                    schemas.pop(name, None)
                app.openapi_schema = doc
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def invalid_body(exc: ValidationError, code: str) -> Response:
    """A 422 naming the first wrong field by its path in the body (``records.0.at``)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "body"
    return error_response(422, f"'{where}': {first.get('msg', 'invalid')}", code, field=where)
