"""Dashboards → JSON documents for dashboards/json/, one per module. Pure functions;
``make generate`` (``inferwatch.generate``) writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from inferwatch.alerts.spec import DEFAULT, Spec
from inferwatch.dashboards import drift, gpus, serving, slos, tenants

JSON_DIR = Path(__file__).resolve().parent / "json"
MODULES = (serving, gpus, drift, slos, tenants)


# Written by the SDK on every variable, read by Grafana only on interval variables, and not
# in @grafana/schema's VariableModel (tests/dashboards/test_grafana_types.py).
INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def dashboards(spec: Spec = DEFAULT) -> dict[str, dict[str, Any]]:
    """uid -> dashboard JSON document."""
    out = {}
    for module in MODULES:
        doc = json.loads(json.dumps(module.build(spec).build(), cls=JSONEncoder))
        for var in doc.get("templating", {}).get("list", []):
            if var["type"] != "interval":
                for key in INTERVAL_ONLY:
                    var.pop(key, None)
        out[doc["uid"]] = doc
    return out


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def files(spec: Spec = DEFAULT, out_dir: Path = JSON_DIR) -> dict[Path, str]:
    """The dashboards (``dashboards/json/<uid>.json`` as committed), path -> text."""
    return {out_dir / f"{uid}.json": render(doc) for uid, doc in dashboards(spec).items()}
