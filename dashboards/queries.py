"""Dashboard queries as Grafana sends them: variables and interval macros substituted.

Used by the live test (every panel and variable query must return data from a real
Prometheus) and by the PNG preview, so both see exactly what Grafana would ask.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import requests

NICE_STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600)


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float
    scrape_s: float  # the datasource's scrape interval ("timeInterval")
    max_points: int = 800  # about a panel's width in pixels

    @property
    def step_s(self) -> float:
        """Grafana's $__interval: range / points, rounded up to a nice step, >= the scrape."""
        raw = max((self.end - self.start) / self.max_points, self.scrape_s)
        return next((s for s in NICE_STEPS_S if s >= raw), math.ceil(raw))

    @property
    def rate_interval_s(self) -> float:
        """Grafana's $__rate_interval: max($__interval + scrape, 4 x scrape)."""
        return max(self.step_s + self.scrape_s, 4 * self.scrape_s)


def substitute(expr: str, variables: dict[str, str], tr: TimeRange) -> str:
    macros = {"__rate_interval": f"{tr.rate_interval_s:g}s", "__interval": f"{tr.step_s:g}s",
              "__range": f"{tr.end - tr.start:g}s", **variables}

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name not in macros:
            raise KeyError(f"unknown variable ${name} in {expr}")
        return macros[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def variable_values(prometheus: str, query: str, variables: dict[str, str], tr: TimeRange) -> list[str]:
    """A ``label_values(selector, label)`` variable query, answered like Grafana's."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
    if not match:
        raise ValueError(f"not a label_values() query: {query}")
    selector, label = substitute(match[1], variables, tr), match[2]
    resp = requests.get(f"{prometheus}/api/v1/label/{label}/values", timeout=30,
                        params={"match[]": selector, "start": str(tr.start), "end": str(tr.end)})
    resp.raise_for_status()
    values: list[str] = resp.json()["data"]
    return values


def all_of(values: list[str]) -> str:
    """"All" without an allValue, as Grafana sends it to Prometheus: the values as one
    regex, each escaped for a regex inside a PromQL string."""
    escaped = [re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", v.replace("\\", "\\\\\\\\")) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def resolve_variables(prometheus: str, doc: dict[str, Any], tr: TimeRange, strict: bool = False) -> dict[str, str]:
    """Each query variable's value as Grafana's default would be: "All" (its allValue, or
    the values it lists) for multi-value variables, else the first value. A variable without
    values is ``.*``, as in Grafana (no GPUs yet, no drift baseline yet); ``strict`` raises
    instead, but for ``$cluster``, which has no values in a Prometheus of one cluster."""
    resolved: dict[str, str] = {}
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        values = variable_values(prometheus, var["query"], resolved, tr)
        if not values and strict and var["name"] != "cluster":
            raise LookupError(f"variable {var['name']} ({var['query']}) has no values")
        if not values:
            resolved[var["name"]] = ".*"
        elif var.get("includeAll"):
            resolved[var["name"]] = var.get("allValue") or all_of(values)
        else:
            resolved[var["name"]] = values[0]
    return resolved


def range_query(prometheus: str, expr: str, tr: TimeRange) -> list[dict[str, Any]]:
    resp = requests.get(f"{prometheus}/api/v1/query_range", timeout=60,
                        params={"query": expr, "start": str(tr.start), "end": str(tr.end), "step": str(tr.step_s)})
    if resp.status_code != 200:
        raise ValueError(f"Prometheus refused {expr}: {resp.text}")
    result: list[dict[str, Any]] = resp.json()["data"]["result"]
    return result


def instant_query(prometheus: str, expr: str, tr: TimeRange) -> list[dict[str, Any]]:
    """An instant query at the range's end, shaped as a range result of one point (as Grafana
    draws an instant target)."""
    resp = requests.get(f"{prometheus}/api/v1/query", timeout=60, params={"query": expr, "time": str(tr.end)})
    if resp.status_code != 200:
        raise ValueError(f"Prometheus refused {expr}: {resp.text}")
    return [{"metric": r["metric"], "values": [r["value"]]} for r in resp.json()["data"]["result"]]


def panel_results(prometheus: str, panel: dict[str, Any], variables: dict[str, str], tr: TimeRange) -> list[list[dict[str, Any]]]:
    """Per target of ``panel``, the series Prometheus returns for it."""
    return [(instant_query if t.get("instant") else range_query)(prometheus, substitute(t["expr"], variables, tr), tr)
            for t in panel["targets"]]
