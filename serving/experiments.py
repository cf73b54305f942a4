"""The gateway's side of experiments: an upstream per variant, the public names in the model
list, the routing-time assignment counter, and weight changes that persist.

The split logic itself is pure (serving/experiment.py); this module gives it I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client import Counter

from inferwatch.serving.experiment import Split, resolve_weights
from inferwatch.serving.experiment_state import describe_change, load_splits, save_weights
from inferwatch.serving.metrics import GatewayMetrics
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.validation import ModelInfo

log = logging.getLogger(__name__)


class Catalog(Mapping[str, ModelInfo]):
    """The models clients may ask for: the default upstream's, and each experiment's public
    name, whose context is the smallest of its variants' (a request must fit every one)."""

    def __init__(self, default: Upstream, experiments: "Experiments") -> None:
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
                 default: Upstream) -> None:
        self.file = experiment_file
        self.splits: dict[str, Split] = load_splits(experiment_file)
        self.upstreams: dict[str, Upstream] = {default.base_url: default}
        for split in self.splits.values():
            for v in split.variants:
                if v.upstream_url not in self.upstreams:
                    self.upstreams[v.upstream_url] = Upstream(settings, metrics, v.upstream_url)
        self._default = default
        self.catalog = Catalog(default, self)
        # children made once: the hot path increments without a label lookup
        self.counters: dict[str, tuple[Counter, ...]] = {
            model: tuple(metrics.assignments.labels(model, v.name) for v in split.variants)
            for model, split in self.splits.items()}
        self._weights = metrics.experiment_weight
        for split in self.splits.values():
            self._publish(split)
        self._lock = asyncio.Lock()

    def _publish(self, split: Split) -> None:
        for v, w in zip(split.variants, split.weights):
            self._weights.labels(split.model, split.name, v.name).set(w)

    async def start(self) -> None:
        await asyncio.gather(*(u.start() for u in self.upstreams.values() if u is not self._default))

    async def close(self) -> None:
        await asyncio.gather(*(u.close() for u in self.upstreams.values() if u is not self._default))

    def describe(self) -> dict:
        return {"experiments": [split.describe() for split in self.splits.values()]}

    async def set_weights(self, model: str, given: object) -> Split:
        """Apply new weights to ``model``'s experiment: checked, persisted, then routed by,
        and logged. ``ExperimentError`` (nothing changed) for a change the experiment cannot
        take; ``KeyError`` for a model without one; ``OSError`` if it could not be persisted."""
        async with self._lock:
            split = self.splits[model]
            weights = resolve_weights(split, given)  # type: ignore[arg-type]
            new = split.with_weights(weights)
            changed = {**self.splits, model: new}
            await asyncio.to_thread(save_weights, self.file, changed)
            self.splits = changed
            self._publish(new)
            log.warning("%s", describe_change(split, new))
            return new

