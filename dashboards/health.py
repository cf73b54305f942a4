"""The health row each dashboard opens with: what an on-call SRE reads first (targets up,
the alerts of this dashboard's scope firing), before the rows that explain them."""

from __future__ import annotations

from collections.abc import Iterable

from inferwatch.alerts.model import Alert
from inferwatch.dashboards.panels import q, stat_panel

RED_BELOW_ONE = [(None, "red"), (1, "green")]
RED_FROM_ONE = [(None, "green"), (1, "red")]


def alerts_firing(uid: str, alerts: Iterable[Alert], width: int = 6) -> object:
    """Alerts that link to dashboard ``uid`` and fire now, by severity; 0, not "No data", when none."""
    names = "|".join(sorted({a.name for a in alerts if a.dashboard == uid}))

    def firing(severity: str) -> str:
        return f'count(ALERTS{{alertstate="firing", alertname=~"{names}", severity="{severity}"}}) or vector(0)'

    return stat_panel("Alerts firing here", "short", q(firing("critical"), "pages"), q(firing("warning"), "tickets"),
                      thresholds=RED_FROM_ONE, width=width,
                      description="Alerts whose dashboard_url is this dashboard, firing now: "
                                  + names.replace("|", ", "))


def targets_up(jobs: tuple[str, ...], width: int = 6) -> object:
    """The share of each job's targets that answered the last scrape."""
    return stat_panel("Targets up", "percentunit",
                      q(f'avg by (job) (up{{job=~"{"|".join(jobs)}"}})', "{{job}}"),
                      thresholds=RED_BELOW_ONE, width=width,
                      description="Share of each job's targets that answered Prometheus's last scrape.")
