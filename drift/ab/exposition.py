"""The experiments the drift service watches, and their verdicts as Prometheus gauges.

An experiment is watched once someone asks for its verdict (Argo Rollouts, Flagger, a
person): the last question per model wins. At scrape time each watched experiment is
evaluated again on the current window; assignment counts and feedback given with the
question are not reused (they go stale), so the gauges' sample-ratio check counts records
until the gateway's assignment counter can be read instead."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.drift import metrics as m
from inferwatch.drift.ab.decision import DECISIONS, AbResult, Experiment, analyse
from inferwatch.drift.ab.source import read_arms
from inferwatch.drift.state import DriftState


@dataclass(frozen=True)
class Watched:
    model: str
    experiment: Experiment
    since: float | None


class Watchlist:
    def __init__(self) -> None:
        self._items: dict[str, Watched] = {}
        self._lock = threading.Lock()

    def watch(self, model: str, experiment: Experiment, since: float | None) -> None:
        with self._lock:
            self._items[model] = Watched(model, replace(experiment, assignments=None), since)

    def items(self) -> list[Watched]:
        with self._lock:
            return sorted(self._items.values(), key=lambda w: w.model)


def evaluate(state: DriftState, watched: Watched) -> AbResult | None:
    """The watched experiment's verdict now (an arm without records is one without traffic);
    None while neither variant has a window."""
    exp = watched.experiment
    arms = read_arms(state, watched.model, exp.control, exp.treatment, watched.since)
    return None if arms is None else analyse(exp, *arms)


class AbCollector(Collector):
    def __init__(self, state: DriftState, watchlist: Watchlist) -> None:
        self.state, self.watchlist = state, watchlist

    def collect(self) -> Iterator[Metric]:
        families = {spec: GaugeMetricFamily(spec.name, spec.doc, labels=list(spec.labels)) for spec in m.AB_METRICS}
        for watched in self.watchlist.items():
            result = evaluate(self.state, watched)
            if result is None:
                continue
            exp = result.experiment
            key = [watched.model, exp.control, exp.treatment]
            for decision in DECISIONS:
                families[m.AB_DECISION].add_metric([*key, decision], float(result.decision == decision))
            for arm, n in zip(("control", "treatment"), result.requests):
                families[m.AB_REQUESTS].add_metric([*key, arm], n)
            families[m.AB_TREATMENT_SHARE].add_metric(key, result.treatment_share)
            families[m.AB_SRM_P_VALUE].add_metric(key, result.srm.result.p_value)
            for name, r in result.metrics.items():
                if r.status != "ok":
                    continue
                families[m.AB_WORSE].add_metric([*key, name], float(r.verdict == "worse"))
                families[m.AB_P_VALUE].add_metric([*key, name], r.p_value_sequential)  # type: ignore[arg-type]
                if r.relative is not None:
                    families[m.AB_EFFECT_RELATIVE].add_metric([*key, name], r.relative)
        yield from families.values()
