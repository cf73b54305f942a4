"""The drift service's HTTP shapes, declared once so /openapi.json lists every path with its
request and response schemas, and says exactly what each request may hold.

Bodies are size-checked before parsing. Ingest is checked by hand (drift/schema.py, column
by column: that is what keeps it fast) against the feature record's declaration
(drift/feature_record.py), from which ``FeatureRecord`` below is built; the other bodies
are validated with these models in strict mode, so a number is a JSON number, never a
string or a boolean. Rules that span fields are stated in the models' descriptions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from inferwatch.drift.baseline import MAX_COUNT
from inferwatch.drift.feature_record import CROSS_FIELD_RULES, FIELDS, MAX_BATCH, TEXT_MAX, UNIX_S, FieldRule
from inferwatch.drift.json_int import json_int
from inferwatch.drift.methods import METHODS
from inferwatch.drift.schema import FEATURES, NumericFeature

Text = Field(min_length=1, max_length=TEXT_MAX)


def optional_not_null(schema: dict[str, Any]) -> None:
    """A field that may be left out but not be null: its schema keeps no ``default: null``."""
    for prop in schema.get("properties", {}).values():
        if prop.get("default", ...) is None and "anyOf" not in prop:
            del prop["default"]


def _record_field(rule: FieldRule) -> tuple[Any, Any]:
    constraints: dict[str, Any] = {"min_length": 1, "max_length": TEXT_MAX} if rule.kind is str else {}
    if rule.bounds is not None:
        constraints.update(ge=rule.bounds[0], le=rule.bounds[1])
    # strict: an int field takes no 200.0 (FieldRule.accepts)
    kind = Annotated[rule.kind, Field(**constraints)]  # type: ignore[name-defined]  # a type chosen at run time
    description = rule.description + (" (an integer written without a fraction)" if rule.kind is int else "")
    return kind | None if rule.nullable else kind, Field(None if rule.nullable else ..., description=description)


FeatureRecord = create_model(  # type: ignore[call-overload]  # fields built from FIELDS at import
    "FeatureRecord", __config__=ConfigDict(extra="forbid", strict=True),
    __doc__="One finished request, as the gateway sends it: numbers and small categoricals, never text. "
            f"Across fields: {'; '.join(CROSS_FIELD_RULES)}.",
    **{name: _record_field(rule) for name, rule in FIELDS.items()})


class IngestRequest(BaseModel):
    """A batch is taken whole or refused whole: the first bad record's position and field are named."""

    records: list[FeatureRecord] = Field(min_length=1, max_length=MAX_BATCH)


def bins(name: str) -> int:
    """How many counts a feature's histogram holds: its bins, or its categories and 'other'."""
    feature = FEATURES[name]
    return feature.edges.bins if isinstance(feature, NumericFeature) else len(feature.categories) + 1


Count = json_int(ge=0, le=MAX_COUNT)
Histograms = create_model(  # type: ignore[call-overload]  # fields built from FEATURES at import
    "Histograms", __config__=ConfigDict(extra="forbid", strict=True),
    __doc__="Counts per bin of GET /v1/features, per feature; a feature left out or null counts nothing. At "
            "least one count must be positive.",
    **{name: (list[Count] | None,  # type: ignore[valid-type]  # Count: an Annotated int
              Field(None, min_length=bins(name), max_length=bins(name)))
       for name in FEATURES})


class BaselineRequest(BaseModel):
    """Freeze the segment's records of a time range (``from`` before ``to``; there must be
    records in it), or upload counts on the bins of GET /v1/features (``histograms``): one
    of the two."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=lambda schema, _: _one_source(schema))

    model: str = Text
    variant: str = Text
    # None only as "left out": a null is refused (strict), and the schema says so (optional_not_null)
    from_: float = Field(None, alias="from",  # type: ignore[assignment]  # None: left out
                         ge=UNIX_S[0], le=UNIX_S[1], description="unix seconds")
    to: float = Field(None, ge=UNIX_S[0], le=UNIX_S[1], description="unix seconds")  # type: ignore[assignment]  # as from_
    histograms: Histograms = None  # type: ignore[assignment]  # as from_


def _one_source(schema: dict[str, Any]) -> None:
    optional_not_null(schema)
    schema["oneOf"] = [{"required": ["from", "to"], "not": {"required": ["histograms"]}},
                       {"required": ["histograms"], "not": {"anyOf": [{"required": ["from"]}, {"required": ["to"]}]}}]


class FeedbackResponse(BaseModel):
    accepted: int = Field(description="ratings kept (not those of variants beyond the segment bound)")
    duplicates: int = Field(0, description="ratings of answers rated before, not counted again")


class IngestResponse(BaseModel):
    accepted: int
    in_window: int
    duplicate: bool = Field(False, description="a batch stored before under this Idempotency-Key: not again")


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    record: int | None = None
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class BaselineInfo(BaseModel):
    model: str
    variant: str
    records: int
    source: dict[str, Any]
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


def _at_least_one(schema: dict[str, Any]) -> None:
    optional_not_null(schema)
    schema["minProperties"] = 1


def thresholds_request(smallest_alpha: float) -> type[BaseModel]:
    """The body of PUT /v1/thresholds for a service whose calibration resolves p-values down
    to ``smallest_alpha`` (1 / (resamples + 1)): below it every calibrated threshold would be
    infinite, a verdict that never fires."""
    methods: dict[str, Any] = {
        name: (float | None, Field(None, gt=0, lt=1 if spec.kind == "p_value" else None,
                                   description=f"{spec.description}: a fixed threshold, or null to "
                                               f"{'use alpha' if spec.kind == 'p_value' else 'calibrate it'}"))
        for name, spec in METHODS.items()}
    return create_model(
        "ThresholdsRequest", __config__=ConfigDict(extra="forbid", strict=True,
                                                   json_schema_extra=lambda schema, _: _at_least_one(schema)),
        __doc__="Change alpha, or per method a fixed threshold (null: back to the default). At least one field; "
                "all applied or none.",
        alpha=(float, Field(None, ge=smallest_alpha, le=0.5, description="false-alarm rate per evaluation, per "
                                                                          "method and segment")),
        **methods)


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
