"""Answers remembered for feedback, shared by the gateway replicas through Redis, so that a
rating reaches its answer whichever replica gave it and whichever one takes the rating.

Writing one key per answer would cost a Redis command per request, more than the rest of
the gateway's own work on it (bench/gateway_overhead.py). Answers are written instead in
batches: what a replica remembered in the last ``FLUSH_S`` goes out as one ``HSET`` into the
hash of the current hour (``<prefix>:answers:<hour>``), which expires an hour after the
feedback TTL. A lookup reads the hours the TTL spans in one pipeline. An answer is thus
rateable through another replica ``FLUSH_S`` after it was given (through its own at once),
and Redis holds about 100 bytes per answer for the TTL: size ``maxmemory`` for the traffic
of ``INFERWATCH_GATEWAY_FEEDBACK_TTL_S``, or shorten it.

Each answer counts once across replicas: a rating claims ``<prefix>:rated:<id>`` with
``SET NX`` before it is forwarded, and gives the claim back if the drift service did not
take it. A replica that rates its own answer while Redis does not answer claims it on its
own and writes the claim when Redis answers again, so no other replica rates it after.

Rating is not on the path of an inference request: its Redis calls wait up to the
background bound (1 s), not the 5 ms a request may wait, so a busy moment is no 503 and
no second count.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import orjson
from redis.asyncio import Redis

from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState, SharedStateUnavailable
from inferwatch.serving.split import Assignment

FLUSH_S = 0.02
HOUR_S = 3600
MAX_HELD = 100_000  # answers and claims kept for Redis while it does not answer
RETRY_S = 1.0

# (model, variant, assignment, wall-clock seconds when given)
Remembered = tuple[str, str, Assignment | None, float]


class SharedAnswers:
    def __init__(self, shared: SharedState, ttl_s: float, wall: Callable[[], float] = time.time) -> None:
        self.shared, self.ttl_s, self.wall = shared, ttl_s, wall
        self._pending: dict[str, bytes] = {}
        self._claims: list[str] = []  # ratings claimed here while Redis did not answer
        self._flushing: asyncio.Task | None = None
        self._retry_armed = False
        self._hours = math.ceil(ttl_s / HOUR_S) + 1

    def remember(self, response_id: str, model: str, variant: str, assignment: Assignment | None) -> None:
        a = assignment
        self._pending[response_id] = orjson.dumps(
            (model, variant, a.experiment, a.epoch, a.weight, a.unit, self.wall()) if a else
            (model, variant, None, None, None, None, self.wall()))
        self._schedule()

    def claimed_here(self, response_id: str) -> None:
        """A rating claimed without Redis: written there with the next flush that succeeds."""
        if len(self._claims) < MAX_HELD:
            self._claims.append(response_id)
        self._schedule()

    def _schedule(self, retry: bool = False) -> None:
        """Flush soon; while Redis is down only the retry timer does (every ``RETRY_S``)."""
        if retry:
            self._retry_armed = False
        if not (retry or self.shared.up):
            if not self._retry_armed:
                self._retry_armed = True
                asyncio.get_running_loop().call_later(RETRY_S, self._schedule, True)
            return
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        """One flush at a time: what arrives meanwhile waits for the next (a silent Redis would
        otherwise get a new connection every ``FLUSH_S``)."""
        try:
            await asyncio.sleep(FLUSH_S)
            ok = await self.flush()
        finally:
            self._flushing = None
        if ok and (self._pending or self._claims):
            self._schedule()

    def forget_claim(self, response_id: str) -> None:
        """A claim made here and given back before it reached Redis."""
        if response_id in self._claims:
            self._claims.remove(response_id)

    async def flush(self) -> bool:
        """Write what is pending; while Redis fails, keep it (up to ``MAX_HELD``) and try again
        every ``RETRY_S``: answers given and ratings claimed during an outage reach the other
        replicas when it ends."""
        pending, self._pending = self._pending, {}
        claims, self._claims = self._claims, []
        if not pending and not claims:
            return True
        key = self.shared.key("answers", str(int(self.wall() // HOUR_S)))

        async def write(client: Redis) -> None:
            async with client.pipeline(transaction=False) as pipe:
                if pending:
                    pipe.hset(key, mapping=pending)  # type: ignore[arg-type]  # redis-py's Mapping: invariant key type
                    pipe.expire(key, int(self.ttl_s) + HOUR_S)
                for rid in claims:
                    pipe.set(self.shared.key("rated", rid), self.shared.replica, nx=True, ex=int(self.ttl_s) + 1)
                await pipe.execute()

        try:
            await self.shared.run("answers_write", write, BACKGROUND_TIMEOUT_S)
        except SharedStateUnavailable:  # counted and logged by the link; all of it waits for the next try
            self._claims.extend(claims[:MAX_HELD - len(self._claims)])
            for rid, value in pending.items():
                if len(self._pending) >= MAX_HELD:
                    break
                self._pending.setdefault(rid, value)
            if not self._retry_armed:
                self._retry_armed = True
                asyncio.get_running_loop().call_later(RETRY_S, self._schedule, True)
            return False
        return True

    async def find(self, response_id: str) -> Remembered | None:
        """The answer another replica gave, if any within the TTL (raises ``SharedStateUnavailable``)."""
        pending = self._pending.get(response_id)
        if pending is not None:
            return _decode(pending)
        now_hour = int(self.wall() // HOUR_S)

        async def read(client: Redis) -> list:
            async with client.pipeline(transaction=False) as pipe:
                for h in range(now_hour, now_hour - self._hours, -1):
                    pipe.hget(self.shared.key("answers", str(h)), response_id)
                return await pipe.execute()

        for raw in await self.shared.run("answers_find", read, BACKGROUND_TIMEOUT_S):
            if raw is not None:
                found = _decode(raw)
                return found if self.wall() - found[3] <= self.ttl_s else None
        return None

    async def claim(self, response_id: str) -> bool:
        """True if this rating is the answer's first (raises ``SharedStateUnavailable``)."""
        key = self.shared.key("rated", response_id)
        return bool(await self.shared.run("rating_claim",
                                          lambda c: c.set(key, self.shared.replica, nx=True, ex=int(self.ttl_s) + 1),
                                          BACKGROUND_TIMEOUT_S))

    async def unclaim(self, response_id: str) -> None:
        key = self.shared.key("rated", response_id)
        await self.shared.run("rating_claim", lambda c: c.delete(key), BACKGROUND_TIMEOUT_S)


def _decode(raw: bytes) -> Remembered:
    model, variant, experiment, epoch, weight, unit, at = orjson.loads(raw)
    return model, variant, (Assignment(experiment, epoch, weight, unit) if experiment is not None else None), at
