"""The vocabulary of the alert spec: tiers, SLOs, burn-rate windows and alerts, as data.

Severity decides who hears about an alert (see ``alerts/routing.py``): ``critical`` pages
the on-call SRE, ``warning`` opens a ticket, ``info`` reaches nobody, ``none`` is for the
meta-alerts (the Watchdog, and alerts that only inhibit others) that have receivers of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from inferwatch.common.durations import seconds

Severity = Literal["critical", "warning", "info", "none"]



@dataclass(frozen=True)
class BurnWindow:
    """Alert when ``budget_share`` of the period's error budget is spent within ``long``,
    confirmed by ``short``. No ``for``: the long window is what makes an alert start (a burn
    at the threshold takes the whole window), the short one what makes it stop soon after
    the burn does (SRE workbook, multiwindow multi-burn-rate alerts). A ``for`` would only
    delay the start and, on a window the incident keeps high, start a page after it ended."""

    long: str
    short: str
    budget_share: float

    def detection_s(self, period: str, error_ratio: float, budget: float) -> float:
        """Seconds from the onset of a steady ``error_ratio`` until the long window crosses
        the threshold (the workbook's detection time): ``factor * budget / ratio`` of it."""
        return self.factor(period) * budget / error_ratio * seconds(self.long)

    def factor(self, period: str) -> float:
        """Burn-rate factor: 0.02 of a 30d budget in 1h is 14.4x (Google SRE workbook)."""
        return round(self.budget_share * seconds(period) / seconds(self.long), 6)


@dataclass(frozen=True)
class BurnTier:
    """``keep_firing_for`` holds the alert over short lulls of one incident (an outage that
    comes back every few minutes): without it each return would be a new page."""

    name: str  # fast / slow
    severity: Severity
    windows: tuple[BurnWindow, ...]
    keep_firing_for: str = "0s"


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
    # Floors in the long window, both needed before a burn alerts. A ratio of a handful of
    # requests is not a rate: below 1/threshold requests (167 for the 6h page of a 99.9%
    # objective) one failure alone crosses any page threshold. ``min_bad_events`` is what
    # makes "one failure never pages" hold at every traffic level: a model at its objective
    # with 800 requests in 6h (0.8 failures expected) reaches 5 in 0.14% of windows; one that
    # is really failing reaches 5 within minutes of busy traffic, or within hours of quiet
    # traffic (half of 12 requests an hour: 50 minutes). ``min_events`` keeps a tiny sample
    # (5 of 5 requests failed in an hour, on a model that served 5) from deciding alone at the
    # short 1h window; the 6h window, which holds more requests, still pages for it.
    min_events: int = 20
    min_bad_events: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO {self.name}: objective must be in (0, 1), got {self.objective}")
        if (self.errors is None) == (self.good is None):
            raise ValueError(f"SLO {self.name}: give exactly one of errors or good")
        if not 1 <= self.min_bad_events <= self.min_events:
            raise ValueError(f"SLO {self.name}: need 1 <= min_bad_events <= min_events")

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
    keep_firing_for: str = "0s"
    dashboard: str | None = None  # a dashboard uid from dashboards/uids.py
    labels: dict[str, str] = field(default_factory=dict)
    runbook: str | None = None  # defaults to the alert name

    @property
    def runbook_name(self) -> str:
        return self.runbook or self.name


@dataclass(frozen=True)
class Record:
    """A recording rule the alerts read (beside the SLOs' own, which ``generate`` derives)."""

    name: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)  # static: several rules of one name differ by them

    def rule(self) -> dict[str, Any]:
        return {"record": self.name, "expr": self.expr, **({"labels": self.labels} if self.labels else {})}


@dataclass(frozen=True)
class Guard:
    """Where silence must not look like health: a job with no target at all (``metric`` is
    ``up``), or a target that answers its scrapes without ``metric``.

    ``expected_when`` (PromQL, no labels) limits a job guard to when other series say the
    job should exist: an optional part (the drift service, the GPU exporter) left out on
    purpose opens no ticket."""

    job: str
    metric: str
    selector: str
    expected_when: str | None = None
