"""The segments' drift: GET /v1/drift (verdicts), /v1/drift/exact (exact tests on raw
samples), /v1/compare (two variants' windows), /v1/features (the features and their bins).
Handlers that score or calibrate are plain functions: FastAPI runs them on its thread pool,
so /health and ingest never wait behind them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import FastAPI, Query
from starlette.responses import JSONResponse, Response

from inferwatch.drift import api
from inferwatch.drift.errors import error_response
from inferwatch.drift.feature_record import TEXT_MAX
from inferwatch.drift.schema import FEATURES, NUMERIC_FEATURES, UNITS, NumericFeature
from inferwatch.drift.service.http import responses
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.service.views import features_json, segment_json
from inferwatch.drift.windows import Segment

SegmentParam = Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX)]
if TYPE_CHECKING:  # the names are Literals built from the schema at import; mypy sees strings
    FeatureParam = str | None
    NumericName = str
else:
    FeatureParam = Annotated[Literal[tuple(FEATURES)] | None, Query()]
    NumericName = Literal[tuple(f.name for f in NUMERIC_FEATURES)]


def selected(state: DriftState, model: str | None, variant: str | None) -> list[Segment]:
    return [s for s in state.ingest.segments()
            if (model is None or s[0] == model) and (variant is None or s[1] == variant)]


def install(app: FastAPI, state: DriftState) -> None:
    @app.get("/v1/features", responses=responses(list[api.FeatureInfo]),
             summary="Features, units and the bins uploaded baselines count on")
    async def features_get() -> Response:
        return JSONResponse([
            {"name": f.name, "unit": UNITS[f.name], "description": f.description,
             **({"edges": f.edges.values.tolist()} if isinstance(f, NumericFeature)
                else {"categories": list(f.categories)})}
            for f in FEATURES.values()])

    @app.get("/v1/drift", responses=responses(api.DriftResponse, 400), summary="Verdicts per segment")
    def drift_get(model: SegmentParam = None, variant: SegmentParam = None,
                  feature: FeatureParam = None) -> Response:
        return JSONResponse({"segments": [segment_json(state, s, feature) for s in selected(state, model, variant)]})

    @app.get("/v1/compare", responses=responses(api.CompareResponse, 400, 404),
             summary="A/B: variant b's window against variant a's")
    def compare(model: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                a: Annotated[str, Query(min_length=1, max_length=TEXT_MAX, description="the reference variant")],
                b: Annotated[str, Query(min_length=1, max_length=TEXT_MAX,
                                        description="the variant compared with a; not a")]) -> Response:
        if a == b:
            return error_response(400, "give two different variants 'a' (reference) and 'b'", "invalid_query",
                                  field="b")
        verdict = state.verdicts.compare(model, a, b)
        if verdict is None:
            return error_response(404, f"no current window for model '{model}' variant '{a}' and/or '{b}'",
                                  "no_data")
        return JSONResponse({"model": model, "a": a, "b": b, "status": verdict.status, "alpha": verdict.alpha,
                             "records": {"a": state.ingest.records((model, a)), "b": state.ingest.records((model, b))},
                             "drifted_features": verdict.drifted_features, "features": features_json(verdict)})

    @app.get("/v1/drift/exact", responses=responses(api.ExactResponse, 400, 404),
             summary="KS and Wasserstein on raw samples (audit)")
    async def drift_exact(model: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                          variant: Annotated[str, Query(min_length=1, max_length=TEXT_MAX)],
                          feature: Annotated[NumericName, Query()]) -> Response:
        if (model, variant) not in state.ingest.segments():
            return error_response(404, f"no segment model '{model}' variant '{variant}'", "no_data")
        return JSONResponse(state.verdicts.exact((model, variant), feature))
