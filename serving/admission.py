"""Admission control: requests per minute, tokens per minute and requests in flight, per API
key and per model, so one noisy client cannot starve the others or push vLLM into
preemption.

Limits come from a YAML file (``INFERWATCH_GATEWAY_LIMITS_FILE``) that is re-read when it
changes, so they move without a restart; a file that does not parse keeps the limits in
force and says why. Rates are token buckets that refill continuously (a minute's allowance
at most, so a quiet client cannot save up an hour's burst). Tokens are charged when a
request ends, with what vLLM reports it used: the gateway cannot know a prompt's length
before vLLM tokenizes it, so a client may overshoot by what its requests in flight use,
which the in-flight cap bounds. The arithmetic is pure (a clock is passed in); the gateway
owns the one instance and calls it on its event loop, so nothing here locks.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from inferwatch.serving.tenants import ANONYMOUS, OTHER, Price, Tenant, TenantName, check_tenants

log = logging.getLogger(__name__)

Scope = Literal["key", "model"]
Limit = Literal["requests_per_minute", "tokens_per_minute", "in_flight"]
RELOAD_CHECK_S = 1.0  # how often the file's mtime is looked at


def key_id(key: str) -> str:
    """What limits files, logs and metrics call an API key: never the key itself."""
    return key_id_of(key.encode())


def key_id_of(key: bytes) -> str:
    return "key-" + hashlib.sha256(key).hexdigest()[:12]


class Limits(BaseModel):
    """One set of limits; a limit left out is not enforced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: float | None = Field(None, gt=0, allow_inf_nan=False)
    tokens_per_minute: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_in_flight: int | None = Field(None, ge=1)


class Policy(BaseModel):
    """The limits file. ``keys`` and ``models`` override, limit by limit, the defaults for the
    ids they name; each key and each model has its own allowance. ``tenants`` name sets of
    keys and their budgets (serving/tenants.py); ``prices`` are what dollar budgets charge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_key: Limits = Limits()
    keys: dict[str, Limits] = {}
    default_model: Limits = Limits()
    models: dict[str, Limits] = {}
    tenants: dict[TenantName, Tenant] = {}
    default_price: Price | None = None
    prices: dict[str, Price] = {}
    _owner: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _tenants(self) -> Policy:
        self._owner = check_tenants(self.tenants)
        if self.default_price is None and any(t.budget is not None and t.budget.dollars is not None
                                              for t in self.tenants.values()):
            raise ValueError("a dollar budget needs default_price (dollars per 1M input and output tokens; "
                             "prices may name models that differ)")
        return self

    def tenant_of(self, kid: str) -> str:
        """The tenant a key id belongs to: declared, else ``other`` (``anonymous`` for no key)."""
        return ANONYMOUS if kid == ANONYMOUS else self._owner.get(kid, OTHER)

    @property
    def owners(self) -> dict[str, str]:
        """Key id -> tenant, of the declared keys."""
        return self._owner

    def price_of(self, model: str, base: str | None = None) -> Price | None:
        """The model's price, else (a LoRA adapter) its base model's, else the default."""
        found = self.prices.get(model)
        if found is None and base is not None:
            found = self.prices.get(base)
        return found if found is not None else self.default_price

    def for_key(self, kid: str) -> Limits:
        return _over(self.default_key, self.keys.get(kid))

    def for_model(self, model: str) -> Limits:
        return _over(self.default_model, self.models.get(model))


def _over(default: Limits, override: Limits | None) -> Limits:
    """An entry changes only the limits it names; the others stay the defaults'."""
    if override is None:
        return default
    return default.model_copy(update=override.model_dump(exclude_unset=True))


class PolicyError(ValueError):
    """The limits file cannot be used; the message says where and why."""


def parse_policy(text: str, source: str) -> Policy:
    try:
        doc = yaml.safe_load(text) or {}
        return Policy.model_validate(doc)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise PolicyError(f"{source}: {problems}") from None


@dataclass
class Bucket:
    """A token bucket of ``per_minute`` that refills continuously and may go negative when a
    request's tokens are charged after the fact."""

    per_minute: float
    level: float
    updated: float

    @property
    def capacity(self) -> float:
        """A minute's allowance, and at least one request: a rate under one a minute still
        admits one request every 60 / rate seconds."""
        return max(self.per_minute, 1.0)

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.per_minute / 60.0)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 when it is now); call after ``refill``."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.per_minute


@dataclass
class _Account:
    """What one key or one model has used."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: int = 0


@dataclass(frozen=True)
class Rejection:
    scope: Scope
    limit: Limit
    retry_after_s: float
    message: str


@dataclass
class Ticket:
    """An admitted request: what ``release`` must give back and charge."""

    key: str
    model: str


@dataclass
class Admission:
    policy: Policy
    clock: Callable[[], float] = time.monotonic
    _accounts: dict[tuple[Scope, str], _Account] = field(default_factory=dict)

    def _account(self, scope: Scope, name: str, limits: Limits, now: float) -> _Account:
        acc = self._accounts.get((scope, name))
        if acc is None:
            acc = self._accounts[(scope, name)] = _Account()
        # limits may have changed since the account was made: buckets follow them
        for attr, rate in (("requests", limits.requests_per_minute), ("tokens", limits.tokens_per_minute)):
            bucket = getattr(acc, attr)
            if rate is None:
                setattr(acc, attr, None)
            elif bucket is None:
                setattr(acc, attr, Bucket(rate, max(rate, 1.0), now))
            elif bucket.per_minute != rate:  # the share of the allowance left carries over, not the count
                bucket.refill(now)
                share = bucket.level / bucket.capacity
                bucket.per_minute = rate
                bucket.level = share * bucket.capacity
        return acc

    def admit(self, key: str, model: str) -> Ticket | Rejection:
        """Admit one request of ``key`` for ``model``, or say which limit refuses it and when
        to come back. Nothing is taken unless every limit admits it."""
        now = self.clock()
        scopes: tuple[tuple[Scope, str, Limits], ...] = (("key", key, self.policy.for_key(key)),
                                                         ("model", model, self.policy.for_model(model)))
        accounts = []
        for scope, name, limits in scopes:
            acc = self._account(scope, name, limits, now)
            what = f"{'API key ' + name if scope == 'key' else 'model ' + repr(name)}"
            if limits.max_in_flight is not None and acc.in_flight >= limits.max_in_flight:
                return Rejection(scope, "in_flight", 1.0,
                                 f"Too many requests in flight for {what}: the limit is {limits.max_in_flight}. "
                                 "Retry when one of them has finished.")
            if acc.requests is not None:
                acc.requests.refill(now)
                wait = acc.requests.wait_for(1.0)
                if wait > 0:
                    return Rejection(scope, "requests_per_minute", wait,
                                     f"Rate limit reached for {what}: {acc.requests.per_minute:g} requests per "
                                     f"minute. Retry in {math.ceil(wait)}s.")
            if acc.tokens is not None:
                acc.tokens.refill(now)
                if acc.tokens.level <= 0:
                    wait = acc.tokens.wait_for(1.0)
                    return Rejection(scope, "tokens_per_minute", wait,
                                     f"Rate limit reached for {what}: {acc.tokens.per_minute:g} tokens per minute. "
                                     f"Retry in {math.ceil(wait)}s.")
            accounts.append(acc)
        for acc in accounts:
            acc.in_flight += 1
            if acc.requests is not None:
                acc.requests.level -= 1.0
        return Ticket(key, model)

    def release(self, ticket: Ticket, tokens: int) -> None:
        """The request ended having used ``tokens`` (prompt and completion, as vLLM counts)."""
        now = self.clock()
        pairs: tuple[tuple[Scope, str], ...] = (("key", ticket.key), ("model", ticket.model))
        for scope, name in pairs:
            acc = self._accounts.get((scope, name))
            if acc is None:
                continue
            acc.in_flight = max(0, acc.in_flight - 1)
            if acc.tokens is not None and tokens:
                acc.tokens.refill(now)
                acc.tokens.level -= tokens


class PolicyFile:
    """The limits file and its last good contents, re-read when its mtime changes."""

    def __init__(self, path: Path, on_error: Callable[[str], None]) -> None:
        self.path = path
        self.on_error = on_error
        self.mtime = os.stat(path).st_mtime_ns  # a missing file fails the start, loudly
        self.policy = parse_policy(path.read_text(), str(path))
        self.checked = time.monotonic()

    def current(self) -> Policy:
        now = time.monotonic()
        if now - self.checked < RELOAD_CHECK_S:
            return self.policy
        self.checked = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime != self.mtime:
                self.mtime = mtime
                self.policy = parse_policy(self.path.read_text(), str(self.path))
                log.warning("limits reloaded from %s", self.path)
        except (OSError, PolicyError) as exc:
            self.on_error(f"keeping the limits in force: {exc}")
        return self.policy
