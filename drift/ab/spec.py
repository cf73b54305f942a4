"""The guardrail metrics an A/B verdict judges, as frozen data: what each measures, which
test fits it, which direction is worse, where its values come from, and the margin within
which a difference does not matter (for promotion). One entry per metric, read by the
analysis, the unit ledger's columns, the JSON, the gauges, the report and the alert rules
alike: a new guardrail of an existing kind is one entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["proportion", "rank", "request_mean", "mean", "throughput"]
Direction = Literal["higher_is_worse", "lower_is_worse"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    title: str
    # proportion: delta method; rank: Mann-Whitney on unit means; request_mean: delta method on
    # the log ratio of means per request; mean: Welch; throughput: paired log ratio
    kind: Kind
    direction: Direction
    # Non-inferiority margin on the scale the sequential test runs on: a rate difference for
    # proportions, P(treatment > control) - 1/2 for ranks, a log ratio for request means and
    # throughput, a difference of means for means.
    margin: float
    unit: str = ""
    feature: str | None = None  # drift feature its values come from (rank, request_mean and mean kinds)
    pages: bool = False  # worse while the canary takes more than PAGE_SHARE of traffic: a page
    # proportion kind: the unit ledger's count columns (drift.ab.units) of the rate numerator / denominator
    numerator: str | None = None
    denominator: str | None = None
    min_units: int | None = None  # units per arm with a denominator before it is judged (None: the experiment's)

    def __post_init__(self) -> None:
        """What a kind reads must be there, and nothing else: a spec missing its columns or
        feature fails here, at import, never by being computed another way."""
        has_columns = self.numerator is not None and self.denominator is not None
        if self.kind == "proportion" and not (has_columns and self.feature is None):
            raise ValueError(f"guardrail {self.name}: a proportion needs numerator and denominator, and no feature")
        if self.kind in FEATURE_KINDS and not (self.feature is not None and self.numerator is self.denominator is None):
            raise ValueError(f"guardrail {self.name}: a {self.kind} needs a feature, and no columns")
        if self.kind == "throughput" and (self.feature or self.numerator or self.denominator):
            raise ValueError(f"guardrail {self.name}: a throughput reads the cost source, neither a feature nor columns")

    def worse(self, effect: float) -> bool:
        return effect > 0 if self.direction == "higher_is_worse" else effect < 0


FEATURE_KINDS: tuple[Kind, ...] = ("rank", "request_mean", "mean")


PAGE_SHARE = 0.10
MIN_FEEDBACK = 30  # units with ratings per arm before feedback is judged

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("error_rate", "server errors (5xx) per request", "proportion", "higher_is_worse", 0.005, pages=True,
               numerator="errors", denominator="requests"),
    MetricSpec("truncation_rate", "answers cut at max_tokens (finish_reason length)", "proportion",
               "higher_is_worse", 0.01, numerator="truncated", denominator="finished"),
    MetricSpec("ttft", "time to first token", "rank", "higher_is_worse", 0.05, "s", "ttft_s", pages=True),
    MetricSpec("tpot", "time per output token", "rank", "higher_is_worse", 0.05, "s", "tpot_s"),
    MetricSpec("e2e_latency", "end-to-end latency", "rank", "higher_is_worse", 0.05, "s", "e2e_s"),
    # The same latencies per request: the rank test on unit means speaks for the typical user
    # and cannot see a regression that hits only the heaviest users; these weigh each user by
    # their requests.
    MetricSpec("ttft_per_request", "time to first token, mean per request", "request_mean", "higher_is_worse", 0.05,
               "s", "ttft_s", pages=True),
    MetricSpec("tpot_per_request", "time per output token, mean per request", "request_mean", "higher_is_worse",
               0.05, "s", "tpot_s"),
    MetricSpec("e2e_latency_per_request", "end-to-end latency, mean per request", "request_mean", "higher_is_worse",
               0.05, "s", "e2e_s"),
    MetricSpec("completion_tokens", "answer length", "rank", "higher_is_worse", 0.05, "tokens", "completion_tokens"),
    MetricSpec("mean_logprob", "mean token logprob (model confidence)", "mean", "lower_is_worse", 0.1, "nats/token",
               "mean_logprob"),
    MetricSpec("repetition_rate", "share of repeated 4-grams in answers", "rank", "higher_is_worse", 0.05, "",
               "repetition"),
    MetricSpec("empty_rate", "empty or whitespace-only answers", "proportion", "higher_is_worse", 0.005,
               numerator="empty", denominator="judged"),
    MetricSpec("feedback", "positive user feedback", "proportion", "lower_is_worse", 0.02,
               numerator="feedback_positive", denominator="feedback_total", min_units=MIN_FEEDBACK),
    MetricSpec("cost", "output tokens per GPU-second (variants on GPUs of their own, at equal weights)",
               "throughput", "lower_is_worse", 0.05, "tokens/GPU-s"),
)
BY_NAME = {m.name: m for m in METRICS}
PAGING = tuple(m.name for m in METRICS if m.pages)
