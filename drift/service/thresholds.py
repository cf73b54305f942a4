"""/v1/thresholds: alpha and each method's threshold, read and changed at run time."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.drift import api
from inferwatch.drift.errors import error_response
from inferwatch.drift.schema import BatchError
from inferwatch.drift.service.http import Bodies, invalid_body, responses
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.thresholds import smallest_alpha


def install(app: FastAPI, state: DriftState, bodies: Bodies) -> None:
    thresholds_request = api.thresholds_request(smallest_alpha(state.config.resamples))

    @app.put("/v1/thresholds", responses=responses(api.Thresholds, 401, 413, 422),
             openapi_extra=bodies.documented(thresholds_request), summary="Change alpha or fix a method's threshold")
    async def thresholds_put(request: Request) -> Response:
        doc = await bodies.read_object(request, empty=True)
        if isinstance(doc, Response):
            return doc
        try:
            thresholds_request.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_threshold")
        try:
            return JSONResponse(state.thresholds.set(doc))
        except BatchError as exc:
            return error_response(422, str(exc), "invalid_threshold", field=exc.field)

    @app.get("/v1/thresholds", responses=responses(api.Thresholds), summary="How verdicts are reached")
    async def thresholds_get() -> Response:
        return JSONResponse(state.thresholds.describe())
