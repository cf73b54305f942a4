"""/v1/baselines: freeze a segment's baseline from a time range, or upload counts; list them."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.drift import api
from inferwatch.drift.errors import error_response
from inferwatch.drift.feature_record import UNIX_S
from inferwatch.drift.ingest import SegmentLimit
from inferwatch.drift.schema import BatchError
from inferwatch.drift.service.http import Bodies, invalid_body, responses
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.service.views import baseline_json


def install(app: FastAPI, state: DriftState, bodies: Bodies) -> None:
    @app.post("/v1/baselines", status_code=201, responses={201: {"model": api.BaselineInfo},
                                                           **responses(None, 401, 409, 413, 422)},
              openapi_extra=bodies.documented(api.BaselineRequest), summary="Freeze or upload a baseline")
    async def baselines_post(request: Request) -> Response:
        doc = await bodies.read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            req = api.BaselineRequest.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_baseline")
        model, variant = req.model, req.variant
        # each may be left out (None), never null: the model types them as they are when given
        since: float | None = req.from_
        until: float | None = req.to
        histograms: BaseModel | None = req.histograms
        try:
            if histograms is not None:
                if since is not None or until is not None:
                    raise BatchError("give 'from' and 'to', or 'histograms': not both", field="histograms")
                baseline = state.baselines.upload((model, variant), histograms.model_dump())  # 2.0 read as 2
            elif since is None or until is None:
                raise BatchError(f"give 'from' and 'to' (unix seconds, {UNIX_S[0]:g}..{UNIX_S[1]:g}) or 'histograms'",
                                 field="to" if since is not None else "from")
            elif since >= until:
                raise BatchError("'from' must be before 'to'", field="from")
            else:
                baseline = state.baselines.freeze((model, variant), since, until)
        except SegmentLimit as exc:
            return error_response(409, str(exc), "too_many_segments")
        except BatchError as exc:
            return error_response(422, str(exc), "invalid_baseline", field=exc.field)
        return JSONResponse(baseline_json(model, variant, baseline), status_code=201)

    @app.get("/v1/baselines", responses=responses(list[api.BaselineInfo]), summary="Baselines held")
    async def baselines_get() -> Response:
        return JSONResponse([baseline_json(m, v, b) for (m, v), b in sorted(state.baselines.held.items())])
