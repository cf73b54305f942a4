"""Goodput: the requests served within their model's latency objectives, judged one request
at a time at the gateway.

The objectives are the SLOs of ``inferwatch.yaml`` (the gateway's ``config_file``; the
defaults without one), so the gateway judges by the thresholds the SLO rules count. A
request is good when it answered 2xx and met every objective its model is held to, together:
that joint condition is what a histogram per SLI loses (a request fast to its first token and
slow to finish counts as good in one and bad in the other, and no query can pair them again).

Each objective judges what the request has, as the SLO rules count it:

- ``ttft``: its time to first token, streamed requests only (a unary answer's first token
  reaches the client with the whole answer, and the TTFT SLO does not count it either);
- ``itl``: its time per output token after the first (the mean of its streamed gaps: vLLM's
  benchmarks judge goodput by TPOT), streamed requests of at least two tokens;
- ``e2e_latency``: its whole duration.

Several objectives on one measure (a TTFT of 1 s for 99 % and of 5 s for 99.9 %) are met by
a request within the smallest threshold. A model the settings do not name is held to the
SLOs that name no models, as the rules hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.config.settings import Settings


@dataclass(frozen=True, slots=True)
class Objectives:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met(self, status: int, ttft: float | None, tpot: float | None, e2e: float) -> bool:
        return (200 <= status < 300
                and (self.ttft_s is None or ttft is None or ttft <= self.ttft_s)
                and (self.tpot_s is None or tpot is None or tpot <= self.tpot_s)
                and (self.e2e_s is None or e2e <= self.e2e_s))


_MEASURE = {"ttft": "ttft_s", "itl": "tpot_s", "e2e_latency": "e2e_s"}


class Goodput:
    """Each model's objectives, from the settings' SLOs and the models they hold."""

    def __init__(self, settings: Settings) -> None:
        self._slos = [(slo, settings.models_of(slo.name)) for slo in settings.slos if slo.sli in _MEASURE]
        self._by_model: dict[str, Objectives] = {}

    def objectives(self, model: str) -> Objectives:
        found = self._by_model.get(model)
        if found is None:
            thresholds: dict[str, float] = {}
            for slo, models in self._slos:
                if (models is None or model in models) and slo.threshold_s is not None:
                    measure = _MEASURE[slo.sli]
                    thresholds[measure] = min(thresholds.get(measure, slo.threshold_s), slo.threshold_s)
            found = self._by_model[model] = Objectives(**thresholds)
        return found
