"""The generated dashboards type-check against Grafana's own TypeScript definitions of the
dashboard model, for the Grafana line compose pins (tests/support/grafana_types.py)."""

from __future__ import annotations

import copy
import re

from inferwatch.dashboards.generate import dashboards
from tests.support.grafana_types import PANEL_TYPES, type_check

DOCS = dashboards()


def test_every_dashboard_panel_and_target_has_grafanas_types(tmp_path):
    assert {p["type"] for doc in DOCS.values() for p in doc["panels"]} <= set(PANEL_TYPES)
    result = type_check(DOCS, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_rejects_unknown_fields_and_values(tmp_path):
    """What the SDK could write wrong: an option of another plugin, a misspelt field config,
    an enum value Grafana does not have, a target field of another data source, a
    dashboard field (the ``auto`` the SDK writes on every variable)."""
    docs = copy.deepcopy(DOCS)
    serving = next(iter(docs.values()))
    # one mistake per panel: tsc reports the first excess field of an object literal only
    one, two, three, four = [p for p in serving["panels"] if p["type"] == "timeseries"][:4]
    one["options"]["colorMode"] = "value"
    two["fieldConfig"]["defaults"]["custom"]["fillOpacityy"] = 10
    three["options"]["legend"]["displayMode"] = "lists"
    four["targets"][0]["rawSql"] = "select 1"
    serving["templating"]["list"][0]["auto"] = False
    result = type_check(docs, tmp_path)
    assert result.returncode != 0
    reported = result.stdout
    for wrong in ("'\"colorMode\"'", "'\"fillOpacityy\"'", "'\"lists\"'", "'\"rawSql\"'", "'\"auto\"'"):
        assert wrong in reported, (wrong, reported[:3000])
    assert len(re.findall(r"error TS\d+", reported)) >= 5
