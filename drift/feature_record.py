"""The feature record: what the gateway sends the drift service for each finished request.

Declared once, here: the gateway builds ``FeatureRecord`` objects and sends them with
``ingest_body``; the drift service checks ingested JSON against ``FIELDS``
(drift/schema.py) and publishes the same fields in its OpenAPI (drift/api.py). A field's
type is its annotation, its range and description its metadata, so the producer, the
check and the documentation cannot disagree.

Nothing here costs the gateway anything per request: the dataclass's constructor is the
plain generated one (no validation), and ``FIELDS`` is computed once at import. This
module imports neither side (no FastAPI, numpy or aiohttp), so both can import it.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import orjson

from inferwatch.drift.sampling_params import VALUES

TEXT_MAX = 128  # characters of a label (model, variant, route, ...): labels, never prompt text
MAX_BATCH = 10_000  # records in one ingest request
MAX_FUTURE_S = 300.0  # how far finished_at may lie ahead of the drift service's clock (clock skew)

UNIX_S = (0.0, 1e11)  # until the year 5138
DURATION_S = (0.0, 7 * 86400.0)
TOKENS = (0, 2**31 - 1)
STATUS = (100, 599)
LOGPROB = (-1e6, 0.0)  # beyond it a mean would poison later sums (a -1e308 made exact tests fail)
EPOCH = (0, 2**31 - 1)

# Rules that span fields: checked by the drift service, stated in its OpenAPI.
CROSS_FIELD_RULES = (
    "started_at <= finished_at",
    "ttft_s <= e2e_s where ttft_s is given",
    f"finished_at at most {MAX_FUTURE_S:g} s ahead of the drift service's clock",
    "epoch and weight: both or neither, and only with experiment",
)


def _about(description: str, bounds: tuple[float, float] | None = None, **options: typing.Any) -> typing.Any:
    """A dataclass field carrying its description and range (``options``: its default)."""
    return field(metadata={"description": description, "bounds": bounds}, **options)


def _binned(param: str, what: str | None = None) -> str:
    about = what or "the request's " + param
    return f"{about}, binned: {', '.join(VALUES[param])}"


@dataclass(slots=True)
class FeatureRecord:
    """One finished request: numbers and small categoricals only, never prompt text.

    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, a
    microsecond more per request for a record nothing changes after it is made."""

    model: str = _about("the public model name the client asked for")
    variant: str = _about("the variant that answered (the gateway's own, or the one an experiment chose)")
    route: str | None = _about("'chat' or 'completions'")
    stream: bool | None = _about("whether the answer was streamed")
    started_at: float = _about("unix seconds", UNIX_S)
    finished_at: float = _about("unix seconds", UNIX_S)
    status: int = _about("HTTP status code answered (499: the client left)", STATUS)
    prompt_tokens: int | None = _about("tokens, as vLLM counted them", TOKENS)
    completion_tokens: int | None = _about("tokens, as vLLM counted them", TOKENS)
    ttft_s: float | None = _about("time to first token, seconds (streamed answers)", DURATION_S)
    tpot_s: float | None = _about("time per output token after the first, seconds (streamed answers)", DURATION_S)
    e2e_s: float = _about("end-to-end latency, seconds", DURATION_S)
    finish_reason: str | None = _about("why generation ended, as vLLM said")
    mean_logprob: float | None = _about("mean token logprob (model confidence), where captured", LOGPROB)
    repetition: float | None = _about("share of the answer's 4-grams (of tokens when streamed, of words when not) "
                                      "that repeat an earlier one; null under 8 units, for n > 1 or no answer",
                                      (0.0, 1.0), default=None)
    loop: bool | None = _about("the answer ends repeating one span of tokens over and over", default=None)
    empty: bool | None = _about("the answer has no text, or whitespace only (tool calls are not empty)",
                                default=None)
    temperature_bin: str | None = _about(_binned("temperature"), default=None)
    top_p_bin: str | None = _about(_binned("top_p"), default=None)
    max_tokens_bin: str | None = _about(_binned("max_tokens", "the client's max_tokens (default: not set)"),
                                        default=None)
    n_bin: str | None = _about(_binned("n", "choices asked for"), default=None)
    tools: bool | None = _about("the request offered tools (or functions)", default=None)
    response_format: str | None = _about(_binned("response_format", "the response format asked for"), default=None)
    experiment: str | None = _about("the experiment that assigned the request", default=None)
    unit: str | None = _about("the hashed unit key of the assignment, never the key itself; null for a request "
                              "assigned on its own (no unit key)", default=None)
    epoch: int | None = _about("the experiment's weight epoch: changes whenever its weights change", EPOCH,
                               default=None)
    weight: float | None = _about("the answering variant's weight in that epoch", (0.0, 1.0), default=None)


@dataclass(frozen=True, slots=True)
class FieldRule:
    """One field as the drift service checks it."""

    name: str
    kind: type  # str, bool, int or float
    nullable: bool  # may be null or left out
    bounds: tuple[float, float] | None
    description: str

    @property
    def accepts(self) -> tuple[type, ...]:
        """Python types of the parsed JSON taken. A float field takes an integer too; an int
        field takes no float, not even 200.0: a producer that writes one has a column turned
        float (pandas does that to an int column with one missing value), and its other
        values may be rounded already. A bool is never a number."""
        return (int, float) if self.kind is float else (self.kind,)


def _rules() -> dict[str, FieldRule]:
    hints = typing.get_type_hints(FeatureRecord)
    rules = {}
    for f in fields(FeatureRecord):
        options = typing.get_args(hints[f.name]) or (hints[f.name],)
        (kind,) = (t for t in options if t is not type(None))
        rules[f.name] = FieldRule(f.name, kind, type(None) in options, f.metadata["bounds"],
                                  f.metadata["description"])
    return rules


FIELDS: dict[str, FieldRule] = _rules()
REQUIRED = tuple(name for name, rule in FIELDS.items() if not rule.nullable)
TEXT_FIELDS = tuple(name for name, rule in FIELDS.items() if rule.kind is str)  # each 1..TEXT_MAX characters


def ingest_body(records: Sequence[FeatureRecord]) -> bytes:
    """The body of ``POST /v1/ingest``: orjson writes the dataclasses itself, a field at a time."""
    return orjson.dumps({"records": records})
