"""One rule set for one cluster or many: every aggregation and every match keeps ``cluster``.

Past one cluster, teams send every cluster's samples to one store (a central Prometheus
receiving remote-write, Thanos, Mimir) and evaluate the rules there. Each series then carries
its cluster (the sending Prometheus's external label, or a target label), and a rule that sums
``by (model)`` or matches ``on (job, instance)`` would merge two clusters' vLLMs, SLOs and
bills into one. Inside one cluster the series carry no ``cluster`` at all, and a grouping by
an absent label is a grouping by nothing: the rules give the same series as without it, and
Prometheus adds its external ``cluster`` label to the alerts it sends.

The spec writes its PromQL for one cluster, as a reader thinks of it; ``keep`` is applied to
every generated expression, so no rule can forget the label. The kubernetes-mixin templates a
``%(clusterLabel)s`` into each expression by hand instead; one pass over the tokens makes the
same rules and cannot miss one. ``select`` gives dashboards their ``$cluster`` filter.

Only the leading form of grouping is accepted (``sum by (model) (x)``): in the trailing form
(``sum(x) by (model)``) an aggregation's clause comes after its argument, and ``keep`` refuses
it rather than read it wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

CLUSTER = "cluster"

AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                          "bottomk", "topk", "quantile", "limitk", "limit_ratio"})
_KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "inf", "nan", "atan2", "start", "end"})
_TOKEN = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<space>\s+|\#[^\n]*)
  | (?P<variable>\$\{\w+\}|\$\w+)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-zA-Z0-9]*)
  | (?P<name>[A-Za-z_:][\w:]*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


def _tokens(expr: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(expr)]


def _next(tokens: list[tuple[str, str]], i: int) -> int:
    """The index of the first token after ``i`` that is not space (len(tokens) at the end)."""
    i += 1
    while i < len(tokens) and tokens[i][0] == "space":
        i += 1
    return i


def _outside(tokens: list[tuple[str, str]]) -> Iterator[tuple[int, str, str]]:
    """(index, kind, text) of the tokens outside label matchers ``{}`` and ranges ``[]``:
    label names and durations there are not PromQL names."""
    depth = 0
    for i, (kind, text) in enumerate(tokens):
        if kind == "other" and text in "{[":
            depth += 1
        elif kind == "other" and text in "}]":
            depth -= 1
        elif depth == 0:
            yield i, kind, text


def _label_list(tokens: list[tuple[str, str]], start: int) -> tuple[int, list[str]]:
    """The index of a grouping list's ``)`` and its labels, ``start`` being its ``(``."""
    labels, i = [], start + 1
    while tokens[i][1] != ")":
        if tokens[i][0] == "name":
            labels.append(tokens[i][1])
        i += 1
    return i, labels


def keep(expr: str, label: str = CLUSTER) -> str:
    """``expr`` with ``label`` kept by every aggregation and matched by every ``on``.

    ``without`` and ``ignoring`` keep it already; an aggregation with neither clause gets
    ``by (label)``."""
    tokens = _tokens(expr)
    insert: dict[int, str] = {}  # token index -> text to put before it
    previous = ""
    for i, kind, text in _outside(tokens):
        if kind == "name" and text.lower() in ("by", "without") and previous == ")":
            raise ValueError(f"trailing grouping clause (use `sum by (...) (x)`): {expr}")
        if kind == "name" and text.lower() in ("by", "on"):
            opening = _next(tokens, i)
            _, labels = _label_list(tokens, opening)
            if label not in labels:
                insert[opening + 1] = f"{label}, " if labels else label
        elif kind == "name" and text.lower() in AGGREGATIONS:
            after = _next(tokens, i)
            if after < len(tokens) and tokens[after][1] == "(":
                insert[after] = f"by ({label}) " if after > i + 1 else f" by ({label}) "
        if kind != "space":
            previous = text
    return "".join(insert.get(i, "") + text for i, (_, text) in enumerate(tokens))


def select(expr: str, matcher: str, unfiltered: frozenset[str] = frozenset()) -> str:
    """``expr`` with ``matcher`` (``cluster=~"$cluster"``) added to every series selector, but
    those of ``unfiltered``: series made of constants (``vector(0.999)``), which belong to no
    cluster."""
    tokens = _tokens(expr)
    insert: dict[int, str] = {}
    skip_to = -1  # the end of a grouping list: label names, not series
    for i, kind, text in _outside(tokens):
        if i <= skip_to:
            continue
        if kind == "name" and text.lower() in ("by", "without", "on", "ignoring", "group_left", "group_right"):
            opening = _next(tokens, i)
            if opening < len(tokens) and tokens[opening][1] == "(":
                skip_to, _ = _label_list(tokens, opening)
            continue
        if kind != "name" or text.lower() in _KEYWORDS or text in unfiltered:
            continue
        after = _next(tokens, i)
        if after < len(tokens) and (tokens[after][1] == "(" or tokens[after][1].lower() in ("by", "without")):
            continue  # a function or an aggregation
        if after < len(tokens) and tokens[after][1] == "{":
            empty = _next(tokens, after) < len(tokens) and tokens[_next(tokens, after)][1] == "}"
            insert[after + 1] = matcher if empty else f"{matcher}, "
        else:
            insert[i + 1] = f"{{{matcher}}}"
    return "".join(insert.get(i, "") + text for i, (_, text) in enumerate(tokens)) + insert.get(len(tokens), "")


def keep_in_rules(doc: dict[str, Any]) -> dict[str, Any]:
    """A rule file document with ``keep`` applied to every expression."""
    return {**doc, "groups": [{**g, "rules": [{**r, "expr": keep(r["expr"])} for r in g["rules"]]}
                              for g in doc["groups"]]}


def absent_from(selector: str) -> str:
    """The clusters where ``selector`` has no series: ``absent()`` per cluster. ``absent``
    itself returns one series without labels, which says nothing of one cluster among several
    and matches none of their ``cluster`` values; inside one cluster the two agree. A
    Prometheus that scrapes nothing at all has no ``up``: ``absent(up)`` speaks for it."""
    return (f"(group by ({CLUSTER}) (up or absent(up))\n"
            f" unless on ({CLUSTER}) group by ({CLUSTER}) ({selector}))")
