"""The cost guardrail's samples: each variant's output tokens per GPU-second, read from
Prometheus.

Unlike every other guardrail this is not a per-request quantity: a GPU's time is not split
between the requests it batches. The cost rules (alerts/cost.py) record it per variant,
``COST_SERIES{model, variant}``, where a variant runs alone on GPUs of its own; variants on
shared GPUs have no series, and the guardrail is then ``not_applicable``. The verdict takes
the two series at the same instants, one sample per ``STEP_S`` (non-overlapping 5-minute
rates), and compares them paired in time (drift/ab/decision.py ``_cost``): load moves both
arms together, the pairing takes it out.

I/O stays here; the analysis gets arrays. A Prometheus that does not answer degrades this
guardrail alone (its note says why), never the verdict.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Protocol

import numpy as np
import requests

from inferwatch.drift.ab.source import EpochArms
from inferwatch.drift.ab.verdict import Reading

log = logging.getLogger(__name__)

COST_SERIES = "inferwatch_cost:variant_output_tokens_per_gpu_second:rate5m"
STEP_S = 300.0
MAX_POINTS = 10_000  # Prometheus answers at most 11,000 points a series: the latest five weeks of an epoch


class CostSource(Protocol):
    def paired(self, model: str, control: str, treatment: str, start: float, end: float
               ) -> tuple[np.ndarray, np.ndarray] | str:
        """Both variants' samples at the instants both have one, or why there are none."""


class PrometheusCost:
    def __init__(self, url: str, step_s: float = STEP_S, timeout_s: float = 2.0) -> None:
        self.url, self.step_s, self.timeout_s = url.rstrip("/"), step_s, timeout_s
        self._failing = False  # logged once when Prometheus stops answering, once when it is back

    def paired(self, model: str, control: str, treatment: str, start: float, end: float
               ) -> tuple[np.ndarray, np.ndarray] | str:
        query = f'{COST_SERIES}{{model="{_string(model)}", variant=~"{_regex(control)}|{_regex(treatment)}"}}'
        # the first sample one step in: a rate over a window that began before the epoch is the last epoch's
        first = max(start + self.step_s, end - MAX_POINTS * self.step_s)
        if end < first:
            return "the epoch is shorter than one 5-minute step"
        try:
            resp = requests.get(f"{self.url}/api/v1/query_range", timeout=self.timeout_s,
                                params={"query": query, "start": str(first), "end": str(end), "step": str(self.step_s)})
            resp.raise_for_status()
            series = resp.json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            if not self._failing:
                log.warning("A/B cost guardrail: Prometheus at %s does not answer (%s); the guardrail is "
                            "not_applicable until it does", self.url, exc)
            self._failing = True
            return f"Prometheus at {self.url} did not answer ({type(exc).__name__})"
        if self._failing:
            log.warning("A/B cost guardrail: Prometheus at %s answers again", self.url)
            self._failing = False
        values = {s["metric"].get("variant"): {float(t): float(v) for t, v in s["values"]} for s in series}
        missing = [v for v in (control, treatment) if v not in values]
        if missing:
            return (f"no {COST_SERIES} for {', '.join(missing)}: the cost rules record a variant only while it runs "
                    "alone on GPUs of its own, under a served name of its own (docs/cost.md)")
        at = sorted(set(values[control]) & set(values[treatment]))
        return (np.array([values[control][t] for t in at]), np.array([values[treatment][t] for t in at]))


def _string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _regex(text: str) -> str:
    return _string(re.escape(text))


def with_cost(view: EpochArms, model: str, source: CostSource | None) -> EpochArms:
    """The epoch's arms with their paired throughput samples, or the reason there are none."""
    if source is None:
        return view
    got = ("the epoch has no records" if view.first_at is None or view.last_at is None else
           source.paired(model, view.control.name, view.treatment.name, view.first_at, view.last_at))
    if isinstance(got, str):
        return replace(view, control=replace(view.control, throughput_note=got))
    control, treatment = got
    return replace(view, control=replace(view.control, throughput=control),
                   treatment=replace(view.treatment, throughput=treatment))


def priced(reading: Reading, model: str, source: CostSource | None) -> Reading:
    """Every judged epoch with its cost samples."""
    if source is None:
        return reading
    return replace(reading, views={e: with_cost(v, model, source) for e, v in reading.views.items()})
