"""GET /v1/fleet-drift: drift from Prometheus histogram buckets over the whole fleet."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import FastAPI, Query
from starlette.responses import JSONResponse, Response

from inferwatch.drift.errors import error_response
from inferwatch.drift.feature_record import UNIX_S
from inferwatch.drift.prometheus_source import METRIC_NAME, SELECTOR, PrometheusSource, SourceError
from inferwatch.drift.service.http import responses
from inferwatch.drift.service.state import DriftState


def install(app: FastAPI, state: DriftState, source: PrometheusSource) -> None:
    @app.get("/v1/fleet-drift", responses=responses(None, 400, 422, 502, 503),
             summary="Drift from Prometheus histogram buckets over the fleet")
    def fleet(metric: Annotated[str, Query(min_length=1, max_length=200, description="a histogram's base name",
                                           json_schema_extra={"pattern": METRIC_NAME.pattern})],
              reference_end: Annotated[float, Query(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False,
                                                    description="unix seconds; before current_end")],
              selector: Annotated[str, Query(max_length=1000, description='label matchers: model="x",variant="y"',
                                             json_schema_extra={"pattern": SELECTOR.pattern})] = "",
              current_end: Annotated[float | None, Query(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False,
                                                         description="unix seconds; now if left out")] = None,
              window: Annotated[float, Query(gt=0, le=366 * 86400, allow_inf_nan=False,
                                             description="seconds of increase before each end")] = 3600.0) -> Response:
        try:
            result = source.drift(metric, selector, reference_end, time.time() if current_end is None else current_end,
                                  window, state.thresholds.policy)
        except SourceError as exc:
            return error_response(exc.status, str(exc), "fleet_drift_failed", field=exc.field)
        return JSONResponse(result)
