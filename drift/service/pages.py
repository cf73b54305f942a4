"""GET /report (the HTML report of every segment and experiment), /metrics and /health."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query
from prometheus_client import CollectorRegistry, generate_latest
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from inferwatch.drift import api
from inferwatch.drift.ab import report as ab_report
from inferwatch.drift.ab.exposition import Watchlist
from inferwatch.drift.service import report
from inferwatch.drift.service.http import responses
from inferwatch.drift.service.segments import SegmentParam, selected
from inferwatch.drift.service.state import DriftState


def install(app: FastAPI, state: DriftState, watchlist: Watchlist, registry: CollectorRegistry) -> None:
    @app.get("/report", response_class=HTMLResponse, responses={400: {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}},
             summary="The HTML report")
    def report_get(model: SegmentParam = None, variant: SegmentParam = None,
                   detail: Annotated[int, Query(ge=0, le=200, description="sections shown in full, worst first; "
                                                "the rest are summary rows")] = report.DETAIL) -> Response:
        rows = []
        for segment in selected(state, model, variant):
            verdict = state.verdicts.verdict(segment)
            if verdict is not None:
                rows.append(report.SegmentReport(segment, state.baselines.held[segment], state.ingest.current(segment),
                                                 verdict, state.verdicts.history(segment),
                                                 state.verdicts.drifting_since(segment), state.ingest.records(segment)))
        return HTMLResponse(report.render(rows, state.clock(), ab_report.sections(state.ledgers, watchlist, model),
                                          detail))

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus exposition")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health", responses=responses(api.Health), summary="Liveness")
    async def health() -> Response:
        return JSONResponse({"status": "ok", **state.ingest.snapshot._asdict()})  # no lock: never waits for an ingest
