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
  any with a later epoch, of the same experiment and variants: a change is in force
  everywhere within a second. Epochs only grow: an entry with an earlier epoch than the one
  a replica routes by (Redis restarted empty and refilled by a replica that started without
  it, a damaged value rewritten by a restarted replica), or one that cannot be read, is
  written over with this replica's, if nobody changed it meanwhile; so the fleet converges on
  its latest weights. An entry of another experiment or other variants (a replica with
  another experiment file) is left alone, logged, and refused by weight changes (409).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from redis.asyncio import Redis
from redis.exceptions import WatchError

from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState
from inferwatch.serving.split import ExperimentFile, Split, resolve_weights
from inferwatch.serving.weights_store import describe_change, foreign, running_state, split_from_state, state_entry

log = logging.getLogger(__name__)

POLL_S = 0.25
MAX_TRANSACTION_ATTEMPTS = 8


class ExperimentConflict(Exception):
    """The shared weights belong to another experiment file than this replica's."""


class SharedWeights:
    def __init__(self, shared: SharedState, spec: ExperimentFile, source: str) -> None:
        self.shared, self.spec, self.source = shared, spec, source
        self.keys = {model: shared.key("experiment", model) for model in spec.experiments}
        self._said: dict[str, str] = {}  # per model, the last thing logged about a foreign entry

    def _entry(self, split: Split) -> bytes:
        return orjson.dumps(state_entry(split, self.spec.experiments[split.model]))

    async def load(self) -> dict[str, Split]:
        """The splits to start with (raises ``SharedStateUnavailable``: the caller starts degraded)."""
        models = list(self.keys)

        async def read_and_settle(client: Redis) -> dict[str, Split]:
            keys = [self.keys[m] for m in models]
            async with client.pipeline(transaction=True) as pipe:
                for _ in range(MAX_TRANSACTION_ATTEMPTS):
                    try:  # as one transaction: a change made meanwhile is never written over
                        await pipe.watch(*keys)
                        raw = await pipe.mget(keys)
                        splits, writes = self._settle(models, raw)
                        if writes:
                            pipe.multi()
                            pipe.mset(writes)
                            await pipe.execute()
                        else:
                            await pipe.reset()
                        return splits
                    except WatchError:
                        continue
            raise WatchError(f"the experiment keys changed under {MAX_TRANSACTION_ATTEMPTS} attempts in a row")

        return await self.shared.run("weights_load", read_and_settle, BACKGROUND_TIMEOUT_S)

    def _settle(self, models: list[str], raw: list[bytes | str | None]) -> tuple[dict[str, Split], dict[str, bytes]]:
        """The splits to start with from what Redis holds, and the entries to write for the ones
        it holds none applying to this file (a new experiment, an edited file: the next epoch)."""
        splits, writes = {}, {}
        for model, value in zip(models, raw):
            entry = _decode(value)
            if value is not None and not isinstance(entry, dict):
                log.error("experiment (model %s): the entry in Redis (%s) cannot be read; starting from the "
                          "file, and replicas routing by a later epoch will write theirs over it", model,
                          self.keys[model])
            split, applied = split_from_state(model, self.spec.experiments[model], entry,
                                              f"Redis ({self.keys[model]})", self.source)
            splits[model] = split
            if not applied:
                writes[self.keys[model]] = self._entry(split)
        return splits, writes

    async def poll(self, splits: Mapping[str, Split]) -> dict[str, Split]:
        """The splits whose entry in Redis has a later epoch than ``splits`` (raises
        ``SharedStateUnavailable``); entries behind, unreadable or gone are written over."""
        models = list(self.keys)

        async def read(client: Redis) -> dict[str, Split]:
            raw = await client.mget([self.keys[m] for m in models])
            changed, behind = {}, {}
            for model, value in zip(models, raw):
                split = splits[model]
                entry = _decode(value)
                state = running_state(entry, split)
                if state is None:
                    if foreign(entry, split):
                        self._say_once(model, f"holds experiment {entry['experiment']!r} with variants "
                                              f"{entry['variants']} (another experiment file); routing by this "
                                              "replica's own weights")
                    else:
                        behind[model] = value  # gone or unreadable
                    continue
                weights, epoch = state
                if epoch > split.epoch:
                    changed[model] = Split.of(model, self.spec.experiments[model], weights, epoch)
                elif epoch < split.epoch:
                    behind[model] = value
            for model, seen in behind.items():
                await self._write_over(client, splits[model], seen)
            return changed

        return await self.shared.run("weights_poll", read, BACKGROUND_TIMEOUT_S)

    async def _write_over(self, client: Redis, split: Split, seen: bytes | str | None) -> None:
        """Write this replica's entry where Redis holds ``seen`` still (absent, unreadable or an
        earlier epoch), in one transaction: a change made meanwhile is never overwritten."""
        key = self.keys[split.model]
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                if await pipe.get(key) != seen:
                    return
                pipe.multi()
                pipe.set(key, self._entry(split))
                await pipe.execute()
            except WatchError:
                return
        log.warning("experiment %s (model %s): Redis held %s; wrote back epoch %d, the weights this replica routes by",
                    split.name, split.model, "nothing" if seen is None else "an earlier or unreadable entry",
                    split.epoch)

    def _say_once(self, model: str, message: str) -> None:
        if self._said.get(model) != message:
            self._said[model] = message
            log.warning("experiment (model %s): Redis %s", model, message)

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
                        entry = _decode(await pipe.get(key))
                        if foreign(entry, current):
                            raise ExperimentConflict(
                                f"the replicas' shared weights for model '{current.model}' are experiment "
                                f"'{entry['experiment']}' with variants {', '.join(map(str, entry['variants']))}, "
                                f"not this replica's '{current.name}' ({', '.join(v.name for v in current.variants)}):"
                                " the replicas run different experiment files. Roll out one file to all of them "
                                "first; nothing changed.")
                        state = running_state(entry, current)
                        base = (current if state is None or state[1] < current.epoch
                                else Split.of(current.model, exp, *state))
                        new = base.with_weights(resolve_weights(base, given))
                        pipe.multi()
                        pipe.set(key, self._entry(new))
                        await pipe.execute()
                        log.warning("%s (through Redis, replica %s)", describe_change(base, new), self.shared.replica)
                        return new
                    except WatchError:
                        continue
            raise WatchError(f"{key} changed under {MAX_TRANSACTION_ATTEMPTS} attempts in a row")

        return await self.shared.run("weights_set", transaction, BACKGROUND_TIMEOUT_S)


def _decode(value: bytes | str | None) -> object:  # bytes: the client does not decode
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
