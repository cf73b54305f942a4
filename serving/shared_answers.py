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
take it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import orjson
from redis.asyncio import Redis

from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState
from inferwatch.serving.split import Assignment

FLUSH_S = 0.02
HOUR_S = 3600

# (model, variant, assignment, wall-clock seconds when given)
Remembered = tuple[str, str, Assignment | None, float]


class SharedAnswers:
    def __init__(self, shared: SharedState, ttl_s: float, wall: Callable[[], float] = time.time) -> None:
        self.shared, self.ttl_s, self.wall = shared, ttl_s, wall
        self._pending: dict[str, bytes] = {}
        self._flushing: asyncio.Task | None = None
        self._hours = math.ceil(ttl_s / HOUR_S) + 1

    def remember(self, response_id: str, model: str, variant: str, assignment: Assignment | None) -> None:
        a = assignment
        self._pending[response_id] = orjson.dumps(
            (model, variant, a.experiment, a.epoch, a.weight, a.unit, self.wall()) if a else
            (model, variant, None, None, None, None, self.wall()))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        try:
            await asyncio.sleep(FLUSH_S)
        finally:
            self._flushing = None
        await self.flush()

    async def flush(self) -> None:
        """Write what is pending (dropped if Redis fails: those answers stay rateable through
        this replica only, and the error is counted)."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        key = self.shared.key("answers", str(int(self.wall() // HOUR_S)))

        async def write(client: Redis) -> None:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping=pending)
                pipe.expire(key, int(self.ttl_s) + HOUR_S)
                await pipe.execute()

        try:
            await self.shared.run("answers_write", write, BACKGROUND_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - counted and logged by the link
            pass

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

        for raw in await self.shared.run("answers_find", read):
            if raw is not None:
                found = _decode(raw)
                return found if self.wall() - found[3] <= self.ttl_s else None
        return None

    async def claim(self, response_id: str) -> bool:
        """True if this rating is the answer's first (raises ``SharedStateUnavailable``)."""
        key = self.shared.key("rated", response_id)
        return bool(await self.shared.run("rating_claim",
                                          lambda c: c.set(key, self.shared.replica, nx=True, ex=int(self.ttl_s) + 1)))

    async def unclaim(self, response_id: str) -> None:
        key = self.shared.key("rated", response_id)
        await self.shared.run("rating_claim", lambda c: c.delete(key), BACKGROUND_TIMEOUT_S)


def _decode(raw: bytes) -> Remembered:
    model, variant, experiment, epoch, weight, unit, at = orjson.loads(raw)
    return model, variant, (Assignment(experiment, epoch, weight, unit) if experiment is not None else None), at
