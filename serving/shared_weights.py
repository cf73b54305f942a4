"""Experiment weights shared by every gateway replica through Redis.

One key per experiment's public model name (``<prefix>:experiment:<model>``) holds the same
entry the state file holds for one gateway (serving/weights_store.py): experiment, variants,
the file's weights it started from, the weights in force and the epoch. The experiment file
is read, never written (it may be a read-only ConfigMap).

- **Start**: a replica takes the entry in force if it applies to its file (same experiment,
  variants and file weights); otherwise the file's weights start the next epoch, written for
  all. Replicas starting together from the same file and entry write the same thing.
- **Change**: through any replica, as one optimistic transaction (WATCH, read, resolve the
  new weights against the weights in force, write epoch + 1), so two admins at once can
  neither lose a change nor reuse an epoch. The replica that took it routes by it at once.
- **Sync**: every replica reads all its experiments' entries every ``POLL_S`` and routes by
  any newer one of the same experiment and variants: a change is in force everywhere within
  a second. An entry gone from Redis (flushed, restarted without persistence) is written
  back with the weights this replica routes by, only if still absent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from redis.asyncio import Redis
from redis.exceptions import WatchError

from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState
from inferwatch.serving.split import ExperimentFile, Split, resolve_weights
from inferwatch.serving.weights_store import describe_change, running_state, split_from_state, state_entry

log = logging.getLogger(__name__)

POLL_S = 0.25
MAX_TRANSACTION_ATTEMPTS = 8


class SharedWeights:
    def __init__(self, shared: SharedState, spec: ExperimentFile, source: str) -> None:
        self.shared, self.spec, self.source = shared, spec, source
        self.keys = {model: shared.key("experiment", model) for model in spec.experiments}

    def _entry(self, split: Split) -> bytes:
        return orjson.dumps(state_entry(split, self.spec.experiments[split.model]))

    async def load(self) -> dict[str, Split]:
        """The splits to start with (raises ``SharedStateUnavailable``: the caller starts degraded)."""
        models = list(self.keys)

        async def read_and_settle(client: Redis) -> dict[str, Split]:
            raw = await client.mget([self.keys[m] for m in models])
            splits, writes = {}, {}
            for model, value in zip(models, raw):
                entry = _decode(value)
                split, applied = split_from_state(model, self.spec.experiments[model], entry,
                                                  f"Redis ({self.keys[model]})", self.source)
                splits[model] = split
                if not applied:
                    writes[self.keys[model]] = self._entry(split)
            if writes:
                await client.mset(writes)
            return splits

        return await self.shared.run("weights_load", read_and_settle, BACKGROUND_TIMEOUT_S)

    async def poll(self, splits: Mapping[str, Split]) -> dict[str, Split]:
        """The splits whose entry in Redis moved on from ``splits`` (raises ``SharedStateUnavailable``)."""
        models = list(self.keys)

        async def read(client: Redis) -> dict[str, Split]:
            raw = await client.mget([self.keys[m] for m in models])
            changed, missing = {}, []
            for model, value in zip(models, raw):
                split = splits[model]
                if value is None:
                    missing.append(model)
                    continue
                state = running_state(_decode(value), split)
                if state is None:
                    continue  # another experiment under this name: a replica with another file; the alert says so
                weights, epoch = state
                if (weights, epoch) != (split.weights, split.epoch):
                    changed[model] = Split.of(model, self.spec.experiments[model], weights, epoch)
            for model in missing:
                if await client.set(self.keys[model], self._entry(splits[model]), nx=True):
                    log.warning("experiment %s (model %s): no weights in Redis; wrote back the ones this replica "
                                "routes by (epoch %d)", splits[model].name, model, splits[model].epoch)
            return changed

        return await self.shared.run("weights_poll", read, BACKGROUND_TIMEOUT_S)

    async def set(self, current: Split, given: object) -> Split:
        """Apply ``given`` to the weights in force (``ExperimentError`` if it cannot take them;
        ``SharedStateUnavailable`` if Redis did not answer: nothing changed)."""
        key = self.keys[current.model]
        exp = self.spec.experiments[current.model]

        async def transaction(client: Redis) -> Split:
            async with client.pipeline(transaction=True) as pipe:
                for _ in range(MAX_TRANSACTION_ATTEMPTS):
                    try:
                        await pipe.watch(key)
                        state = running_state(_decode(await pipe.get(key)), current)
                        base = current if state is None else Split.of(current.model, exp, *state)
                        new = base.with_weights(resolve_weights(base, given))  # type: ignore[arg-type]
                        pipe.multi()
                        pipe.set(key, self._entry(new))
                        await pipe.execute()
                        log.warning("%s (through Redis, replica %s)", describe_change(base, new), self.shared.replica)
                        return new
                    except WatchError:
                        continue
            raise WatchError(f"{key} changed under {MAX_TRANSACTION_ATTEMPTS} attempts in a row")

        return await self.shared.run("weights_set", transaction, BACKGROUND_TIMEOUT_S)


def _decode(value: bytes | None) -> object:
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
