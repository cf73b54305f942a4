"""Experiments: one public model name split over several variants, each an upstream.

Pure logic, no I/O: the experiment file's shape, the assignment of a request to a variant,
and the rules a change of weights must follow.

Assignment is sticky: the unit key (the request's ``user``, a header, or the API key's id)
is hashed with the experiment's salt (keyed BLAKE2b) into one of ``BUCKETS`` buckets, and
the variants own consecutive ranges of buckets in file order, sized by their weights. A unit
keeps its variant while the weights stay put, and when the weights move only the buckets at
the boundaries change hands: ramping the last variant up (1 → 5 → 25 %) keeps every unit it
already had. Requests without a unit key draw a bucket at random. The salt makes two
experiments' assignments independent, and the digest is also the hashed unit id the
feature record carries (never the key itself).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import blake2b
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferwatch.drift.sampling_params import INVALID, sampling_bins
from inferwatch.serving.upstream_targets import normalize_upstream

BUCKETS = 10_000  # weights resolve to 1/10,000 of the traffic
WEIGHT_TOLERANCE = 1e-6
FORCE_HEADER = "x-inferwatch-variant"  # forces a variant (testing); such requests are not assignments
FORCE_TOKEN_HEADER = "x-inferwatch-admin-token"  # forcing needs the admin token: it bypasses weights and rollbacks
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"  # a metric label value: short, no spaces


class ExperimentError(ValueError):
    """A change or a file the experiment cannot take; ``field`` names what was wrong."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class VariantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="the variant label on metrics and records")
    upstream_url: str = Field(description="the vLLM OpenAI server serving it: one base URL, several "
                              "comma-separated or a list (replicas), or a name resolving to several addresses")
    model: str = Field(min_length=1, max_length=256, description="the name that upstream serves it under")
    weight: float = Field(ge=0, le=1, allow_inf_nan=False)
    params: dict[str, Any] = Field(default_factory=dict, description="request fields set on every request routed "
                                   "to this variant, over the client's: a sampling configuration under test "
                                   "(temperature, repetition_penalty, ...)")

    @field_validator("upstream_url", mode="before")
    @classmethod
    def _url(cls, value: object) -> str:
        return normalize_upstream(value)

    @field_validator("params", mode="before")
    @classmethod
    def _no_params(cls, value: object) -> object:
        return {} if value is None else value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(set(value) & GATEWAY_FIELDS)
        if owned:
            raise ValueError(f"{', '.join(owned)} cannot be set by a variant: the client or the gateway sets "
                             f"{'it' if len(owned) == 1 else 'them'} (the variant's 'model' names the served model)")
        bins = sampling_bins({k: v for k, v in value.items() if k in ("temperature", "top_p")}, stream=False,
                             default_max_tokens=True)
        refused = [name for name, b in (("temperature", bins.temperature), ("top_p", bins.top_p)) if b == INVALID]
        if refused:
            raise ValueError(f"{', '.join(f'{n}={value[n]!r}' for n in refused)}: vLLM would refuse every request "
                             "of the variant (temperature in [0, 2], top_p in (0, 1])")
        return value


class ExperimentSpec(BaseModel):
    """One public model's split. The first variant is the control."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="the experiment's name in feature records")
    salt: str | None = Field(None, min_length=1, description="hash salt; defaults to the name")
    variants: tuple[VariantSpec, ...] = Field(min_length=2)

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentSpec:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {', '.join(names)}")
        total = sum(v.weight for v in self.variants)
        if abs(total - 1) > WEIGHT_TOLERANCE:
            raise ValueError(f"variant weights must add up to 1, got {total:g}")
        return self


class ExperimentFile(BaseModel):
    """The experiment file: public model name → its experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiments: dict[str, ExperimentSpec] = Field(min_length=1)


def parse_experiments(text: str, source: str) -> ExperimentFile:
    try:
        return ExperimentFile.model_validate(yaml.safe_load(text) or {})
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{source} is not valid YAML: {exc}", "file") from None
    except ValidationError as exc:
        # a refused variant leaves its experiment one short: that is no second problem to report
        errors = [e for e in exc.errors() if e["type"] != "too_short"] or exc.errors()
        first = errors[0]
        where = ".".join(map(str, first["loc"])) or "file"
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        raise ExperimentError(f"{source}: {problems}", where) from None


def bucket_bounds(weights: tuple[float, ...]) -> tuple[int, ...]:
    """Each variant's exclusive upper bucket, in order; the last is always ``BUCKETS``."""
    bounds, total = [], 0.0
    for w in weights[:-1]:
        total += w
        bounds.append(min(BUCKETS, round(total * BUCKETS)))
    return (*bounds, BUCKETS)


# Request fields a variant's params may not set: what the request is (its model, prompt and
# shape of answer), what the gateway reads back (usage, logprobs, the user as unit key) and
# what admission reserved tokens by (max_tokens, n).
GATEWAY_FIELDS = frozenset({"model", "messages", "prompt", "stream", "stream_options", "n", "logprobs",
                            "top_logprobs", "user", "echo", "max_tokens", "max_completion_tokens"})


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    upstream_url: str
    served_model: str
    rename: tuple[bytes, bytes] | None  # (upstream's "model":"served", the client's "model":"public")
    params: Mapping[str, Any]  # set over the client's request fields (``VariantSpec.params``)


class Assignment(NamedTuple):
    """What a request's record and its remembered answer carry of the split that routed it:
    the drift service groups records by experiment and epoch, checks the sample ratio
    against the epoch's weights, and takes the hashed unit as the unit of analysis.

    Immutable as a tuple: one is made per assigned request, and a frozen dataclass costs
    three times as much to make (bench/ab_split.py)."""

    experiment: str
    epoch: int
    weight: float  # the variant's weight in the epoch
    unit: str | None  # the hashed unit key; None for a request assigned on its own


@dataclass(frozen=True, slots=True)
class Split:
    """An experiment as the router uses it; immutable, replaced whole when weights change."""

    model: str  # the public name
    name: str
    salt: bytes
    variants: tuple[Variant, ...]
    weights: tuple[float, ...]
    bounds: tuple[int, ...]
    # Changes with every change of weights (never goes back): records carry it, so the drift
    # service judges each set of weights as its own sample, against its own weights.
    epoch: int = 0

    @classmethod
    def of(cls, model: str, spec: ExperimentSpec, weights: tuple[float, ...] | None = None,
           epoch: int = 0) -> Split:
        variants = tuple(Variant(v.name, v.upstream_url, v.model, _rename(v.model, model), MappingProxyType(v.params))
                         for v in spec.variants)
        weights = tuple(v.weight for v in spec.variants) if weights is None else weights
        return cls(model, spec.name, (spec.salt or spec.name).encode()[:64], variants, weights,
                   bucket_bounds(weights), epoch)

    def index(self, name: str) -> int | None:
        for i, v in enumerate(self.variants):
            if v.name == name:
                return i
        return None

    def assign(self, unit: str | None) -> tuple[int, Assignment]:
        """The variant's index and the assignment (its unit None for a request without a unit key)."""
        if unit is None:
            bucket, uid = int(random.random() * BUCKETS), None
        else:
            digest = blake2b(unit.encode(), digest_size=8, key=self.salt).digest()
            bucket, uid = int.from_bytes(digest) % BUCKETS, digest.hex()
        index = len(self.bounds) - 1  # the last bound is BUCKETS
        for i, bound in enumerate(self.bounds):
            if bucket < bound:
                index = i
                break
        return index, Assignment(self.name, self.epoch, self.weights[index], uid)

    def with_weights(self, weights: tuple[float, ...]) -> Split:
        """The next epoch: every change, even back to earlier weights, starts a new sample."""
        return Split(self.model, self.name, self.salt, self.variants, weights, bucket_bounds(weights), self.epoch + 1)

    def describe(self) -> dict:
        return {"model": self.model, "experiment": self.name, "epoch": self.epoch, "control": self.variants[0].name,
                "variants": [{"name": v.name, "upstream_url": v.upstream_url, "model": v.served_model, "weight": w}
                             for v, w in zip(self.variants, self.weights)]}


def _rename(served: str, public: str) -> tuple[bytes, bytes] | None:
    """The bytes that name the served model in upstream JSON and what the client should see
    instead. JSON escapes quotes inside strings, so ``"model":"x"`` can only be the key."""
    if served == public:
        return None
    return b'"model":' + orjson.dumps(served), b'"model":' + orjson.dumps(public)


def resolve_weights(split: Split, given: object) -> tuple[float, ...]:
    """New weights in variant order from ``given`` (variant → weight, 0..1).

    At most one variant may be left out: it gets what the others leave (so ``{canary: 0.05}``
    is a ramp step and ``{canary: 0}`` a rollback, in one call). Everything is checked before
    anything is returned, so a refused change changes nothing.
    """
    names = [v.name for v in split.variants]
    if not isinstance(given, Mapping) or not given:
        raise ExperimentError("'weights' must be an object of variant name → weight (0..1)", "weights")
    weights: dict[str, float] = {}
    for name, value in given.items():
        field = f"weights.{str(name)[:64]}"
        if name not in names:
            raise ExperimentError(f"experiment '{split.name}' of model '{split.model}' has no variant "
                                  f"'{str(name)[:64]}' (variants: {', '.join(names)})", field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ExperimentError(f"the weight of '{name}' must be a number between 0 and 1", field)
        if not 0 <= value <= 1:
            raise ExperimentError(f"the weight of '{name}' is {value:g}; it must be between 0 and 1", field)
        weights[name] = float(value)
    missing = [n for n in names if n not in weights]
    if len(missing) > 1:
        raise ExperimentError(f"give the weights of all variants but at most one; missing: {', '.join(missing)}",
                              f"weights.{missing[0]}")
    total = sum(weights.values())
    if missing:
        rest = 1.0 - total
        if rest < -WEIGHT_TOLERANCE:
            raise ExperimentError(f"the weights given add up to {total:g}, more than 1", "weights")
        weights[missing[0]] = max(0.0, round(rest, 12))  # 1 - 0.8 is 0.19999999999999996 otherwise
    elif abs(total - 1) > WEIGHT_TOLERANCE:
        raise ExperimentError(f"the weights must add up to 1, got {total:g}", "weights")
    return tuple(weights[n] for n in names)
