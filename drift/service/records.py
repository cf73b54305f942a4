"""POST /v1/ingest (feature records) and POST /v1/feedback (ratings), from the gateway."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import Counter
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwatch.drift import api
from inferwatch.drift.errors import error_response
from inferwatch.drift.feedback import FeedbackBatch
from inferwatch.drift.schema import BatchError
from inferwatch.drift.service.http import Bodies, invalid_body, responses
from inferwatch.drift.service.state import DriftState


def install(app: FastAPI, state: DriftState, bodies: Bodies, ingested: Counter) -> None:
    @app.post("/v1/ingest", responses=responses(api.IngestResponse, 401, 413, 422),
              openapi_extra=bodies.documented(api.IngestRequest), summary="Feature records from the gateway")
    async def ingest(request: Request) -> Response:
        body = await bodies.read(request)
        if isinstance(body, Response):
            return body
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 255:
            return error_response(422, "the Idempotency-Key header must be 1 to 255 characters",
                                  "invalid_idempotency_key", field="idempotency-key")
        try:
            counts = await run_in_threadpool(state.ingest.add, body, key)  # off the loop: /health answers
        except BatchError as exc:
            bodies.rejected.labels("invalid").inc()
            return error_response(422, str(exc), "invalid_batch", record=exc.record, field=exc.field)
        if counts is None:
            bodies.rejected.labels("duplicate").inc()
            return JSONResponse({"accepted": 0, "in_window": 0, "duplicate": True})
        ingested.inc(counts[0])
        return JSONResponse({"accepted": counts[0], "in_window": counts[1]})

    @app.post("/v1/feedback", responses=responses(api.FeedbackResponse, 401, 413, 422),
              openapi_extra=bodies.documented(FeedbackBatch),
              summary="User ratings joined to their variant, from the gateway")
    async def feedback_post(request: Request) -> Response:
        doc = await bodies.read_object(request)
        if isinstance(doc, Response):
            return doc
        try:
            batch = FeedbackBatch.model_validate(doc)
        except ValidationError as exc:
            return invalid_body(exc, "invalid_feedback")
        kept, duplicates = await run_in_threadpool(state.ratings.add, batch)
        return JSONResponse({"accepted": kept, "duplicates": duplicates})
