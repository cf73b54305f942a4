"""Routing: which variant, and so which upstream, answers a request.

The gateway's side of experiments: an upstream per variant, the public names in the model
list, the assignment of each request (sticky by its unit key, or forced by an admin for
testing) counted when it is routed, and weight changes that persist. The split logic itself
is pure (serving/split.py); this module gives it I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import orjson
from prometheus_client import Counter

from inferwatch.serving import errors
from inferwatch.serving.errors import GatewayError
from inferwatch.serving.metrics import GatewayMetrics
from inferwatch.serving.request import RequestState
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.shared_state import SharedState, SharedStateUnavailable, every
from inferwatch.serving.shared_weights import POLL_S, SharedWeights
from inferwatch.serving.split import (
    FORCE_HEADER,
    FORCE_TOKEN_HEADER,
    Split,
    Variant,
    parse_experiments,
    resolve_weights,
)
from inferwatch.serving.tenants import ANONYMOUS
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.validation import ModelInfo, ParsedRequest
from inferwatch.serving.weights_store import describe_change, load_splits, save_weights

log = logging.getLogger(__name__)


class Catalog(Mapping[str, ModelInfo]):
    """The models clients may ask for: the default upstream's, and each experiment's public
    name, whose context is the smallest of its variants' (a request must fit every one)."""

    def __init__(self, default: Upstream, experiments: Experiments) -> None:
        self._default, self._experiments = default, experiments

    def __getitem__(self, name: str) -> ModelInfo:
        split = self._experiments.splits.get(name)
        if split is None:
            return self._default.models[name]
        lengths = []
        for v in split.variants:
            info = self._experiments.upstreams[v.upstream_url].models.get(v.served_model)
            if info is not None and info.max_model_len is not None:
                lengths.append(info.max_model_len)
        return ModelInfo(name, min(lengths) if lengths else None)

    def __iter__(self) -> Iterator[str]:
        yield from self._experiments.splits
        yield from (m for m in self._default.models if m not in self._experiments.splits)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Experiments:
    """Every experiment of the file, ready to route. Splits are immutable and swapped whole,
    so a request sees one set of weights from start to end."""

    def __init__(self, experiment_file: Path, settings: GatewaySettings, metrics: GatewayMetrics,
                 default: Upstream, shared: SharedState | None = None) -> None:
        self.file = experiment_file
        self.shared: SharedWeights | None = None
        if shared is not None:  # the file is only read; the weights in force come from Redis at start
            spec = parse_experiments(experiment_file.read_text(), str(experiment_file))
            self.shared = SharedWeights(shared, spec, str(experiment_file))
            self.splits: dict[str, Split] = {model: Split.of(model, exp) for model, exp in spec.experiments.items()}
        else:
            self.splits = load_splits(experiment_file)
            try:  # the epoch the file's weights start is kept too: an edit of the file later starts the next
                save_weights(experiment_file, self.splits)
            except OSError as exc:
                log.warning("experiment state not saved at start (%s): an edit of the file's weights before the "
                            "first weight change will reuse epoch numbers", exc)
        self.upstreams: dict[str, Upstream] = {default.base_url: default}
        for split in self.splits.values():
            for v in split.variants:
                if v.upstream_url not in self.upstreams:
                    self.upstreams[v.upstream_url] = Upstream(settings, metrics, v.upstream_url)
        self._default = default
        self.settings = settings
        self.catalog = Catalog(default, self)
        # children made once: the hot path increments without a label lookup
        self.counters: dict[str, tuple[Counter, ...]] = {
            model: tuple(metrics.assignments.labels(model, v.name) for v in split.variants)
            for model, split in self.splits.items()}
        self._weights, self._epochs = metrics.experiment_weight, metrics.experiment_epoch
        self._upstream_weights = metrics.upstream_weight
        self._served = metrics.variant_served_model
        for split in self.splits.values():
            self._publish(split)
        self._lock = asyncio.Lock()
        self._sync: asyncio.Task | None = None

    def _publish(self, split: Split) -> None:
        for v, w in zip(split.variants, split.weights):
            self._weights.labels(split.model, split.name, v.name).set(w)
            self._served.labels(split.model, v.name, v.served_model).set(1)
        self._epochs.labels(split.model, split.name).set(split.epoch)
        share = {url: 0.0 for url in self.upstreams} | {self._default.base_url: 1.0}
        for s in self.splits.values():
            for v, w in zip(s.variants, s.weights):
                share[v.upstream_url] = max(share[v.upstream_url], w)
        for url, w in share.items():
            self._upstream_weights.labels(url).set(w)

    def _adopt(self, new: Split) -> None:
        self.splits = {**self.splits, new.model: new}
        self._publish(new)

    async def start(self) -> None:
        await asyncio.gather(*(u.start() for u in self.upstreams.values() if u is not self._default))
        if self.shared is not None:
            try:
                for split in (await self.shared.load()).values():
                    self._adopt(split)
            except SharedStateUnavailable as exc:
                log.error("STARTING DEGRADED: %s. Routing by the experiment file's weights (%s) until Redis answers; "
                          "then by the weights in force there.", exc, self.file)
            self._sync = asyncio.create_task(every(POLL_S, self._poll, "experiment weights sync"))

    async def _poll(self) -> None:
        assert self.shared is not None
        for new in (await self.shared.poll(self.splits)).values():
            async with self._lock:
                if new.epoch > self.splits[new.model].epoch:  # a change through this replica may have passed it
                    log.warning("%s (synced from Redis)", describe_change(self.splits[new.model], new))
                    self._adopt(new)

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
        await asyncio.gather(*(u.close() for u in self.upstreams.values() if u is not self._default))

    def describe(self) -> dict:
        return {"experiments": [split.describe() for split in self.splits.values()]}

    async def set_weights(self, model: str, given: object) -> Split:
        """Apply new weights to ``model``'s experiment: checked, persisted, then routed by,
        and logged. ``ExperimentError`` (nothing changed) for a change the experiment cannot
        take; ``KeyError`` for a model without one; ``OSError`` if it could not be persisted, or
        ``SharedStateUnavailable`` if the replicas' shared weights could not be changed."""
        async with self._lock:
            split = self.splits[model]
            if self.shared is not None:  # SharedStateUnavailable: nothing changed anywhere
                new = await self.shared.set(split, given)
            else:
                new = split.with_weights(resolve_weights(split, given))
                await asyncio.to_thread(save_weights, self.file, {**self.splits, model: new})
                log.warning("%s", describe_change(split, new))
            self._adopt(new)
            return new


    def route(self, headers: Mapping[str, str], state: RequestState, req: ParsedRequest,
              may_force: Callable[[Mapping[str, str]], bool]) -> Variant | None:
        """Pick the variant of ``req.model``'s experiment (forced by header, else the split's
        assignment, counted now) and point the request at its upstream; ``None`` for a model
        without an experiment."""
        split = self.splits.get(req.model)
        if split is None:
            return None
        forced = headers.get(FORCE_HEADER)
        if forced is not None:
            state.forced = True
            index = self._forced_index(split, req, forced, may_force(headers))
        else:
            unit = req.payload.get("user")
            if not isinstance(unit, str) or not unit:
                unit = headers.get(self.settings.unit_header) or (state.key if state.key != ANONYMOUS else None)
            index, state.assignment = split.assign(unit)
            self.counters[req.model][index].inc()
        variant = split.variants[index]
        state.routed = True
        state.variant, state.upstream, state.rename = variant.name, self.upstreams[variant.upstream_url], variant.rename
        return variant

    def _forced_index(self, split: Split, req: ParsedRequest, forced: str, allowed: bool) -> int:
        """The variant the force header names. Forcing bypasses the weights, so it takes the
        admin token (any client could otherwise send users to a broken canary), and a variant
        rolled back to weight 0 is refused unless ``force_zero_weight`` allows it for testing."""
        if not allowed:
            raise GatewayError(403, "forcing_not_allowed", f"Header '{FORCE_HEADER}' forces a variant only with "
                               f"'{FORCE_TOKEN_HEADER}: <INFERWATCH_GATEWAY_ADMIN_TOKEN>' (and the gateway started "
                               "with that token).", param=FORCE_HEADER, error_type=errors.AUTHENTICATION)
        index = split.index(forced)
        if index is None:
            raise GatewayError(400, "unknown_variant",
                               f"Header '{FORCE_HEADER}' names variant '{forced[:64]}', which experiment "
                               f"'{split.name}' of model '{req.model}' does not have (variants: "
                               f"{', '.join(v.name for v in split.variants)}).", param=FORCE_HEADER)
        if split.weights[index] == 0 and not self.settings.force_zero_weight:
            raise GatewayError(409, "variant_rolled_back",
                               f"Variant '{forced[:64]}' of experiment '{split.name}' has weight 0 (rolled back); "
                               "forcing it is refused unless the gateway runs with "
                               "INFERWATCH_GATEWAY_FORCE_ZERO_WEIGHT=true.", param=FORCE_HEADER)
        return index

    def with_public_models(self, raw: bytes) -> bytes:
        """The upstream's model list plus each experiment's public name."""
        try:
            doc = orjson.loads(raw)
            data = doc["data"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return raw
        if not isinstance(data, list):
            return raw
        listed = {m.get("id") for m in data if isinstance(m, dict)}
        for model in self.splits:
            if model not in listed:
                info = self.catalog[model]
                data.append({"id": model, "object": "model", "owned_by": "inferwatch",
                             "max_model_len": info.max_model_len})
        return orjson.dumps(doc)
