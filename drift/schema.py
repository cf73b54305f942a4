"""The features drift is computed on, and the check of ingested feature records.

The record itself (fields, types, ranges, cross-field rules) is declared in
drift/feature_record.py, which the gateway builds its records from; this module checks a
batch against that declaration. A batch is validated as a whole before anything is
stored: the first bad record rejects the batch with an error that names the record's
position and the field, so a client can fix its producer instead of losing part of a
batch silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inferwatch.drift.binning import Edges, linear_edges, log_edges
from inferwatch.drift.feature_record import FIELDS, MAX_BATCH, MAX_FUTURE_S, REQUIRED, TEXT_FIELDS, TEXT_MAX
from inferwatch.drift.sampling_params import VALUES


@dataclass(frozen=True)
class NumericFeature:
    name: str
    edges: Edges
    description: str


@dataclass(frozen=True)
class CategoricalFeature:
    name: str
    categories: tuple[str, ...]
    description: str


# Categoricals read from the record's fields as they are (bools as "true"/"false"): the
# request's sampling parameters, binned the way the gateway's counter bins them.
SAMPLING: dict[str, tuple[tuple[str, ...], str]] = {
    "temperature_bin": (VALUES["temperature"], "the request's temperature"),
    "top_p_bin": (VALUES["top_p"], "the request's top_p"),
    "max_tokens_bin": (VALUES["max_tokens"], "the client's max_tokens"),
    "n_bin": (VALUES["n"], "choices asked for"),
    "stream": (VALUES["stream"], "streamed or not"),
    "tools": (VALUES["tools"], "tools offered"),
    "response_format": (VALUES["response_format"], "the response format asked for"),
}
OUTPUT_KINDS = ("text", "empty", "single_token", "loop")

# The grid windows count on. Log-spaced for counts and latencies (they span orders of
# magnitude), four bins per doubling, linear for logprobs; token-count edges include the
# powers of two of the gateway's le buckets. Scoring merges these fine bins into about 20
# bins of equal baseline mass per feature (``drift.binning.quantile_starts``), chosen when
# a baseline is frozen and stored with it: resolution goes where the traffic is.
NUMERIC_FEATURES: tuple[NumericFeature, ...] = (
    NumericFeature("prompt_tokens", log_edges(1, 131072, 68), "prompt length"),
    NumericFeature("completion_tokens", log_edges(1, 32768, 60), "answer length"),
    NumericFeature("ttft_s", log_edges(0.001, 64, 64), "time to first token, streamed requests"),
    NumericFeature("tpot_s", log_edges(0.0005, 2, 48), "time per output token, streamed requests"),
    NumericFeature("e2e_s", log_edges(0.01, 640, 64), "end-to-end latency"),
    NumericFeature("mean_logprob", linear_edges(-20, 0, 80), "mean token logprob, model confidence"),
    NumericFeature("repetition", linear_edges(0, 1, 50), "share of the answer's 4-grams that repeat an earlier one"),
)
# Units apart from the descriptions: the report and /v1/features show both, so a description
# never repeats its unit.
UNITS = {"prompt_tokens": "tokens", "completion_tokens": "tokens", "ttft_s": "s", "tpot_s": "s", "e2e_s": "s",
         "mean_logprob": "nats/token", "repetition": "", "finish_reason": "", "status_class": "", "output": "",
         **{name: "" for name in SAMPLING}}

# The record's numeric ranges, from its declaration: anything outside is refused at the edge,
# so nothing accepted can overflow or poison a later read.
RANGES: dict[str, tuple[float, float]] = {name: rule.bounds for name, rule in FIELDS.items() if rule.bounds}
CATEGORICAL_FEATURES: tuple[CategoricalFeature, ...] = (
    CategoricalFeature("finish_reason", ("stop", "length", "tool_calls", "content_filter", "abort"),
                       "why generation ended"),
    CategoricalFeature("status_class", ("2xx", "4xx", "5xx"), "HTTP outcome"),
    CategoricalFeature("output", OUTPUT_KINDS, "what the answer is: text, or empty, one token, a loop"),
    *(CategoricalFeature(name, values, about) for name, (values, about) in SAMPLING.items()),
)
FEATURES: dict[str, NumericFeature | CategoricalFeature] = {**{f.name: f for f in NUMERIC_FEATURES},
                                                           **{f.name: f for f in CATEGORICAL_FEATURES}}

class BatchError(ValueError):
    def __init__(self, message: str, record: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.record = record
        self.field = field


@dataclass(frozen=True)
class Batch:
    """A validated batch, column by column, grouped by nothing yet."""

    size: int
    model: list[str]
    variant: list[str]
    finished_at: np.ndarray
    status: np.ndarray
    numeric: dict[str, np.ndarray]  # NaN where the record had null
    finish_reason: list[str | None]
    experiment: list[str | None]
    unit: list[str | None]
    epoch: np.ndarray  # int64, -1 where the record had none
    weight: np.ndarray  # NaN where the record had none
    categorical: dict[str, list[str | None]]  # "output" and the SAMPLING fields; None where the record had null


def parse_batch(body: bytes, now: float, max_future_s: float = MAX_FUTURE_S) -> Batch:
    """Validate column by column (set and array operations, no per-field Python work per
    record); only when something is wrong does a per-record scan find the first offending
    record and field for the error message."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BatchError(f"body is not valid JSON: {exc}", field="body") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise BatchError('body must be {"records": [...]}', field="records")
    records = doc["records"]
    if not records:
        raise BatchError("batch has no records", field="records")
    if len(records) > MAX_BATCH:
        raise BatchError(f"batch has {len(records)} records; the limit is {MAX_BATCH}", field="records")
    batch = _columns(records, now, max_future_s)
    if batch is None:
        for i, rec in enumerate(records):
            _check(i, rec, now, max_future_s)
        raise BatchError("batch failed validation")  # unreachable: the scan names the record
    return batch


_FIELD_SET = frozenset(FIELDS)
_NONE = type(None)
_KIND = {str: "a string", bool: "true or false", int: "an integer, written without a fraction (200, not 200.0)",
         float: "a number"}
_ALLOWED = {name: set(rule.accepts) | ({_NONE} if rule.nullable else set()) for name, rule in FIELDS.items()}


def _columns(records: list[Any], now: float, max_future_s: float) -> Batch | None:
    """The batch as columns, or None if any record breaks a rule."""
    if not set(map(type, records)) <= {dict} or not all(map(_FIELD_SET.issuperset, records)):
        return None
    cols = {name: [r.get(name) for r in records] for name in FIELDS}
    for name, allowed in _ALLOWED.items():
        types = set(map(type, cols[name]))
        if not types <= allowed:
            return None
    for name in TEXT_FIELDS:
        lengths = [len(v) for v in cols[name] if v is not None]
        if lengths and (min(lengths) == 0 or max(lengths) > TEXT_MAX):
            return None
    low, high = RANGES["status"]
    if min(cols["status"]) < low or max(cols["status"]) > high:  # Python ints: no int64 overflow
        return None
    numeric = {f.name: np.array([np.nan if v is None else v for v in cols[f.name]], dtype=float)
               for f in NUMERIC_FEATURES}
    finished = np.array(cols["finished_at"], dtype=float)
    started = np.array(cols["started_at"], dtype=float)
    status = np.array(cols["status"], dtype=np.int64)
    for name, values in (("finished_at", finished), ("started_at", started), *numeric.items()):
        low, high = RANGES[name]
        present = values[~np.isnan(values)]  # NaN only where the record had null
        if present.size and (present.min() < low or present.max() > high):  # also catches +-inf
            return None
    if (finished > now + max_future_s).any() or (started > finished).any():
        return None
    if (numeric["ttft_s"] > numeric["e2e_s"]).any():  # NaN (null) compares False
        return None
    given = np.array([v is not None for v in cols["epoch"]], dtype=bool)
    epoch = np.array([-1 if v is None else v for v in cols["epoch"]], dtype=float)
    weight = np.array([np.nan if v is None else v for v in cols["weight"]], dtype=float)
    (elow, ehigh), (wlow, whigh) = RANGES["epoch"], RANGES["weight"]
    weighted = ~np.isnan(weight)
    if (epoch[given] > ehigh).any() or (epoch[given] < elow).any() or (weight[weighted] < wlow).any() or (
            weight[weighted] > whigh).any():
        return None
    if (given != weighted).any() or any(g and e is None for g, e in zip(given.tolist(), cols["experiment"])):
        return None
    categorical = {name: [_TEXT_OF.get(v, v) for v in cols[name]] for name in SAMPLING}
    categorical["output"] = output_kinds(cols["empty"], cols["loop"], cols["completion_tokens"],
                                         cols["finish_reason"])
    return Batch(size=len(records), model=cols["model"], variant=cols["variant"], finished_at=finished,
                 status=status, numeric=numeric, finish_reason=cols["finish_reason"], experiment=cols["experiment"],
                 unit=cols["unit"], epoch=epoch.astype(np.int64), weight=weight, categorical=categorical)


_TEXT_OF = {True: "true", False: "false"}


def output_kinds(empty: list[Any], loop: list[Any], completion_tokens: list[Any], finish_reason: list[Any]) -> list[str | None]:
    """What each answer is (``OUTPUT_KINDS``); None where the gateway did not judge it (no
    complete answer, or several choices)."""
    return [None if e is None else "empty" if e else "loop" if lp else
            "single_token" if n == 1 and r == "stop" else "text"
            for e, lp, n, r in zip(empty, loop, completion_tokens, finish_reason)]


def _check(i: int, rec: object, now: float, max_future_s: float) -> None:
    if not isinstance(rec, dict):
        raise BatchError(f"record {i} of 'records' is not an object", i, "records")
    for name in REQUIRED:
        if name not in rec or rec[name] is None:
            raise BatchError(f"record {i}: field '{name}' is required", i, name)
    for name, value in rec.items():
        rule = FIELDS.get(name)
        if rule is None:
            raise BatchError(f"record {i}: unknown field '{name}' (fields: {', '.join(FIELDS)})", i, name)
        if value is None:
            continue
        if (isinstance(value, bool) and rule.kind is not bool) or not isinstance(value, rule.accepts):
            raise BatchError(f"record {i}: field '{name}' must be {_KIND[rule.kind]}", i, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise BatchError(f"record {i}: field '{name}' must be finite", i, name)
        if isinstance(value, str) and not 0 < len(value) <= TEXT_MAX:
            raise BatchError(f"record {i}: field '{name}' must be 1..{TEXT_MAX} characters", i, name)
        if rule.bounds is not None and not rule.bounds[0] <= value <= rule.bounds[1]:  # type: ignore[operator]  # a number here
            low, high = (f"{b:,.0f}" if rule.kind is int else f"{b:g}" for b in rule.bounds)
            raise BatchError(f"record {i}: field '{name}' must be between {low} and {high}", i, name)
    if rec["finished_at"] > now + max_future_s:
        raise BatchError(f"record {i}: field 'finished_at' lies more than {max_future_s:g} s in the future; check "
                         "the producer's clock", i, "finished_at")
    if rec["started_at"] > rec["finished_at"]:
        raise BatchError(f"record {i}: field 'started_at' is after 'finished_at'", i, "started_at")
    if rec.get("ttft_s") is not None and rec["ttft_s"] > rec["e2e_s"]:
        raise BatchError(f"record {i}: field 'ttft_s' is longer than the whole request ('e2e_s')", i, "ttft_s")
    if (rec.get("epoch") is None) != (rec.get("weight") is None):
        missing = "weight" if rec.get("weight") is None else "epoch"
        raise BatchError(f"record {i}: field '{missing}' is required with the other of 'epoch' and 'weight'", i,
                         missing)
    if rec.get("epoch") is not None and rec.get("experiment") is None:
        raise BatchError(f"record {i}: field 'experiment' is required with 'epoch'", i, "experiment")


def parse_stored(body: bytes) -> Batch:
    """A batch read back from the store. It was validated when it was acknowledged; the
    future-timestamp rule was relative to that moment and must not apply again."""
    return parse_batch(body, now=math.inf)
