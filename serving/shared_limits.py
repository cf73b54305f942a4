"""Admission limits that hold across gateway replicas, through Redis, without a Redis round
trip in the way of each request.

Each (scope, id) with a rate limit has a shared token bucket in Redis, refilled by Redis's
own clock in one Lua script (``BUCKET``), with the same rules as the local one
(serving/admission.py). Replicas take allowance from it in **leases**:

- **Requests per minute**: a replica takes up to ``lease_size`` requests at a time (a fifth
  of a second's worth at the limit, at least one) and admits from its lease without asking;
  when the lease runs low it takes the next one in the background, and a request finds the
  lease empty only when the background take has not come back yet; it then waits for one
  take, at most ``SharedState.timeout_s``. Allowance is only ever taken from the shared
  bucket, so the replicas together never admit more than the limit; a lease unused for
  ``LEASE_IDLE_S`` goes back, so a quiet replica holds none.
- **Tokens per minute**: charged after the fact, as locally; each replica adds up what its
  requests used and charges the sum every ``SYNC_S``, learning the shared level in return. A
  request is refused once the level it last learned, less what it has not charged yet, is
  spent: the replicas can overdraw by what they admit in one ``SYNC_S``, as one gateway can
  overdraw by what its requests in flight use.
- **In flight**: slots, leased one at a time from a shared count of who holds how many
  (``SLOTS``, per replica, so a replica that dies frees its slots after ``STALE_S``). A
  request runs in a free slot of its replica, or waits for one more slot as for a request
  lease; a slot is kept for the next request and goes back after ``LEASE_IDLE_S`` unused.
  The replicas together never run more than the limit; a replica's idle slots are
  unavailable to the others for at most ``LEASE_IDLE_S``.

While Redis does not answer, the replica enforces every limit on its own, divided by the
number of replicas it last saw (so the fleet stays near the limit), and goes back to the
shared buckets when Redis answers again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from inferwatch.serving.admission import Admission, Limits, Policy, Rejection, Scope, Ticket
from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState, SharedStateUnavailable

LEASE_S = 0.2  # a lease is this long's worth of allowance at the limit
LEASE_IDLE_S = 1.0
SYNC_S = 0.1
STALE_S = 3.0
SLOT_RETRY_S = 0.05

# A shared token bucket: refill by Redis's clock, then take up to ARGV[3] whole units (mode
# "take"), put back ARGV[3] (mode "put"), or charge ARGV[3] even past zero (mode "charge").
# Returns {units granted, level after} (level as a string: Lua numbers lose their fraction).
BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, cap, amount, mode = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local b = redis.call('HMGET', KEYS[1], 'level', 'updated')
local level = tonumber(b[1]) or cap
local updated = tonumber(b[2]) or now
level = math.min(cap, level + math.max(0, now - updated) * rate / 60)
local granted = 0
if mode == 'take' then
  granted = math.max(0, math.min(amount, math.floor(level)))
  level = level - granted
elseif mode == 'put' then
  level = math.min(cap, level + amount)
else
  level = level - amount
end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((cap - level) * 60 / rate) + 60)
return {granted, tostring(level)}
"""

# Slots in flight: KEYS[1] maps replica -> "held:when". A replica says how many slots it
# wants to hold in all (ARGV[2]); it gets them if the limit ARGV[3] allows what the others
# hold plus that (or always, with ARGV[5] = 1: giving back, saying what it holds, or slots
# already in use), else keeps ARGV[6]. Absolute counts, not changes: a call lost or
# repeated, or an entry dropped meanwhile, is repaired by the next. Holders silent for
# ARGV[4] seconds are gone. Returns 1 if granted.
SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local me, want, limit, stale, force, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  ARGV[5], tonumber(ARGV[6])
local entries = redis.call('HGETALL', KEYS[1])
local others = 0
for i = 1, #entries, 2 do
  if entries[i] ~= me then
    local v = entries[i + 1]
    local sep = string.find(v, ':', 1, true)
    local held = sep and tonumber(string.sub(v, 1, sep - 1)) or 0
    local at = sep and tonumber(string.sub(v, sep + 1)) or 0
    if now - at > stale then
      redis.call('HDEL', KEYS[1], entries[i])
    else
      others = others + held
    end
  end
end
local granted = 0
local mine = keep
if force == '1' or others + want <= limit then
  granted = 1
  mine = want
end
redis.call('HSET', KEYS[1], me, mine .. ':' .. now)
redis.call('EXPIRE', KEYS[1], math.ceil(stale) + 1)
return granted
"""


class SharedTicket(Ticket):
    """A ticket admitted against the shared allowance (not the local fallback's)."""


@dataclass
class _Shared:
    """One (scope, id)'s view of its shared allowance on this replica."""

    lease: int = 0  # requests this replica may admit without asking
    lease_used_at: float = 0.0
    taking: asyncio.Task | None = None
    tokens_level: float | None = None  # the shared tokens level last learned (None: not yet)
    tokens_learned_at: float = 0.0
    tokens_unsent: int = 0  # tokens used here and not yet charged
    owed: int = 0  # requests admitted without a lease (Redis slower than the bound): charged later
    in_flight: int = 0  # this replica's requests in flight
    slots: int = 0  # slots this replica holds (a free one is a request it may start without asking)
    slots_used_at: float = 0.0
    taking_slot: asyncio.Task | None = None
    requests_exhausted_until: float = 0.0  # the shared bucket said empty: refuse locally until then
    slots_exhausted_until: float = 0.0  # no slot was free anywhere: refuse until then (a moment)
    slots_told_at: float = 0.0  # when Redis last heard that the slots held are still held
    forced_slots: int = 0  # slots taken without asking (Redis slower than the bound): told to Redis at the next sync
    limits: Limits = field(default_factory=Limits)


class SharedAdmission:
    """Admission against shared buckets, falling back to ``local`` while Redis does not answer."""

    def __init__(self, shared: SharedState, policy: Policy) -> None:
        self.shared = shared
        self.policy = policy
        self.local = Admission(policy)
        self._accounts: dict[tuple[Scope, str], _Shared] = {}
        self._bucket = shared.client.register_script(BUCKET)
        self._slots = shared.client.register_script(SLOTS)
        self._local_shares: tuple[Policy, int] | None = None

    def _key(self, scope: Scope, name: str, what: str) -> str:
        return self.shared.key("limit", scope, name, what)

    def _limits(self, scope: Scope, name: str) -> Limits:
        return self.policy.for_key(name) if scope == "key" else self.policy.for_model(name)

    def admit(self, key: str, model: str) -> Ticket | Rejection | Awaitable[Ticket | Rejection]:
        """Like ``Admission.admit``; an awaitable when a lease must be fetched first."""
        if not self.shared.up:
            return self._admit_locally(key, model)
        verdict = self._try(key, model)
        if isinstance(verdict, list):  # the takes started run on their own; the request waits for them
            return self._admit_after_lease(key, model)
        return verdict

    def _try(self, key: str, model: str) -> Ticket | Rejection | list[Awaitable[None]]:
        """Admit from the leases and slots in hand, refuse, or give the takes to wait for."""
        now = time.monotonic()
        accounts: list[tuple[Scope, str, _Shared]] = []
        empty: list[Awaitable[None]] = []
        pairs: tuple[tuple[Scope, str], ...] = (("key", key), ("model", model))
        for scope, name in pairs:
            acc = self._accounts.get((scope, name))
            if acc is None:
                acc = self._accounts[(scope, name)] = _Shared()
            acc.limits = limits = self._limits(scope, name)
            refusal = self._refusal(scope, name, acc, limits, now)
            if refusal is not None:
                return refusal
            if limits.requests_per_minute is not None and acc.lease < 1:
                empty.append(self._refill(scope, name, acc))
            if limits.max_in_flight is not None and acc.in_flight >= acc.slots:
                empty.append(self._take_slot(scope, name, acc))
            accounts.append((scope, name, acc))
        return empty or self._take(key, model, accounts, now)

    def _refusal(self, scope: Scope, name: str, acc: _Shared, limits: Limits, now: float) -> Rejection | None:
        what = f"{'API key ' + name if scope == 'key' else 'model ' + repr(name)}"
        if limits.max_in_flight is not None and acc.in_flight >= acc.slots and now < acc.slots_exhausted_until:
            return Rejection(scope, "in_flight", 1.0,
                             f"Too many requests in flight for {what}: the limit is {limits.max_in_flight} across "
                             "the gateway's replicas. Retry when one of them has finished.")
        rpm = limits.requests_per_minute
        if rpm is not None and acc.lease < 1 and now < acc.requests_exhausted_until:
            wait = acc.requests_exhausted_until - now
            return Rejection(scope, "requests_per_minute", wait,
                             f"Rate limit reached for {what}: {rpm:g} requests per minute. "
                             f"Retry in {math.ceil(wait)}s.")
        tpm = limits.tokens_per_minute
        if tpm is not None and acc.tokens_level is not None:
            # the level learned, refilled since as the shared bucket refills, less what is not charged yet
            level = min(max(tpm, 1.0), acc.tokens_level + (now - acc.tokens_learned_at) * tpm / 60.0)
            left = level - acc.tokens_unsent
        if tpm is not None and acc.tokens_level is not None and left <= 0:
            wait = (1 - left) * 60.0 / tpm
            return Rejection(scope, "tokens_per_minute", wait,
                             f"Rate limit reached for {what}: {tpm:g} tokens per minute. Retry in {math.ceil(wait)}s.")
        return None

    def _take(self, key: str, model: str, accounts: list[tuple[Scope, str, _Shared]], now: float) -> SharedTicket:
        for scope, name, acc in accounts:
            acc.in_flight += 1
            acc.slots_used_at = now
            if acc.limits.requests_per_minute is not None:
                acc.lease -= 1
                acc.lease_used_at = now
                if acc.lease < max(1, lease_size(acc.limits.requests_per_minute) // 2):
                    self._refill(scope, name, acc)
        return SharedTicket(key, model)

    def _refill(self, scope: Scope, name: str, acc: _Shared) -> asyncio.Task:
        if acc.taking is None:
            acc.taking = asyncio.get_running_loop().create_task(self._take_lease(scope, name, acc))
        return acc.taking

    def _take_slot(self, scope: Scope, name: str, acc: _Shared) -> asyncio.Task:
        if acc.taking_slot is None:
            acc.taking_slot = asyncio.get_running_loop().create_task(self._slot(scope, name, acc))
        return acc.taking_slot

    async def _slot(self, scope: Scope, name: str, acc: _Shared) -> None:
        try:
            limit = acc.limits.max_in_flight
            if limit is None:
                return
            held = acc.slots
            granted = await self.shared.run(
                "limits_lease", lambda c: self._slots(keys=[self._key(scope, name, "in_flight")],
                                                      args=[self.shared.replica, held + 1, limit, STALE_S, 0, held],
                                                      client=c),
                BACKGROUND_TIMEOUT_S)
            acc.slots += int(granted)
            if not granted:  # every slot is held: refuse here for a moment rather than ask per request
                acc.slots_exhausted_until = time.monotonic() + SLOT_RETRY_S
        finally:
            acc.taking_slot = None

    async def _take_lease(self, scope: Scope, name: str, acc: _Shared) -> None:
        try:
            rpm = acc.limits.requests_per_minute
            if rpm is None:
                return
            granted, level = await self.shared.run(
                "limits_lease", lambda c: self._bucket(keys=[self._key(scope, name, "requests")],
                                                       args=[rpm, max(rpm, 1.0), lease_size(rpm), "take"], client=c),
                BACKGROUND_TIMEOUT_S)
            repaid = min(acc.owed, int(granted))
            acc.owed -= repaid
            acc.lease += int(granted) - repaid
            if not granted:  # empty: refuse here until one request's worth has come back
                acc.requests_exhausted_until = time.monotonic() + (1 - float(level)) * 60.0 / rpm
        finally:
            acc.taking = None

    async def _admit_after_lease(self, key: str, model: str) -> Ticket | Rejection:
        """Wait for leases (other requests may use them first: then wait for the next), at
        most the request bound in all; past it, or with Redis failing, judge locally."""
        try:
            async with asyncio.timeout(self.shared.timeout_s):
                while True:
                    verdict = self._try(key, model)
                    if not isinstance(verdict, list):
                        return verdict
                    await asyncio.gather(*(asyncio.shield(take) for take in verdict))
        except SharedStateUnavailable:
            return self._admit_locally(key, model)
        except TimeoutError:
            if not self.shared.up:
                return self._admit_locally(key, model)
            return self._admit_owing(key, model)

    def _admit_owing(self, key: str, model: str) -> Ticket | Rejection:
        """Redis answers, but slower than a request may wait: admit it now against the shared
        allowance still, as a debt (the lease on its way repays it, else the next sync charges
        it, past zero) and a slot taken whatever the limit (the others then see it). So the
        fleet is over a limit by at most the requests admitted this way and still running."""
        now = time.monotonic()
        accounts: list[tuple[Scope, str, _Shared]] = []
        pairs: tuple[tuple[Scope, str], ...] = (("key", key), ("model", model))
        for scope, name in pairs:
            acc = self._accounts[(scope, name)]
            refusal = self._refusal(scope, name, acc, acc.limits, now)
            if refusal is not None:
                return refusal
            accounts.append((scope, name, acc))
        for _scope, _name, acc in accounts:
            if acc.limits.requests_per_minute is not None and acc.lease < 1:
                acc.owed += 1
                acc.lease += 1  # spent at once by _take
            if acc.limits.max_in_flight is not None and acc.in_flight >= acc.slots:
                acc.slots += 1
                acc.forced_slots += 1
        return self._take(key, model, accounts, now)

    def _admit_locally(self, key: str, model: str) -> Ticket | Rejection:
        shares = (self.policy, self.shared.replicas)
        if self._local_shares != shares:
            self._local_shares = shares
            self.local.policy = divided(*shares)
        return self.local.admit(key, model)

    def release(self, ticket: Ticket, tokens: int) -> None:
        if not isinstance(ticket, SharedTicket):
            self.local.release(ticket, tokens)
            return
        pairs: tuple[tuple[Scope, str], ...] = (("key", ticket.key), ("model", ticket.model))
        for scope, name in pairs:
            acc = self._accounts.get((scope, name))
            if acc is None:
                continue
            acc.in_flight = max(0, acc.in_flight - 1)
            if acc.limits.tokens_per_minute is not None:
                acc.tokens_unsent += tokens

    async def sync(self) -> None:
        """Charge tokens used and debts, give back idle leases and slots, say what slots are held."""
        now = time.monotonic()
        for (scope, name), acc in list(self._accounts.items()):
            try:
                await self._sync_account(scope, name, acc, now)
            except SharedStateUnavailable:
                if not self.shared.up:
                    return  # Redis is down: the next pass, after it answers
                # Redis refused this account's call: the others still get theirs

    async def _sync_account(self, scope: Scope, name: str, acc: _Shared, now: float) -> None:
        limits = acc.limits
        tpm = limits.tokens_per_minute
        if tpm is not None and (acc.tokens_unsent or acc.tokens_level is None or acc.tokens_level < tpm):
            # charge what was used; with nothing to charge, learn how far the bucket refilled
            # (a replica that refuses everything uses nothing and must still see the refill)
            unsent = acc.tokens_unsent
            _, level = await self.shared.run(
                "limits_sync", lambda c: self._bucket(keys=[self._key(scope, name, "tokens")],
                                                      args=[tpm, max(tpm, 1.0), unsent, "charge"], client=c),
                BACKGROUND_TIMEOUT_S)
            acc.tokens_unsent -= unsent
            acc.tokens_level, acc.tokens_learned_at = float(level), time.monotonic()
        rpm = limits.requests_per_minute
        if rpm is not None and acc.owed and acc.taking is None:
            owed = acc.owed
            await self.shared.run(
                "limits_sync", lambda c: self._bucket(keys=[self._key(scope, name, "requests")],
                                                      args=[rpm, max(rpm, 1.0), owed, "charge"], client=c),
                BACKGROUND_TIMEOUT_S)
            acc.owed -= owed
        if rpm is not None and acc.lease > 0 and acc.taking is None and now - acc.lease_used_at > LEASE_IDLE_S:
            back, acc.lease = acc.lease, 0
            await self.shared.run(
                "limits_sync", lambda c: self._bucket(keys=[self._key(scope, name, "requests")],
                                                      args=[rpm, max(rpm, 1.0), back, "put"], client=c),
                BACKGROUND_TIMEOUT_S)
        limit = limits.max_in_flight
        if limit is not None and acc.taking_slot is None and (acc.slots or acc.forced_slots):
            idle = max(0, acc.slots - acc.in_flight) if now - acc.slots_used_at > LEASE_IDLE_S else 0
            if idle or acc.forced_slots or now - acc.slots_told_at > STALE_S / 3:
                # what this replica holds, in all: slots given back idle are gone before the
                # await (a request meanwhile asks for one), slots taken owing are counted
                acc.slots -= idle
                acc.forced_slots = 0
                held = acc.slots
                await self.shared.run(
                    "limits_sync", lambda c: self._slots(keys=[self._key(scope, name, "in_flight")],
                                                         args=[self.shared.replica, held, limit, STALE_S, 1, held],
                                                         client=c),
                    BACKGROUND_TIMEOUT_S)
                acc.slots_told_at = now


def lease_size(per_minute: float) -> int:
    return max(1, int(per_minute * LEASE_S / 60.0))


def divided(policy: Policy, replicas: int) -> Policy:
    """Every limit of ``policy`` over ``replicas`` (in flight rounded up): each replica's share
    while they cannot share allowance."""
    if replicas <= 1:
        return policy

    def share(limits: Limits) -> Limits:  # only the fields set: an override names only what it changes
        given = limits.model_dump(exclude_unset=True)
        return Limits(**{k: v if v is None else math.ceil(v / replicas) if k == "max_in_flight" else v / replicas
                         for k, v in given.items()})

    return Policy(default_key=share(policy.default_key), keys={k: share(v) for k, v in policy.keys.items()},
                  default_model=share(policy.default_model), models={m: share(v) for m, v in policy.models.items()})
