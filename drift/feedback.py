"""User ratings of answers, for the A/B verdict's feedback guardrail.

The gateway joins each rating to the variant, experiment, weight epoch and unit that gave
the answer and posts it here; the drift state stores it and adds it to the experiment's
ledger, in the answering unit's row (a score of 0.5 or more, thumbs up being 1, counts as
positive). Ratings of answers no experiment assigned join no ledger.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferwatch.drift.feature_record import EPOCH, TEXT_MAX, UNIX_S
from inferwatch.drift.json_int import json_int

POSITIVE = 0.5
MAX_RECORDS = 10_000


class FeedbackRecord(BaseModel):
    """One rating, joined by the gateway to the variant that gave the answer. Strict: a
    number is a JSON number (``"at": false`` or ``"score": "1"`` is refused, as the schema says)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "description": "One rating. Across fields: epoch only with experiment."})

    model: str = Field(min_length=1, max_length=TEXT_MAX)
    variant: str = Field(min_length=1, max_length=TEXT_MAX)
    experiment: str | None = Field(None, min_length=1, max_length=TEXT_MAX)
    epoch: json_int(ge=EPOCH[0], le=EPOCH[1]) | None = Field(  # type: ignore[valid-type]  # an Annotated int
        None, description="the answer's weight epoch")
    unit: str | None = Field(None, min_length=1, max_length=TEXT_MAX, description="the answer's hashed unit")
    response_id: str | None = Field(None, min_length=1, max_length=TEXT_MAX,
                                    description="the rated answer's id: a second rating of it is not counted")
    score: float = Field(ge=0, le=1, allow_inf_nan=False, description="0..1; 0.5 or more is positive")
    at: float = Field(ge=UNIX_S[0], le=UNIX_S[1], allow_inf_nan=False, description="unix seconds")

    @model_validator(mode="after")
    def _epoch_with_experiment(self) -> FeedbackRecord:
        if self.epoch is not None and self.experiment is None:
            raise ValueError("'epoch' needs 'experiment': an epoch belongs to an experiment")
        return self


class FeedbackBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    records: list[FeedbackRecord] = Field(min_length=1, max_length=MAX_RECORDS)
