"""The meta-monitoring alerts (alerts/meta.py) through promtool: each silent while healthy,
firing with its labels when its condition holds, resolving after; notification failures
per integration; disks that fill at a constant rate fire when predict_linear says they do.

The rules are rendered here from ``META_ALERTS`` as the generator renders every alert, one
group per severity as it groups them. Once alerts/generate.py writes META_ALERTS into the
committed rule files, this test reads those files instead.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from inferwatch.alerts import meta
from inferwatch.alerts.catalog import exposed, kind_of
from inferwatch.alerts.generate import RULES_DIR, render as render_rules
from inferwatch.alerts.meta import META_ALERTS, FillTier
from inferwatch.common.durations import seconds
from tests.alerts.promtool import Scenario, render, run_promtool, selector
from tests.support.promql import metric_names, range_functions

RUNBOOKS = Path(__file__).resolve().parents[2] / "alerts" / "runbooks"
# the committed rules of the meta alerts, a group per severity as in alerts.yml (the stand-down
# test runs the groups in both orders)
_COMMITTED = [r for g in yaml.safe_load((RULES_DIR / "alerts.yml").read_text())["groups"] for r in g["rules"]
              if r.get("alert") in {a.name for a in META_ALERTS}]
GROUPS = [{"name": f"inferwatch-meta-{severity}", "rules": [r for r in _COMMITTED if r["labels"]["severity"] == severity]}
          for severity in ("critical", "warning")]
RULES = {r["alert"]: r for g in GROUPS for r in g["rules"]}

PROM = {"job": "prometheus", "instance": "localhost:9090"}
AM1 = {"job": "alertmanager", "instance": "am1:9093"}
AM2 = {"job": "alertmanager", "instance": "am2:9093"}
NODE = {"job": "inferwatch-exporter", "instance": "node1:9400"}
PAGE_GROUP = "/etc/prometheus/rules/alerts.yml;inferwatch-page"


def minutes(duration: str) -> int:
    return seconds(duration) // 60


def at(minute: int) -> str:
    return f"{minute}m"


def crit(**labels: str) -> dict[str, str]:
    return {**labels, "severity": "critical"}


def warn(**labels: str) -> dict[str, str]:
    return {**labels, "severity": "warning"}


def expected(alert: str, labels: dict[str, str], value: str) -> dict:
    return {"exp_labels": labels,
            "exp_annotations": {k: render(v, labels, value) for k, v in RULES[alert]["annotations"].items()}}


def as_test(s: Scenario) -> dict:
    checks = [{"eval_time": t, "alertname": s.alert, "exp_alerts": []} for t in s.quiet_at]
    checks.append({"eval_time": s.fires_at, "alertname": s.alert,
                   "exp_alerts": [expected(s.alert, s.labels, s.value), *s.extra_firing]})
    if s.resolved_at:
        checks.append({"eval_time": s.resolved_at, "alertname": s.alert, "exp_alerts": []})
    return {"name": s.name, "interval": s.interval,
            "input_series": [{"series": k, "values": v} for k, v in s.series.items()], "alert_rule_test": checks}


def quiet(name: str, series: dict[str, str], checks: dict[str, tuple[str, ...]]) -> dict:
    """A timeline in which the alerts named in ``checks`` stay silent at the given times."""
    return {"name": name, "interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": [{"eval_time": t, "alertname": alert, "exp_alerts": []}
                                for alert, times in checks.items() for t in times]}


def promtool(tests: list[dict], tmp_path: Path, groups: list[dict] = GROUPS) -> None:
    rules = tmp_path / "meta.yml"
    rules.write_text(render_rules({"groups": groups}))
    result = run_promtool({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def failures_from(onset: int, until: int, per_minute: int, end: int) -> str:
    """A counter flat at 0, rising by ``per_minute`` from ``onset`` to ``until``, then flat to ``end``."""
    return f"0x{onset - 1} {per_minute}+{per_minute}x{until - onset} {per_minute * (until - onset + 1)}x{end - until}"


# -- Prometheus' rules and its way to Alertmanager -----------------------------------------------

RULE_ONSET, RULE_STOP = 11, 40  # evaluations fail from minute 11 to minute 40
RULES_FOR = minutes(meta.RULE_FOR)
RULES_CLEAR = RULE_STOP + minutes(meta.RULE_WINDOW)  # the last failure leaves the increase window


def rule_group_counter(name: str) -> dict[str, str]:
    return {selector(name, {**PROM, "rule_group": PAGE_GROUP}): failures_from(RULE_ONSET, RULE_STOP, 6, 60),
            selector(name, {**PROM, "rule_group": "/etc/prometheus/rules/slos.yml;inferwatch-slo-ttft"}): "0x60"}


SENT = "prometheus_notifications_sent_total"
SEND_ERRORS = "prometheus_notifications_errors_total"
AM1_URL, AM2_URL = "http://am1:9093/api/v2/alerts", "http://am2:9093/api/v2/alerts"
SEND_FOR = minutes(meta.SEND_FOR)


def sending(url: str, errors_per_minute: str) -> dict[str, str]:
    labels = {**PROM, "alertmanager": url}
    return {selector(SENT, labels): "0+60x40", selector(SEND_ERRORS, labels): errors_per_minute}


QUEUE_CAPACITY, QUEUE_GROWTH = 10_000, 90  # alerts, alerts per minute: the trend crosses between two evaluations


def queue_fills_at() -> int:
    """First evaluation at which the 5m trend of a queue growing QUEUE_GROWTH a minute from
    0 passes QUEUE_CAPACITY within QUEUE_FULL_WITHIN (exact: the samples lie on a line)."""
    within_min = Fraction(seconds(meta.QUEUE_FULL_WITHIN), 60)
    return next(t for t in range(1, 1000) if QUEUE_GROWTH * (t + within_min) > QUEUE_CAPACITY)


PROMETHEUS_SCENARIOS = [
    Scenario("a rule group fails every evaluation for half an hour", "PrometheusRuleFailures",
             rule_group_counter("prometheus_rule_evaluation_failures_total"),
             quiet_at=(at(RULE_ONSET - 1), at(RULE_ONSET + RULES_FOR - 1)), fires_at=at(RULE_ONSET + RULES_FOR),
             labels=crit(**PROM, rule_group=PAGE_GROUP), value="30", resolved_at=at(RULES_CLEAR)),
    Scenario("a rule group misses evaluations for half an hour", "PrometheusMissingRuleEvaluations",
             rule_group_counter("prometheus_rule_group_iterations_missed_total"),
             quiet_at=(at(RULE_ONSET + RULES_FOR - 1),), fires_at=at(RULE_ONSET + RULES_FOR),
             labels=warn(**PROM, rule_group=PAGE_GROUP), value="30", resolved_at=at(RULES_CLEAR)),
    # max_over_time over 5m: the gauge's zeros count once a whole window holds nothing else
    # (one minute later from Prometheus 3 on, whose ranges leave out their start)
    Scenario("Prometheus loses its only Alertmanager for half an hour", "PrometheusNotConnectedToAlertmanagers",
             {selector("prometheus_notifications_alertmanagers_discovered", PROM): "1x10 0x30 1x10"},
             quiet_at=("14m", at(15 + minutes(meta.DISCOVERY_FOR) - 1)),
             fires_at=at(16 + minutes(meta.DISCOVERY_FOR)), labels=warn(**PROM), value="0", resolved_at="42m"),
    Scenario("5% of the alerts sent to one of two Alertmanagers fail",
             "PrometheusErrorSendingAlertsToSomeAlertmanagers",
             {**sending(AM1_URL, "0+3x30 90x10"), **sending(AM2_URL, "0x40")},
             quiet_at=(at(SEND_FOR),), fires_at=at(1 + SEND_FOR), labels=warn(**PROM, alertmanager=AM1_URL),
             value="5%", resolved_at="35m"),
    Scenario("half the alerts sent to the only Alertmanager fail", "PrometheusErrorSendingAlertsToAnyAlertmanager",
             sending(AM1_URL, "0+30x30 900x10"),
             quiet_at=(at(SEND_FOR),), fires_at=at(1 + SEND_FOR), labels=crit(**PROM), value="50%",
             resolved_at="35m"),
    Scenario("the queue of alerts to Alertmanager grows towards its capacity", "PrometheusNotificationQueueRunningFull",
             {selector("prometheus_notifications_queue_length", PROM): f"0+{QUEUE_GROWTH}x100 0x30",
              selector("prometheus_notifications_queue_capacity", PROM): f"{QUEUE_CAPACITY}x130"},
             quiet_at=(at(queue_fills_at() + minutes(meta.QUEUE_FOR) - 1),),
             fires_at=at(queue_fills_at() + minutes(meta.QUEUE_FOR)), labels=warn(**PROM),
             value="", resolved_at="102m"),  # its templates show no value
]

PROMETHEUS_QUIET = [
    quiet("a failure on one Alertmanager of two is not a failure to send to any",
          {**sending(AM1_URL, "0+3x30 90x10"), **sending(AM2_URL, "0x40")},
          {"PrometheusErrorSendingAlertsToAnyAlertmanager": ("16m", "25m")}),
    quiet("while the page for every Alertmanager fires, the ticket for each one stands down",
          sending(AM1_URL, "0+30x30 900x10"),
          {"PrometheusErrorSendingAlertsToSomeAlertmanagers": (at(1 + SEND_FOR), "25m")}),
    quiet("healthy rules, discovery and queue",
          {**{k: "0x60" for k in rule_group_counter("prometheus_rule_evaluation_failures_total")},
           **{k: "0x60" for k in rule_group_counter("prometheus_rule_group_iterations_missed_total")},
           selector("prometheus_notifications_alertmanagers_discovered", PROM): "1x60",
           selector("prometheus_notifications_queue_length", PROM): "0 3 0 1 0x56",
           selector("prometheus_notifications_queue_capacity", PROM): "10000x60",
           **sending(AM1_URL, "0x60")},
          {name: ("30m", "59m") for name in ("PrometheusRuleFailures", "PrometheusMissingRuleEvaluations",
                                             "PrometheusNotConnectedToAlertmanagers",
                                             "PrometheusErrorSendingAlertsToAnyAlertmanager",
                                             "PrometheusErrorSendingAlertsToSomeAlertmanagers",
                                             "PrometheusNotificationQueueRunningFull")}),
]

# -- Alertmanager's integrations ------------------------------------------------------------------

NOTIFIED, FAILED = "alertmanager_notifications_total", "alertmanager_notifications_failed_total"
PD_RECOVERS = 20
NOTIFY_FOR = minutes(meta.NOTIFY_FOR)
NOTIFY_CLEAR = PD_RECOVERS + minutes(meta.NOTIFY_WINDOW)  # the last failure leaves the rate window


def integration(am: dict[str, str], name: str, per_minute: int, failing: str,
                reasons: tuple[str, ...] = ("clientError", "serverError")) -> dict[str, str]:
    """An integration's counters as Alertmanager exports them: failures by ``reason`` (0.26
    and later; ``reasons=()`` for 0.25, which has no such label), all created at start."""
    labels = {**am, "integration": name}
    if not reasons:
        return {selector(NOTIFIED, labels): f"0+{per_minute}x40", selector(FAILED, labels): failing}
    failed = {selector(FAILED, {**labels, "reason": r}): failing if i == 0 else "0x40" for i, r in enumerate(reasons)}
    return {selector(NOTIFIED, labels): f"0+{per_minute}x40", **failed}


PD_FAILS = f"0+2x{PD_RECOVERS} {2 * PD_RECOVERS}x{40 - PD_RECOVERS}"  # every page fails until PD_RECOVERS


def pagerduty_down(am: dict[str, str], reasons: tuple[str, ...] = ("clientError", "serverError")) -> dict[str, str]:
    """PagerDuty rejects every notification until PD_RECOVERS; the webhook delivers all of its
    own; email is configured nowhere (no notifications: no ratio)."""
    return {**integration(am, "pagerduty", 2, PD_FAILS, reasons), **integration(am, "webhook", 10, "0x40", reasons),
            **integration(am, "email", 0, "0x40", reasons)}


ALERTMANAGER_SCENARIOS = [
    Scenario("PagerDuty fails while the webhook works: a page for pagerduty only",
             "AlertmanagerClusterFailedToSendAlerts", pagerduty_down(AM1),
             quiet_at=(at(NOTIFY_FOR),), fires_at=at(1 + NOTIFY_FOR), labels=crit(integration="pagerduty"),
             value="100%", resolved_at=at(NOTIFY_CLEAR)),
    Scenario("the same on Alertmanager 0.25, whose failures carry no reason",
             "AlertmanagerClusterFailedToSendAlerts", pagerduty_down(AM1, reasons=()),
             fires_at=at(1 + NOTIFY_FOR), labels=crit(integration="pagerduty"), value="100%",
             resolved_at=at(NOTIFY_CLEAR)),
    Scenario("one Alertmanager of two cannot reach PagerDuty while its peer delivers: a ticket",
             "AlertmanagerFailedToSendAlerts",
             {**pagerduty_down(AM1), **integration(AM2, "pagerduty", 2, "0x40"),
              **integration(AM2, "webhook", 10, "0x40")},
             quiet_at=(at(NOTIFY_FOR),), fires_at=at(1 + NOTIFY_FOR), labels=warn(**AM1, integration="pagerduty"),
             value="100%", resolved_at=at(NOTIFY_CLEAR)),
]

ALERTMANAGER_QUIET = [
    quiet("while the page fires, the ticket for the one Alertmanager stands down", pagerduty_down(AM1),
          {"AlertmanagerFailedToSendAlerts": (at(1 + NOTIFY_FOR), "15m")}),
    quiet("one Alertmanager of two failing is no page",
          {**pagerduty_down(AM1), **integration(AM2, "pagerduty", 2, "0x40")},
          {"AlertmanagerClusterFailedToSendAlerts": ("10m", "15m")}),
]

# -- the host's disks and memory ------------------------------------------------------------------

TB = 10 ** 12
GB = 10 ** 9
TSDB = {**NODE, "path": "/var/lib/prometheus"}


@dataclass(frozen=True)
class Disk:
    """A filesystem of ``size`` bytes with ``avail0`` free at minute 0, losing ``per_minute``."""

    size: int
    avail0: int
    per_minute: int

    def avail(self, minute: int) -> int:
        return self.avail0 - self.per_minute * minute

    def meets(self, tier: FillTier, minute: int) -> bool:
        """``tier``'s condition at ``minute``: the free share under its floor, and the line
        through the samples (predict_linear's least squares fit is that line) at zero within
        ``tier.within``."""
        predicted = self.avail(minute) - Fraction(self.per_minute, 60) * seconds(tier.within)
        return Fraction(self.avail(minute), self.size) < Fraction(str(tier.free_below)) and predicted < 0

    def fires_at(self, tier: FillTier) -> int:
        """First evaluation (minute) at which the alert of ``tier`` fires: its condition holds
        from the second sample on (predict_linear needs two), then ``for`` passes."""
        onset = next(t for t in range(1, 100_000) if self.meets(tier, t))
        return onset + minutes(meta.FILL_FOR)

    def under(self, share: float) -> int:
        """First minute at which less than ``share`` of the disk is free."""
        return next(t for t in range(100_000) if Fraction(self.avail(t), self.size) < Fraction(str(share)))

    def free(self, minute: int) -> str:
        """How humanizePercentage writes the free share (Go's %.4g)."""
        return f"{self.avail(minute) / self.size * 100:.4g}%"

    def series(self, length: int) -> str:
        return f"{self.avail0}-{self.per_minute}x{length}"


FILLING = Disk(TB, 500 * GB, 700_000_000)  # half free, 42 GB an hour: predict_linear, not the floor, decides the page
FILLING_CLEANED_AT = FILLING.fires_at(meta.FILL_PAGE) + 10
FILLING_FULL = FILLING.avail0 // FILLING.per_minute  # its last minute with space left, if not cleaned
# 90 % free and full in 14h: within 24h from the start, but a ticket only once under 40 % free
ROOMY = Disk(TB, 900 * GB, 1_100_000_000)


def disk(avail: str, size: int = TB, labels: dict[str, str] = TSDB) -> dict[str, str]:
    return {selector("inferwatch_host_filesystem_avail_bytes", labels): avail,
            selector("inferwatch_host_filesystem_size_bytes", labels): f"{size}x1000"}


FILLING_SERIES = disk(f"{FILLING.series(FILLING_CLEANED_AT)} {800 * GB}x60")
DISK_ALERTS = ("HostFilesystemFillingUpFast", "HostFilesystemFillingUp", "HostFilesystemAlmostFull")


def test_the_filling_disk_is_filled_by_its_rate_not_its_floor():
    """The page's time must follow from predict_linear: when it starts, the disk is already
    under the page's floor, so the floor did not decide it."""
    onset = FILLING.fires_at(meta.FILL_PAGE) - minutes(meta.FILL_FOR)
    assert FILLING.avail(onset - 1) / FILLING.size < meta.FILL_PAGE.free_below
    assert not FILLING.meets(meta.FILL_PAGE, onset - 1)
    assert FILLING.avail(FILLING_CLEANED_AT) > 0  # the series never goes below zero


HOST_SCENARIOS = [
    Scenario("a disk filling at a constant rate pages when predict_linear reaches 0 within 4h, for 1h",
             "HostFilesystemFillingUpFast", FILLING_SERIES,
             quiet_at=(at(FILLING.fires_at(meta.FILL_PAGE) - 1),), fires_at=at(FILLING.fires_at(meta.FILL_PAGE)),
             labels=crit(**TSDB), value=FILLING.free(FILLING.fires_at(meta.FILL_PAGE)),
             resolved_at=at(FILLING_CLEANED_AT + 1)),
    Scenario("the same disk opened a ticket first, when within 24h and under 40 % free", "HostFilesystemFillingUp",
             FILLING_SERIES,
             quiet_at=(at(FILLING.fires_at(meta.FILL_TICKET) - 1), at(FILLING.fires_at(meta.FILL_PAGE))),
             fires_at=at(FILLING.fires_at(meta.FILL_TICKET)), labels=warn(**TSDB),
             value=FILLING.free(FILLING.fires_at(meta.FILL_TICKET))),
    Scenario("a roomy disk that fills within 24h opens a ticket only once under 40 % free", "HostFilesystemFillingUp",
             disk(ROOMY.series(600)),
             quiet_at=("2h", at(ROOMY.fires_at(meta.FILL_TICKET) - 1)), fires_at=at(ROOMY.fires_at(meta.FILL_TICKET)),
             labels=warn(**TSDB), value=ROOMY.free(ROOMY.fires_at(meta.FILL_TICKET))),
    Scenario("a disk at 3 % free that does not grow is a ticket after 30m, until cleaned", "HostFilesystemAlmostFull",
             disk(f"{30 * GB}x44 {500 * GB}x20"),
             quiet_at=(at(minutes(meta.ALMOST_FULL_FOR) - 1),), fires_at=meta.ALMOST_FULL_FOR, labels=warn(**TSDB),
             value="3%", resolved_at="45m"),
    Scenario("a watched path the exporter cannot read", "HostFilesystemUnreadable",
             {selector("inferwatch_host_filesystem_up", {**NODE, "path": "/data/drift"}): "1x5 0x20 1x10",
              selector("inferwatch_host_filesystem_up", TSDB): "1x35"},
             quiet_at=(at(5 + minutes(meta.UNREADABLE_FOR)),), fires_at=at(6 + minutes(meta.UNREADABLE_FOR)),
             labels=warn(**NODE, path="/data/drift"), value="0", resolved_at="27m"),
    Scenario("under 10 % of memory available for 15m", "HostMemoryPressure",
             {selector("inferwatch_host_memory_available_bytes", NODE): f"{12 * GB}x10 {int(1.2 * GB)}x30 {12 * GB}x10",
              selector("inferwatch_host_memory_total_bytes", NODE): f"{24 * GB}x50"},
             quiet_at=(at(10 + minutes(meta.MEMORY_FOR)),), fires_at=at(11 + minutes(meta.MEMORY_FOR)),
             labels=warn(**NODE), value="5%", resolved_at="42m"),
]

DISK_STAND_DOWNS = [
    quiet("the filling disk's ticket stands down once its page fires", FILLING_SERIES,
          {"HostFilesystemFillingUp": (at(FILLING.fires_at(meta.FILL_PAGE)),
                                       at(FILLING.fires_at(meta.FILL_PAGE) + 5))}),
    quiet("a disk almost full and filling fast: the page, not the almost-full ticket",
          disk(FILLING.series(FILLING_FULL)),
          {"HostFilesystemAlmostFull": (at(FILLING.under(meta.ALMOST_FULL) + minutes(meta.ALMOST_FULL_FOR)),
                                        at(FILLING_FULL))}),
]
HOST_QUIET = DISK_STAND_DOWNS + [
    quiet("a disk at a steady 50 % never fires", disk(f"{500 * GB}x720"), {a: ("6h", "12h") for a in DISK_ALERTS}),
    quiet("a quarter of memory used is no pressure",
          {selector("inferwatch_host_memory_available_bytes", NODE): f"{18 * GB}x60",
           selector("inferwatch_host_memory_total_bytes", NODE): f"{24 * GB}x60"},
          {"HostMemoryPressure": ("30m", "59m")}),
]

ALL_SCENARIOS = PROMETHEUS_SCENARIOS + ALERTMANAGER_SCENARIOS + HOST_SCENARIOS


def test_promtool_accepts_the_meta_rules(tmp_path):
    path = tmp_path / "meta.yml"
    path.write_text(render_rules({"groups": GROUPS}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("scenarios, quiets", [
    (PROMETHEUS_SCENARIOS, PROMETHEUS_QUIET), (ALERTMANAGER_SCENARIOS, ALERTMANAGER_QUIET), (HOST_SCENARIOS, HOST_QUIET),
], ids=["prometheus", "alertmanager", "host"])
def test_each_alert_fires_with_its_labels_and_resolves(tmp_path, scenarios, quiets):
    promtool([as_test(s) for s in scenarios] + quiets, tmp_path)


def test_a_lesser_alert_stands_down_whichever_group_runs_first(tmp_path):
    """Prometheus runs rule groups independently: with the tickets' group first, a ticket must
    still not fire at the evaluation at which its page starts to."""
    stand_downs = [PROMETHEUS_QUIET[1], ALERTMANAGER_QUIET[0], *DISK_STAND_DOWNS]
    promtool(stand_downs + [as_test(s) for s in ALL_SCENARIOS], tmp_path, groups=GROUPS[::-1])


def test_every_meta_alert_has_a_scenario_that_fires_it():
    assert {a.name for a in META_ALERTS} == {s.alert for s in ALL_SCENARIOS}
    assert len(RULES) == len(META_ALERTS)


def test_meta_alerts_read_only_exported_series_and_take_rates_of_counters_only():
    for alert in META_ALERTS:
        assert metric_names(alert.expr) <= set(exposed()), alert.name
        for function, name in range_functions(alert.expr):
            assert kind_of(name) == "counter", f"{alert.name}: {function}() over the gauge {name}"


def test_every_meta_alert_has_a_runbook():
    for alert in META_ALERTS:
        runbook = RUNBOOKS / f"{alert.runbook_name}.md"
        assert runbook.is_file(), f"no runbook for {alert.name}"
        text = runbook.read_text()
        assert text.startswith(f"# {alert.name}\n"), runbook.name
        for section in ("## Meaning", "## Impact", "## Confirm", "## Mitigate"):
            assert section in text, f"{runbook.name} lacks {section}"
        severity = {"critical": "page", "warning": "ticket"}[alert.severity]
        assert f"Severity: **{severity}** (`severity=\"{alert.severity}\"`)" in text, runbook.name


def test_the_rules_carry_no_job_selector():
    """Job names differ between scrape-config styles (file discovery, the Prometheus
    Operator): the meta alerts select by metric name only."""
    assert not [a.name for a in META_ALERTS if "job=" in a.expr]
