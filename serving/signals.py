"""The per-request signals, each declared once: how it is read from an answer (the account a
stream and a unary answer both fill, and the answer's quality), the histogram it is observed
in, and the feature record field it fills. The metrics (serving/metrics.py), the recorder's
observations and the feature record (serving/recording.py) all come from this table: a new
signal is one entry here (and, with a record field, its declaration in
drift/feature_record.py).

Observed for answered requests (2xx) only; recorded for every request that reached vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferwatch.common.latency_buckets import INTER_TOKEN_BUCKETS, TTFT_BUCKETS
from inferwatch.serving.output_quality import OutputQuality
from inferwatch.serving.sse import StreamAccount

TOKEN_COUNT_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)
# share of repeated 4-grams in an answer (serving/output_quality.py): fluent text sits under
# 0.05, a looping answer above 0.5
REPETITION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)

Read = Callable[[StreamAccount, OutputQuality | None], Any]


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    read: Read  # None: the answer does not say (no token streamed, no usage, not judged)
    metric: str | None = None  # a histogram under inferwatch_gateway_, labelled model, variant, route
    doc: str = ""
    buckets: tuple[float, ...] = ()
    field: str | None = None  # the feature record's field (drift/feature_record.py)
    exemplar: bool = False  # observed with the request's trace as exemplar
    per_token: bool = False  # ``read`` gives many values per request (observed in one update)


SIGNALS: tuple[Signal, ...] = (
    Signal("ttft", lambda a, q: a.ttft, "time_to_first_token_seconds",
           "Time from request received to the first generated token relayed to the client.", TTFT_BUCKETS,
           field="ttft_s", exemplar=True),
    Signal("itl", lambda a, q: a.gaps, "inter_token_latency_seconds", "Gap between consecutive streamed token chunks.",
           INTER_TOKEN_BUCKETS, per_token=True),
    Signal("tpot", lambda a, q: a.tpot(), "time_per_output_token_seconds",
           "Per request: (end - first token) / (output tokens - 1), the decode speed a user sees.",
           INTER_TOKEN_BUCKETS, field="tpot_s"),
    Signal("prompt_tokens", lambda a, q: a.prompt_tokens, "request_prompt_tokens",
           "Prompt length per request, in tokens.", TOKEN_COUNT_BUCKETS, field="prompt_tokens"),
    Signal("completion_tokens", lambda a, q: a.completion_tokens, "request_completion_tokens",
           "Completion length per request, in tokens.", TOKEN_COUNT_BUCKETS, field="completion_tokens"),
    Signal("repetition", lambda a, q: q.repetition if q else None, "output_repetition_ratio",
           "Per answer: the share of its 4-grams (of tokens when streamed, of words when not) that repeat an "
           "earlier one; answers of at least 8 such units.", REPETITION_BUCKETS, field="repetition"),
    Signal("finish_reason", lambda a, q: a.finish_reasons[0] if a.finish_reasons else None, field="finish_reason"),
    Signal("mean_logprob", lambda a, q: a.mean_logprob, field="mean_logprob"),
    Signal("loop", lambda a, q: q.loop if q else None, field="loop"),
    Signal("empty", lambda a, q: q.empty if q else None, field="empty"),
)
OBSERVED = tuple(s for s in SIGNALS if s.metric is not None)
# (record field, read) of every signal the feature record holds
RECORDED: tuple[tuple[str, Read], ...] = tuple((s.field, s.read) for s in SIGNALS if s.field is not None)
