"""Dashboards → JSON files under dashboards/json/ (``make dashboards``), one per module."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from inferwatch.dashboards import drift, gpus, serving, slos

JSON_DIR = Path(__file__).resolve().parent / "json"
MODULES = (serving, gpus, drift, slos)


def dashboards() -> dict[str, dict]:
    """uid -> dashboard JSON document."""
    out = {}
    for module in MODULES:
        doc = json.loads(json.dumps(module.build().build(), cls=JSONEncoder))
        out[doc["uid"]] = doc
    return out


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main() -> None:
    JSON_DIR.mkdir(exist_ok=True)
    for uid, doc in dashboards().items():
        (JSON_DIR / f"{uid}.json").write_text(render(doc))
        print(JSON_DIR / f"{uid}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
