"""Alertmanager routing as data: who hears about which tier, and what silences what.

``critical`` pages (PagerDuty when a routing key file is given, and a webhook), ``warning``
opens a ticket (webhook), ``info`` goes nowhere, the Watchdog goes to a dead man's switch.
The same function renders the compose config and the one ``inferwatch up`` writes; only
receiver URLs and the secret file differ. Secrets are read from files, never inlined.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.config import settings as config
from inferwatch.config.settings import Routing

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"  # Alertmanager notification templates (package data)

# The settings' defaults (inferwatch.config.settings.Routing): group by `slo`, so a model's
# second SLO page is a notification of its own at group_wait, not one that waits for the first
# one's group_interval. Pages repeat hourly until acknowledged or resolved; tickets batch. A
# page waits 30s (Alertmanager's default) before its first notification: what inhibits it for
# the same incident (VLLMModelUnavailable) is evaluated from other targets' scrapes, up to an
# evaluation or two later, and must be there first. A total outage still pages within 2m.


@dataclass(frozen=True)
class Timing:
    group_wait: str
    group_interval: str
    repeat_interval: str


# A heartbeat every minute; its absence is the alarm. Alertmanager re-sends at a flush only
# when the last notification is older than repeat_interval, so repeat_interval sits just
# under group_interval: equal values would skip every other flush.
DEADMAN = Timing("0s", "1m", "50s")
MAX_ALERTS_PER_WEBHOOK = 1000  # Alertmanager truncates bigger groups (and says how many)

# A model with no vLLM replica up (spec.VLLMModelUnavailable) fails all its requests:
# VLLMDown pages for that, and the SLO alerts the outage causes would page for it again.
CAUSED_BY_MODEL_DOWN = ["SLOErrorBudgetBurn"]
# Alerts of one vLLM instance that its being down makes meaningless.
CAUSED_BY_VLLM_DOWN = ["VLLMKVCacheSaturated", "VLLMPreempting"]
INHIBITORS = ["VLLMModelUnavailable"]  # alerts that only inhibit: they reach nobody


@dataclass(frozen=True)
class Receivers:
    pager_webhook: str
    ticket_webhook: str
    deadman_webhook: str
    pagerduty_routing_key_file: str | None = None


def _webhook(url: str, send_resolved: bool = True) -> dict[str, Any]:
    return {"url": url, "send_resolved": send_resolved, "max_alerts": MAX_ALERTS_PER_WEBHOOK}


def _route(receiver: str, matcher: str, timing: Timing | None = None) -> dict[str, Any]:
    route: dict[str, Any] = {"receiver": receiver, "matchers": [matcher]}
    if timing:
        route |= {"group_wait": timing.group_wait, "group_interval": timing.group_interval,
                  "repeat_interval": timing.repeat_interval}
    return route


def timing(declared: config.Timing) -> Timing:
    return Timing(declared.group_wait, declared.group_interval, declared.repeat_interval)


def _slack(channel: str, api_url_file: str) -> dict[str, Any]:
    return {"api_url_file": api_url_file, "channel": channel, "send_resolved": True,
            "title": '{{ template "inferwatch.title" . }}', "text": '{{ template "inferwatch.text" . }}'}


def alertmanager_config(receivers: Receivers, templates_dir: str | Path, policy: Routing = Routing(), *,
                        page: Timing | None = None, ticket: Timing | None = None, deadman: Timing = DEADMAN) -> dict[str, Any]:
    """The config of ``policy`` (the settings' routing), with the local pager's webhooks at
    ``receivers``; ``page`` and ``ticket`` override the policy's timings (tests shorten them)."""
    page = page or timing(policy.page)
    ticket = ticket or timing(policy.ticket)
    extra = policy.receivers
    pager: dict[str, Any] = {"name": "pager", "webhook_configs": [_webhook(receivers.pager_webhook)]}
    ticket_receiver: dict[str, Any] = {"name": "ticket", "webhook_configs": [_webhook(receivers.ticket_webhook)]}
    if extra.webhook is not None:
        pager["webhook_configs"].append(_webhook(extra.webhook.url))
        if extra.webhook.tickets:
            ticket_receiver["webhook_configs"].append(_webhook(extra.webhook.url))
    if extra.slack is not None:
        pager["slack_configs"] = [_slack(extra.slack.channel, extra.slack.api_url_file)]
        if extra.slack.tickets:
            ticket_receiver["slack_configs"] = [_slack(extra.slack.channel, extra.slack.api_url_file)]
    key_file = receivers.pagerduty_routing_key_file or (extra.pagerduty.routing_key_file if extra.pagerduty else None)
    if key_file:
        pager["pagerduty_configs"] = [{
            "routing_key_file": key_file,
            "send_resolved": True,
            "severity": "critical",
            "description": '{{ template "inferwatch.title" . }}',
            "details": {"firing": '{{ template "inferwatch.text" . }}'},
            "links": [{"href": "{{ (index .Alerts 0).Annotations.runbook_url }}", "text": "runbook"},
                      {"href": "{{ (index .Alerts 0).Annotations.dashboard_url }}", "text": "dashboard"}],
        }]
    return {
        "route": {
            "receiver": "ticket",  # anything unrouted (no severity) still reaches a person
            "group_by": list(policy.group_by),
            "group_wait": ticket.group_wait, "group_interval": ticket.group_interval,
            "repeat_interval": ticket.repeat_interval,
            "routes": [
                _route("deadman", 'alertname="Watchdog"', deadman),
                _route("null", f'alertname=~"{"|".join(INHIBITORS)}"'),
                _route("pager", 'severity="critical"', page),
                _route("ticket", 'severity="warning"', ticket),
                _route("null", 'severity="info"'),
            ],
        },
        "inhibit_rules": [
            {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
             "equal": ["alertname", "model", "slo", "tenant", "cluster"]},
            {"source_matchers": ['alertname="VLLMModelUnavailable"'],
             "target_matchers": [f'alertname=~"{"|".join(CAUSED_BY_MODEL_DOWN)}"'], "equal": ["model", "cluster"]},
            {"source_matchers": ['alertname="VLLMDown"'],
             "target_matchers": [f'alertname=~"{"|".join(CAUSED_BY_VLLM_DOWN)}"'], "equal": ["instance", "cluster"]},
            *({"source_matchers": list(r.source_matchers), "target_matchers": list(r.target_matchers),
               "equal": list(r.equal)} for r in policy.inhibitions),
        ],
        "receivers": [
            pager,
            ticket_receiver,
            # a heartbeat service counts any request as a ping: the Watchdog's resolution, sent
            # when Prometheus stops, would be one more and delay the alarm
            {"name": "deadman", "webhook_configs": [_webhook(receivers.deadman_webhook, send_resolved=False)]},
            {"name": "null"},
        ],
        "templates": [f"{templates_dir}/*.tmpl"],
    }
