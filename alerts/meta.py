"""Meta-monitoring: alerts on the alerting pipeline itself and on the host it runs on.

The dead man's switch (Watchdog) catches a pipeline that is down as a whole. These alerts
catch the quieter failures it cannot see: rules that fail to evaluate (a ``group_left``
that turned many-to-many stops VLLMDown without a sound), evaluations skipped, Prometheus
cut off from Alertmanager, one notification integration failing while the others work, and
the disks and memory the stack lives on running out.

Expressions, windows and thresholds are the kube-prometheus mixins', cited per alert:
prometheus-mixin (prometheus/prometheus, documentation/prometheus-mixin/alerts.libsonnet),
alertmanager-mixin (prometheus/alertmanager, doc/alertmanager-mixin/alerts.libsonnet) and
node-mixin (prometheus/node_exporter, docs/node-mixin/alerts/alerts.libsonnet and
config.libsonnet), as of August 2026. Ratios are kept as ratios (the mixins' ``* 100 > 1``
is ``> 0.01`` here), as everywhere in inferwatch.

No expression selects a scrape job: only Prometheus exports ``prometheus_*``, only
Alertmanager ``alertmanager_*`` and only inferwatch's exporter ``inferwatch_host_*``, so the
alerts hold under every scrape-config style (``inferwatch up``, compose's file discovery,
the Prometheus Operator's ``serviceMonitor/<namespace>/<name>/<n>`` jobs). They keep the
target's labels (job, instance; namespace and pod under Kubernetes), which name the component.

Where two alerts describe one failure at two severities, the lesser stands down once the
greater fires: one incident, one notification, without an inhibit rule (which would have to
match on the path or integration not to silence other disks' or integrations' alerts). The
lesser keeps firing while the greater is pending, so an escalation leaves no gap. "Fires"
is read from the greater's ``ALERTS_FOR_STATE`` (when it became active) and its ``for``,
not from ``ALERTS{alertstate="firing"}``: that is written only once the greater's group has
run, so a lesser alert in a group that runs first would fire for one evaluation.

This module imports no other alert spec, so ``alerts/spec.py`` can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.model import Alert
from inferwatch.common.durations import seconds

# prometheus-mixin PrometheusRuleFailures (critical) and PrometheusMissingRuleEvaluations
# (warning): any failed or skipped evaluation of a group within 5m, for 15m.
RULE_WINDOW = "5m"
RULE_FOR = "15m"
# prometheus-mixin PrometheusNotConnectedToAlertmanagers: no Alertmanager discovered at any
# scrape of the last 5m (max_over_time rides out a failed self-scrape), for 10m.
DISCOVERY_WINDOW = "5m"
DISCOVERY_FOR = "10m"
# prometheus-mixin PrometheusErrorSendingAlertsToSomeAlertmanagers (warning, over 1 % of the
# alerts sent to one Alertmanager fail) and ...ToAnyAlertmanager (critical, over 3 % to every
# one): 5m rates, for 15m.
SEND_WINDOW = "5m"
SEND_ERRORS_SOME = 0.01
SEND_ERRORS_ANY = 0.03
SEND_FOR = "15m"
# prometheus-mixin PrometheusNotificationQueueRunningFull: the queue's 5m trend passes its
# capacity within 30m, for 15m.
QUEUE_TREND = "5m"
QUEUE_FULL_WITHIN = "30m"
QUEUE_FOR = "15m"
# alertmanager-mixin AlertmanagerFailedToSendAlerts (warning, one Alertmanager) and
# AlertmanagerClusterFailedToSendAlerts (critical, every Alertmanager; the mixin's default
# alertmanagerCriticalIntegrationsRegEx '.*' makes every integration critical): over 1 % of
# an integration's notifications failed over 15m, for 5m.
NOTIFY_WINDOW = "15m"
NOTIFY_FAILED = 0.01
NOTIFY_FOR = "5m"


@dataclass(frozen=True)
class FillTier:
    """A filesystem whose trend reaches zero free bytes ``within`` this long, and that already
    has less than ``free_below`` of its size free: the floor keeps a roomy disk that merely
    grows (a 90 %-free disk that would fill in 20h) from opening anything yet."""

    within: str
    free_below: float


# node-mixin NodeFilesystemSpaceFillingUp: the linear trend of the last 6h
# (fsSpaceFillingUpPredictionWindow) reaches 0 within 24h (nodeWarningWindowHours) with
# under 40 % free (fsSpaceFillingUpWarningThreshold): warning; within 4h
# (nodeCriticalWindowHours) with under 20 % free (fsSpaceFillingUpCriticalThreshold):
# critical; both for 1h.
FILL_TREND = "6h"
FILL_TICKET = FillTier("24h", 0.40)
FILL_PAGE = FillTier("4h", 0.20)
FILL_FOR = "1h"
# node-mixin NodeFilesystemAlmostOutOfSpace (warning): under 5 % free
# (fsSpaceAvailableWarningThreshold) for 30m, whatever the trend.
ALMOST_FULL = 0.05
ALMOST_FULL_FOR = "30m"
# A watched path the exporter cannot statvfs: its disk alerts are blind. Ours, no mixin has it.
UNREADABLE_FOR = "10m"
# node-mixin NodeMemoryHighUtilization: over 90 % of memory used
# (memoryHighUtilizationThreshold), i.e. under 10 % available, for 15m.
MEMORY_AVAILABLE_BELOW = 0.10
MEMORY_FOR = "15m"

_FOR_STATE = m("ALERTS_FOR_STATE")  # value: when the alert became active (Unix seconds)
_RULE_FAILURES = m("prometheus_rule_evaluation_failures_total")
_RULES_MISSED = m("prometheus_rule_group_iterations_missed_total")
_AM_DISCOVERED = m("prometheus_notifications_alertmanagers_discovered")
_SEND_ERRORS = m("prometheus_notifications_errors_total")
_SENT = m("prometheus_notifications_sent_total")
_QUEUE_LENGTH = m("prometheus_notifications_queue_length")
_QUEUE_CAPACITY = m("prometheus_notifications_queue_capacity")
_NOTIFY_FAILED = m("alertmanager_notifications_failed_total")
_NOTIFICATIONS = m("alertmanager_notifications_total")
_FS_AVAIL = m("inferwatch_host_filesystem_avail_bytes")
_FS_SIZE = m("inferwatch_host_filesystem_size_bytes")
_FS_UP = m("inferwatch_host_filesystem_up")
_MEM_AVAILABLE = m("inferwatch_host_memory_available_bytes")
_MEM_TOTAL = m("inferwatch_host_memory_total_bytes")

PROMETHEUS = "Prometheus {{ $labels.instance }}"
AM = "Alertmanager {{ $labels.instance }}"
PATH = "{{ $labels.path }} on {{ $labels.instance }}"


def _unless_firing(on: str, *alerts: Alert) -> str:
    """Stand down while one of ``alerts`` fires for the same ``on`` labels: active for its
    ``for`` by now, whichever rule group Prometheus evaluates first."""
    return "".join(f'\nunless on ({on}) time() - {_FOR_STATE}{{alertname="{a.name}"}} >= {seconds(a.for_)}'
                   for a in alerts)


# Alerts sent to one Alertmanager that failed; per Alertmanager (label ``alertmanager``).
_SEND_ERROR_RATIO = f"rate({_SEND_ERRORS}[{SEND_WINDOW}]) / rate({_SENT}[{SEND_WINDOW}])"
# Notifications to one integration that failed, per Alertmanager. Alertmanager 0.26+ splits
# failures by ``reason``: summed, so an integration is one alert whatever the mix of
# reasons. An Alertmanager that sent nothing in the window (a cluster peer sent first) has
# no ratio, rather than 0/0.
_NOTIFY_FAILED_RATIO = (f"sum without (reason) (rate({_NOTIFY_FAILED}[{NOTIFY_WINDOW}]))\n"
                        f"/ (rate({_NOTIFICATIONS}[{NOTIFY_WINDOW}]) > 0)")


def _filling(tier: FillTier) -> str:
    """The free share (the alert's value) of a filesystem that ``tier`` says is filling up."""
    return (f"{_FS_AVAIL} / {_FS_SIZE} < {tier.free_below:g}\n"
            f"and predict_linear({_FS_AVAIL}[{FILL_TREND}], {seconds(tier.within)}) < 0")


def _filling_description(tier: FillTier) -> str:
    return (f"The filesystem holding {PATH} has {{{{ $value | humanizePercentage }}}} of its space free and, at "
            f"its rate of the last {FILL_TREND}, fills up within {tier.within}. Whatever writes there (Prometheus' "
            "TSDB, the drift database, a model cache) fails once it is full.")


# The greater of two alerts on one failure; each lesser one stands down once it fires.
SENDING_TO_NO_ALERTMANAGER = Alert(
    "PrometheusErrorSendingAlertsToAnyAlertmanager",
    f"min without (alertmanager) ({_SEND_ERROR_RATIO}) > {SEND_ERRORS_ANY:g}", "critical", for_=SEND_FOR,
    summary=f"{PROMETHEUS} fails to send alerts to every Alertmanager",
    description=f"At least {{{{ $value | humanizePercentage }}}} of the alerts {PROMETHEUS} sent to each of its "
                f"Alertmanagers failed over the last {SEND_WINDOW}, for {SEND_FOR}: notifications are lost or late.")
NOTIFYING_NO_ALERTMANAGER = Alert(
    "AlertmanagerClusterFailedToSendAlerts",
    f"min by (integration) (\n{_NOTIFY_FAILED_RATIO}\n) > {NOTIFY_FAILED:g}", "critical", for_=NOTIFY_FOR,
    summary="Alertmanager cannot notify {{ $labels.integration }}",
    description="{{ $value | humanizePercentage }} or more of the notifications to {{ $labels.integration }} failed "
                f"over the last {NOTIFY_WINDOW} on every Alertmanager that sent any: alerts routed to receivers of "
                "that integration do not arrive there.")
FILLING_UP_FAST = Alert(
    "HostFilesystemFillingUpFast", _filling(FILL_PAGE), "critical", for_=FILL_FOR,
    summary=f"{PATH} fills up within {FILL_PAGE.within}", description=_filling_description(FILL_PAGE))
FILLING_UP = Alert(
    "HostFilesystemFillingUp", f"(\n{_filling(FILL_TICKET)}\n)" + _unless_firing("instance, path", FILLING_UP_FAST),
    "warning", for_=FILL_FOR,
    summary=f"{PATH} fills up within {FILL_TICKET.within}", description=_filling_description(FILL_TICKET))


META_ALERTS: tuple[Alert, ...] = (
    # -- the rules themselves ---------------------------------------------------------------------
    # A group whose evaluation fails writes nothing: an alert in it cannot fire, a recording
    # rule leaves a gap that SLO pages read as no data. So a failure pages, as in the mixin.
    Alert("PrometheusRuleFailures", f"increase({_RULE_FAILURES}[{RULE_WINDOW}]) > 0", "critical", for_=RULE_FOR,
          summary=f"{PROMETHEUS} fails to evaluate rules of {{{{ $labels.rule_group }}}}",
          description=f"{PROMETHEUS} failed {{{{ $value | humanize }}}} rule evaluations of group "
                      f"{{{{ $labels.rule_group }}}} in the last {RULE_WINDOW}, continuously for {RULE_FOR}: the "
                      "alerts of that group cannot fire and its recorded series have gaps."),
    Alert("PrometheusMissingRuleEvaluations", f"increase({_RULES_MISSED}[{RULE_WINDOW}]) > 0", "warning",
          for_=RULE_FOR,
          summary=f"{PROMETHEUS} skips evaluations of {{{{ $labels.rule_group }}}}",
          description=f"{PROMETHEUS} skipped {{{{ $value | humanize }}}} evaluations of group "
                      f"{{{{ $labels.rule_group }}}} in the last {RULE_WINDOW}, continuously for {RULE_FOR}: one "
                      "evaluation takes longer than the group's interval, so its alerts fire late."),
    # -- Prometheus -> Alertmanager -----------------------------------------------------------------
    # Neither can reach anyone through the Alertmanager it is about; they show on Prometheus'
    # alerts page, reach a second Prometheus or Alertmanager where there is one, and the
    # dead man's switch notices the silence.
    Alert("PrometheusNotConnectedToAlertmanagers",
          f"max_over_time({_AM_DISCOVERED}[{DISCOVERY_WINDOW}]) < 1", "warning", for_=DISCOVERY_FOR,
          summary=f"{PROMETHEUS} has no Alertmanager to send alerts to",
          description=f"{PROMETHEUS} has discovered no Alertmanager for {DISCOVERY_FOR}: every alert it "
                      "evaluates stays on its own alerts page, and nobody is notified."),
    SENDING_TO_NO_ALERTMANAGER,
    Alert("PrometheusErrorSendingAlertsToSomeAlertmanagers",
          f"{_SEND_ERROR_RATIO} > {SEND_ERRORS_SOME:g}"
          + _unless_firing("job, instance", SENDING_TO_NO_ALERTMANAGER),
          "warning", for_=SEND_FOR,
          summary=f"{PROMETHEUS} fails to send alerts to {{{{ $labels.alertmanager }}}}",
          description=f"{{{{ $value | humanizePercentage }}}} of the alerts {PROMETHEUS} sent to "
                      f"{{{{ $labels.alertmanager }}}} failed over the last {SEND_WINDOW}, for {SEND_FOR}."),
    Alert("PrometheusNotificationQueueRunningFull",
          f"predict_linear({_QUEUE_LENGTH}[{QUEUE_TREND}], {seconds(QUEUE_FULL_WITHIN)})\n"
          f"> min_over_time({_QUEUE_CAPACITY}[{QUEUE_TREND}])", "warning", for_=QUEUE_FOR,
          summary=f"{PROMETHEUS}'s queue of alerts to Alertmanager is filling up",
          description=f"{PROMETHEUS}'s notification queue, at its rate of the last {QUEUE_TREND}, passes its "
                      f"capacity within {QUEUE_FULL_WITHIN}: past it, alerts are dropped before they reach "
                      "Alertmanager."),
    # -- Alertmanager -> receivers --------------------------------------------------------------------
    # Per integration: PagerDuty failing while the webhook works fires for pagerduty only,
    # and the page itself still reaches the pager receiver's webhook.
    NOTIFYING_NO_ALERTMANAGER,
    Alert("AlertmanagerFailedToSendAlerts",
          f"{_NOTIFY_FAILED_RATIO} > {NOTIFY_FAILED:g}"
          + _unless_firing("integration", NOTIFYING_NO_ALERTMANAGER),
          "warning", for_=NOTIFY_FOR,
          summary=f"{AM} fails to notify {{{{ $labels.integration }}}}",
          description=f"{{{{ $value | humanizePercentage }}}} of the notifications {AM} sent to "
                      f"{{{{ $labels.integration }}}} failed over the last {NOTIFY_WINDOW}, while another "
                      "Alertmanager of the cluster still delivers to it."),
    # -- the host's disks and memory ------------------------------------------------------------------
    FILLING_UP_FAST,
    FILLING_UP,
    Alert("HostFilesystemAlmostFull",
          f"{_FS_AVAIL} / {_FS_SIZE} < {ALMOST_FULL:g}"
          + _unless_firing("instance, path", FILLING_UP_FAST, FILLING_UP),
          "warning", for_=ALMOST_FULL_FOR,
          summary=f"{PATH} has {{{{ $value | humanizePercentage }}}} of its space free",
          description=f"The filesystem holding {PATH} has had less than {ALMOST_FULL:.0%} of its space free for "
                      f"{ALMOST_FULL_FOR}, though it is not filling fast: the next large write (a model download, "
                      "a TSDB compaction) can fail."),
    Alert("HostFilesystemUnreadable", f"{_FS_UP} == 0", "warning", for_=UNREADABLE_FOR,
          summary=f"The exporter cannot read {PATH}",
          description=f"The exporter on {{{{ $labels.instance }}}} has failed to statvfs {{{{ $labels.path }}}} "
                      f"for {UNREADABLE_FOR} (missing, not mounted into its container, or not permitted): the "
                      "disk alerts for it are blind."),
    Alert("HostMemoryPressure", f"{_MEM_AVAILABLE} / {_MEM_TOTAL} < {MEMORY_AVAILABLE_BELOW:g}", "warning",
          for_=MEMORY_FOR,
          summary="{{ $labels.instance }} has {{ $value | humanizePercentage }} of its memory available",
          description=f"The host of the exporter {{{{ $labels.instance }}}} has had less than "
                      f"{MEMORY_AVAILABLE_BELOW:.0%} of its memory available for {MEMORY_FOR}: the kernel's OOM "
                      "killer may soon end vLLM, the gateway or Prometheus."),
)
