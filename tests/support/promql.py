"""Reading PromQL in tests: which metric names an expression selects."""

from __future__ import annotations

import re

_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (label matchers, ranges, strings, grouping
    clauses, function names and Grafana's $variables removed)."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        if match[2] is None and match[1] not in _KEYWORDS:
            names.add(match[1])
    return names


def range_functions(expr: str) -> list[tuple[str, str]]:
    """(function, metric) for every rate/irate/increase/delta over a plain selector."""
    return re.findall(r"\b(rate|irate|increase|delta|deriv|idelta)\(\s*([a-zA-Z_:][\w:]*)\s*[\{\[]", expr)
