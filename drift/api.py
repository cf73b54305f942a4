"""The drift service's HTTP shapes, declared once so /openapi.json lists every path with its
request and response schemas. Request bodies are still parsed by hand (columnar
validation of ingest is what keeps it fast; bodies are size-checked before parsing), so
the request models document the contract; the service enforces the same ranges."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from inferwatch.drift.schema import RANGES, SEGMENT_TEXT_MAX

Text = Field(min_length=1, max_length=SEGMENT_TEXT_MAX)


def _range(name: str, description: str, nullable: bool = True):
    low, high = RANGES[name]
    return Field(None if nullable else ..., ge=low, le=high, description=description)


class FeatureRecord(BaseModel):
    """One finished request, as the gateway sends it: numbers and small categoricals, never text."""

    model: str = Text
    variant: str = Text
    route: str | None = Field(None, min_length=1, max_length=SEGMENT_TEXT_MAX)
    stream: bool | None = None
    started_at: float = _range("started_at", "unix seconds", nullable=False)
    finished_at: float = _range("finished_at", "unix seconds; at most 300 s in the future", nullable=False)
    status: int = _range("status", "HTTP status code", nullable=False)
    prompt_tokens: int | None = _range("prompt_tokens", "tokens")
    completion_tokens: int | None = _range("completion_tokens", "tokens")
    ttft_s: float | None = _range("ttft_s", "seconds")
    tpot_s: float | None = _range("tpot_s", "seconds")
    e2e_s: float = _range("e2e_s", "seconds", nullable=False)
    finish_reason: str | None = Field(None, min_length=1, max_length=SEGMENT_TEXT_MAX)
    mean_logprob: float | None = _range("mean_logprob", "mean token logprob")
    experiment: str | None = Field(None, min_length=1, max_length=SEGMENT_TEXT_MAX,
                                   description="the gateway experiment that assigned the request (not stored)")
    unit: str | None = Field(None, min_length=1, max_length=SEGMENT_TEXT_MAX,
                             description="hashed unit key of the assignment (not stored)")


class IngestRequest(BaseModel):
    records: list[FeatureRecord] = Field(min_length=1, max_length=10_000)


class FeedbackResponse(BaseModel):
    accepted: int = Field(description="ratings kept (not those of variants beyond the segment bound)")


class IngestResponse(BaseModel):
    accepted: int
    in_window: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    record: int | None = None
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class BaselineRequest(BaseModel):
    """Freeze a time range (``from``, ``to``), or upload counts on the bins of GET /v1/features."""

    model: str = Text
    variant: str = Text
    from_: float | None = Field(None, alias="from", description="unix seconds")
    to: float | None = Field(None, description="unix seconds")
    histograms: dict[str, list[int]] | None = None


class BaselineInfo(BaseModel):
    model: str
    variant: str
    records: int
    source: dict
    created_at: float
    edges: dict[str, list[float]] = Field(description="per numeric feature, the bin edges scores are computed on "
                                                      "(the baseline's quantiles on the feature's grid)")


class ThresholdMode(BaseModel):
    mode: Literal["calibrated", "alpha", "fixed"]
    threshold: float | None = None


class Thresholds(BaseModel):
    alpha: float
    min_samples: int
    resamples: int
    methods: dict[str, ThresholdMode]


class ThresholdsRequest(BaseModel):
    """``alpha`` (0 < alpha <= 0.5) and, per method name, a fixed threshold or null (calibrate)."""

    alpha: float | None = Field(None, gt=0, le=0.5)
    kl: float | None = Field(None, gt=0)
    js: float | None = Field(None, gt=0)
    psi: float | None = Field(None, gt=0)
    wasserstein: float | None = Field(None, gt=0)
    ks: float | None = Field(None, gt=0, lt=1)
    chi2: float | None = Field(None, gt=0, lt=1)


class MethodResult(BaseModel):
    method: str
    kind: Literal["distance", "p_value"]
    direction: Literal["higher_is_drift", "lower_is_drift"]
    score: float | None
    threshold: float | None
    threshold_source: Literal["calibrated", "alpha", "fixed"]
    calibration_n: int | None = Field(description="window size the calibrated threshold was drawn at")
    p_value: float | None
    drifted: bool
    status: Literal["ok", "insufficient_data", "calibrating"]


class FeatureResult(BaseModel):
    status: Literal["ok", "insufficient_data", "calibrating"] = Field(
        description="calibrating: its threshold is being computed in the background; no verdict yet")
    reference_n: int
    current_n: int
    p_value: float | None = Field(description="calibrated p-value of 'some method flags this feature'")
    drifted: bool = Field(description="rejected by Holm across the segment's features at alpha")
    methods: dict[str, MethodResult]


class SegmentResult(BaseModel):
    model: str
    variant: str
    status: Literal["drift", "no_drift", "insufficient_data", "calibrating", "no_baseline"]
    alpha: float
    window_records: int
    baseline_records: int
    drifted_features: list[str]
    drifting_since: float | None
    features: dict[str, FeatureResult]


class DriftResponse(BaseModel):
    segments: list[SegmentResult]


class CompareResponse(BaseModel):
    model: str
    a: str
    b: str
    status: Literal["drift", "no_drift", "insufficient_data"]
    alpha: float
    records: dict[str, int]
    drifted_features: list[str]
    features: dict[str, FeatureResult]


class ExactResponse(BaseModel):
    feature: str
    unit: str
    status: Literal["ok", "insufficient_data"]
    reference_sample: int
    current_sample: int
    min_samples: int
    ks_statistic: float | None = None
    ks_p_value: float | None = None
    wasserstein: float | None = Field(None, description="W1 / reference standard deviation, as in /v1/drift")
    w1: float | None = Field(None, description="W1 in the feature's unit")


class FeatureInfo(BaseModel):
    name: str
    unit: str
    description: str
    edges: list[float] | None = None
    categories: list[str] | None = None


class Health(BaseModel):
    status: str
    segments: int
    ingested: int
    overflow_records: int
    window_bytes: int
