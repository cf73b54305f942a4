"""The vocabulary of the alert spec: tiers, SLOs, burn-rate windows and alerts, as data.

Severity decides who hears about an alert (see ``alerts/routing.py``): ``critical`` pages
the on-call SRE, ``warning`` opens a ticket, ``info`` reaches nobody, ``none`` is for the
meta-alerts (Watchdog, InfoInhibitor) that have receivers of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["critical", "warning", "info", "none"]

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def seconds(duration: str) -> int:
    """Prometheus duration ('5m', '1d') in seconds; only the single-unit form is used here."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"not a single-unit Prometheus duration: {duration!r}")
    return int(match[1]) * _UNIT_S[match[2]]


@dataclass(frozen=True)
class BurnWindow:
    """Alert when ``budget_share`` of the period's error budget is spent within ``long``,
    confirmed by ``short`` (so the alert resolves soon after the burn stops)."""

    long: str
    short: str
    budget_share: float
    for_: str

    def factor(self, period: str) -> float:
        """Burn-rate factor: 0.02 of a 30d budget in 1h is 14.4x (Google SRE workbook)."""
        return round(self.budget_share * seconds(period) / seconds(self.long), 6)


@dataclass(frozen=True)
class BurnTier:
    name: str  # fast / slow
    severity: Severity
    windows: tuple[BurnWindow, ...]


@dataclass(frozen=True)
class SLO:
    """One service-level objective per model, computed from gateway metrics.

    ``errors`` and ``total`` are PromQL selectors of counters (rates are taken per model);
    ``errors`` may instead be given as ``good`` for latency SLOs (a histogram bucket).
    """

    name: str
    title: str
    objective: float  # e.g. 0.999
    total: str
    errors: str | None = None
    good: str | None = None
    period: str = "30d"
    min_events: int = 20  # traffic floor in the long window: 1 failure of 2 requests pages nobody

    def __post_init__(self) -> None:
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO {self.name}: objective must be in (0, 1), got {self.objective}")
        if (self.errors is None) == (self.good is None):
            raise ValueError(f"SLO {self.name}: give exactly one of errors or good")

    @property
    def budget(self) -> float:
        return round(1 - self.objective, 12)

    def burn_threshold(self, window: BurnWindow) -> float:
        """The error ratio at which ``window`` alerts: its burn-rate factor times the budget.
        The alert rule and the dashboards' thresholds both read it, so they cannot disagree."""
        return round(window.factor(self.period) * self.budget, 12)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: Severity
    summary: str
    description: str
    for_: str = "0s"
    dashboard: str | None = None  # a dashboard uid from dashboards/uids.py
    labels: dict[str, str] = field(default_factory=dict)
    runbook: str | None = None  # defaults to the alert name

    @property
    def runbook_name(self) -> str:
        return self.runbook or self.name
