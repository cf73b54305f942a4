"""The experiments the drift service watches, and their verdicts as Prometheus gauges.

An experiment is watched once someone asks for its verdict (Argo Rollouts, Flagger, a
person): the last question per model wins. At scrape time each watched experiment's latest
epoch is judged again from the ledgers, as the question asked it."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.drift import metrics as m
from inferwatch.drift.ab.book import LedgerBook
from inferwatch.drift.ab.cost import CostSource, priced
from inferwatch.drift.ab.decision import DECISIONS, AbResult
from inferwatch.drift.ab.verdict import AbRequest, InputError, Reading, judge, read


@dataclass(frozen=True)
class Watched:
    model: str
    request: AbRequest


class Watchlist:
    """The experiments asked about, and where their cost guardrail reads (None: nowhere)."""

    def __init__(self, cost: CostSource | None = None) -> None:
        self._items: dict[str, Watched] = {}
        self._lock = threading.Lock()
        self.cost = cost

    def watch(self, model: str, request: AbRequest) -> None:
        """The question as asked, but always about the latest epoch alone (the gauges and
        the report follow the experiment as it moves on; every worse guardrail they show
        is the current epoch's)."""
        with self._lock:
            self._items[model] = Watched(model, request.model_copy(update={"epoch": None, "scope": "epoch"}))

    def items(self) -> list[Watched]:
        with self._lock:
            return sorted(self._items.values(), key=lambda w: w.model)


def evaluate(ledgers: LedgerBook, watched: Watched, cost: CostSource | None = None
             ) -> tuple[Reading, AbResult, dict[str, Any]] | None:
    """The watched experiment's verdict now, with what it read and its JSON; None once its
    ledger is gone."""
    try:
        reading = ledgers.read(lambda book: read(book, watched.model, watched.request))
    except InputError:
        return None
    reading = priced(reading, watched.model, cost)
    return reading, *judge(watched.model, watched.request, reading)


class AbCollector(Collector):
    def __init__(self, ledgers: LedgerBook, watchlist: Watchlist) -> None:
        self.ledgers, self.watchlist = ledgers, watchlist

    def collect(self) -> Iterator[Metric]:
        families = {spec: GaugeMetricFamily(spec.name, spec.doc, labels=list(spec.labels)) for spec in m.AB_METRICS}
        for watched in self.watchlist.items():
            evaluated = evaluate(self.ledgers, watched, self.watchlist.cost)
            if evaluated is None:
                continue
            _, result, doc = evaluated
            exp = result.experiment
            key = [watched.model, exp.control, exp.treatment]
            for decision in DECISIONS:
                families[m.AB_DECISION].add_metric([*key, decision], float(result.decision == decision))
            for arm, n, units in zip(("control", "treatment"), result.requests, result.units):
                families[m.AB_REQUESTS].add_metric([*key, arm], n)
                families[m.AB_UNITS].add_metric([*key, arm], units)
            families[m.AB_EPOCH].add_metric(key, doc["epoch"])
            families[m.AB_TREATMENT_SHARE].add_metric(key, result.treatment_share)
            if result.srm is not None:
                families[m.AB_SRM_P_VALUE].add_metric(key, result.srm.p_value_sequential)
                families[m.AB_SRM_CHI2_P_VALUE].add_metric(key, result.srm.result.p_value)
            for name, r in result.metrics.items():
                if r.status != "ok":
                    continue
                families[m.AB_WORSE].add_metric([*key, name], float(r.verdict == "worse"))
                families[m.AB_P_VALUE].add_metric([*key, name], r.p_value_sequential)  # type: ignore[arg-type]  # ok: set
                if r.relative is not None:
                    families[m.AB_EFFECT_RELATIVE].add_metric([*key, name], r.relative)
                for bound, value in zip(("low", "high"), r.relative_interval or ()):
                    if math.isfinite(value):  # a control at 0 has no relative interval
                        families[m.AB_EFFECT_BOUND].add_metric([*key, name, bound], value)
        yield from families.values()
        not_kept = CounterMetricFamily(m.AB_NOT_KEPT.name, m.AB_NOT_KEPT.doc, labels=list(m.AB_NOT_KEPT.labels))
        counts, held = self.ledgers.read(lambda book: (
            {"experiments": book.overflow, "no_epoch": book.without_epoch, "too_old": book.too_old,
             "rating_unknown_experiment": book.unjoined}, book.nbytes()))
        for reason, count in counts.items():
            not_kept.add_metric([reason], count)
        yield not_kept
        yield GaugeMetricFamily(m.AB_LEDGER_BYTES.name, m.AB_LEDGER_BYTES.doc, value=held)
