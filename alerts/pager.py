"""A local pager: the Alertmanager webhook receiver for development and tests.

Each notification is logged as one readable line per alert (what, labels, runbook,
dashboard) and kept in a bounded list served as JSON at ``/events``, so a person watching
the console and a test polling the API see the same pages and resolutions.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferwatch.alerts.routing import MAX_ALERTS_PER_WEBHOOK

log = logging.getLogger(__name__)
RECEIVER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_BODY = 4 * 1024 * 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _bad(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _strings(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def parse_notification(body: bytes) -> list[dict[str, Any]]:
    """Alertmanager's webhook payload → one event per alert; ValueError says what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        raise ValueError("expected Alertmanager's webhook payload: an object with an 'alerts' list")
    if len(doc["alerts"]) > MAX_ALERTS_PER_WEBHOOK:
        raise ValueError(f"{len(doc['alerts'])} alerts in one notification; at most {MAX_ALERTS_PER_WEBHOOK} "
                         "(set max_alerts on the webhook)")
    events = []
    for i, alert in enumerate(doc["alerts"]):
        if not isinstance(alert, dict) or alert.get("status") not in ("firing", "resolved"):
            raise ValueError(f"alerts[{i}] needs 'status' firing|resolved")
        annotations = alert.get("annotations") or {}
        if not _strings(alert.get("labels")) or not _strings(annotations):
            raise ValueError(f"alerts[{i}]: 'labels' and 'annotations' must be objects of strings")
        events.append({"status": alert["status"], "labels": alert["labels"], "annotations": annotations,
                       "startsAt": alert.get("startsAt"), "endsAt": alert.get("endsAt"),
                       "fingerprint": alert.get("fingerprint")})
    return events


def _clean(text: str) -> str:
    """No control characters in the log: a label value cannot forge a line of its own."""
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


def describe(receiver: str, event: dict[str, Any]) -> str:
    """One headline per alert, then its summary and links, each on an indented line."""
    labels, notes = event["labels"], event["annotations"]
    shown = " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
    parts = [f"{receiver.upper()} {event['status'].upper()} {labels.get('alertname', '?')} "
             f"[{labels.get('severity', '-')}] {shown}"]
    if notes.get("summary"):
        parts.append(notes["summary"])
    parts += [f"{key.split('_')[0]}: {notes[key]}" for key in ("runbook_url", "dashboard_url") if notes.get(key)]
    return "\n    ".join(_clean(p) for p in parts)


async def _read_limited(request: Request) -> bytes | None:
    """The body, or None once it passes MAX_BODY (never buffered beyond that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(max_events: int = 10_000) -> Starlette:
    events: deque[dict[str, Any]] = deque(maxlen=max_events)

    async def hook(request: Request) -> Response:
        receiver = request.path_params["receiver"]
        if not RECEIVER.match(receiver):
            return _bad(404, "receiver names are 1-64 letters, digits, '-' or '_'")
        body = await _read_limited(request)
        if body is None:
            return _bad(413, f"body over {MAX_BODY} bytes")
        try:
            parsed = parse_notification(body)
        except ValueError as exc:
            return _bad(400, str(exc))
        now = time.time()
        for event in parsed:
            events.append({"receiver": receiver, "received_at": now, **event})
            log.warning("%s", describe(receiver, event))
        return JSONResponse({"received": len(parsed)})

    async def list_events(request: Request) -> Response:
        q = request.query_params
        out = [e for e in events
               if all(q.get(k) is None or v == q[k] for k, v in
                      (("receiver", e["receiver"]), ("status", e["status"]),
                       ("alertname", e["labels"].get("alertname"))))]
        return JSONResponse({"events": out})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "events": len(events)})

    return Starlette(routes=[Route("/hooks/{receiver}", hook, methods=["POST"]),
                             Route("/events", list_events, methods=["GET"]),
                             Route("/health", health, methods=["GET"])])
