"""The gateway replicas' link to Redis, where they share what must act as one behind a load
balancer: experiment weights (serving/shared_weights.py), the answers remembered for
feedback (serving/feedback.py) and admission allowance (serving/shared_limits.py).

Redis is never in a request's way for longer than ``timeout_s``: weights are synced in the
background and routed from memory, answers are written in batches, admission takes
allowance in leases ahead of need. Every operation goes through ``run``, which bounds it in
time and turns any failure into ``SharedStateUnavailable``; the link keeps
``inferwatch_gateway_shared_state_up`` at 0 from the first failure to the next success, and
counts errors by operation. Each part then does without Redis in its own way (last weights
known, local answers, local limits) and catches up by itself when Redis answers again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKGROUND_TIMEOUT_S = 1.0  # syncing, flushing, admin calls: nothing waits on them but an admin
BEAT_S = 1.0
REPLICA_STALE_S = 5.0
OPERATIONS = ("heartbeat", "weights_load", "weights_poll", "weights_set", "answers_write", "answers_find", "rating_claim",
              "limits_lease", "limits_sync", "budgets_sync")


class SharedStateUnavailable(Exception):
    """Redis did not answer in time or failed; the message says which operation and why."""


def check_redis_url(url: str) -> None:
    """Refuse, at start, a URL the client cannot use, with what was wrong (``ValueError``)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must be redis://[[user]:password@]host[:port][/db], rediss://... (TLS) or "
                         "unix:///path/to/redis.sock")
    try:
        Redis.from_url(url)  # parses only; connects on first use
        parts = urlsplit(url)
        if parts.scheme != "unix":
            db = parts.path.strip("/")
            if not parts.hostname:
                raise ValueError("no host")
            if db and not db.isdigit():
                raise ValueError(f"the database after the host must be a number, not '{db[:32]}'")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot be used as a Redis URL: {exc}") from None


class SharedState:
    """One Redis client per gateway, its health in metrics, and the keys' namespace."""

    def __init__(self, url: str, prefix: str, timeout_s: float, up: Gauge, errors: Counter) -> None:
        # No retries inside the client: a retry would take a request past its bound; the
        # callers retry on their own schedule (the next sync, the next lease).
        self.client = Redis.from_url(url, socket_timeout=BACKGROUND_TIMEOUT_S,
                                     socket_connect_timeout=BACKGROUND_TIMEOUT_S,
                                     retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._up, self._errors = up, errors
        self._failing: str | None = None  # the first failure of the current outage, logged once
        self.replicas = 1  # gateways seen beating lately, this one included: limits' shares while Redis is down
        self._beating: asyncio.Task | None = None
        for op in OPERATIONS:
            errors.labels(op)
        up.set(0)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def up(self) -> bool:
        return self._failing is None

    async def run(self, op: str, call: Callable[[Redis], Awaitable[T]], timeout_s: float | None = None) -> T:
        """``call(client)`` within ``timeout_s`` (the request bound by default)."""
        try:
            async with asyncio.timeout(self.timeout_s if timeout_s is None else timeout_s):
                result = await call(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._errors.labels(op).inc()
            if not isinstance(exc, (ConnectionError, OSError, TimeoutError, RedisTimeoutError)):
                # Redis answered, with an error (a script's, a transaction that kept conflicting):
                # this operation failed, the link is not down
                log.warning("shared state (Redis) refused %s: %s", op, reason)
                raise SharedStateUnavailable(f"Redis refused {op}: {reason}") from None
            if self._failing is None:
                self._failing = reason
                log.error("shared state (Redis) unavailable at %s: %s; going on with what this replica knows",
                          op, reason)
            self._up.set(0)
            raise SharedStateUnavailable(f"Redis did not answer {op}: {reason}") from None
        if self._failing is not None:
            log.warning("shared state (Redis) answers again (it failed with %s)", self._failing)
            self._failing = None
        self._up.set(1)
        return result

    async def start(self) -> None:
        """Say loudly at start whether Redis answers, then beat every ``BEAT_S`` (which also
        notices when it answers again)."""
        try:
            await self.beat()
        except SharedStateUnavailable as exc:
            log.error("STARTING DEGRADED: %s. Each part goes on with what this replica knows until Redis answers.",
                      exc)
        self._beating = asyncio.create_task(every(BEAT_S, self.beat, "shared state heartbeat"))

    async def beat(self) -> None:
        """Say this replica is alive and count the replicas that are."""
        key, wall = self.key("replicas"), time.time()

        async def call(client: Redis) -> dict:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hset(key, self.replica, f"{wall:.3f}")
                pipe.expire(key, 60)
                pipe.hgetall(key)
                return (await pipe.execute())[2]

        entries = await self.run("heartbeat", call, BACKGROUND_TIMEOUT_S)
        gone = [r for r, at in entries.items() if wall - _seconds(at) > REPLICA_STALE_S]
        self.replicas = max(1, len(entries) - len(gone))
        if gone:
            await self.run("heartbeat", lambda c: c.hdel(key, *gone), BACKGROUND_TIMEOUT_S)

    async def close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        try:
            await self.run("heartbeat", lambda c: c.hdel(self.key("replicas"), self.replica), BACKGROUND_TIMEOUT_S)
        except SharedStateUnavailable:
            pass
        await self.client.aclose()


def _seconds(value: bytes) -> float:
    """A heartbeat's time; anything unreadable (written by hand) counts as long gone."""
    try:
        return float(value)
    except ValueError:
        return 0.0


async def every(interval_s: float, step: Callable[[], Awaitable[None]], name: str) -> None:
    """Run ``step`` every ``interval_s`` until cancelled; a step that fails unexpectedly is
    logged and the loop goes on (Redis failures are the link's business, not this loop's)."""
    while True:
        try:
            await step()
        except SharedStateUnavailable:
            pass
        except Exception:
            log.exception("%s failed", name)
        await asyncio.sleep(interval_s)
