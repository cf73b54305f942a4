"""Per-unit sums: one row per randomized unit of one arm in one epoch.

The gateway assigns users (sticky by their hashed unit id), not requests, so the verdict
analyses users: their requests are not independent (a heavy user sends many, with their own
typical prompt and answer lengths). Each row holds what one unit's requests add up to, so
both the delta method (ratio metrics over units) and per-unit means can be computed at any
look without keeping a single request. A request without a unit key was assigned on its own
and is a unit of its own.

Memory is bounded by sampling units, not requests: every unit has a sample key in [0, 1)
from a hash of its id, and a unit is kept while its key is under the ledger's threshold. The
kept units are a uniform random sample of units, independent of the assignment (another
hash), so every test stays valid on them, at a lower power.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b

import numpy as np

from inferwatch.drift.ab.spec import METRICS

# What one record adds to each count column a guardrail can name (``MetricSpec.numerator`` and
# ``denominator``), from the record's status, finish reason and output kind. judged: answers
# the gateway judged (drift/schema.py ``output``), of which empty were empty.
RecordCount = Callable[[np.ndarray, list[str | None], list[str | None]], "float | np.ndarray | list[bool]"]
RECORD_COUNTS: dict[str, RecordCount] = {
    "requests": lambda status, finish, output: 1,
    "errors": lambda status, finish, output: status >= 500,
    "finished": lambda status, finish, output: [r is not None for r in finish],
    "truncated": lambda status, finish, output: [r == "length" for r in finish],
    "judged": lambda status, finish, output: [k is not None for k in output],
    "empty": lambda status, finish, output: [k == "empty" for k in output],
}
FEEDBACK_COUNTS = ("feedback_total", "feedback_positive")  # what a rating adds (feedback_values)

# The columns are the guardrails': the count columns proportions name (requests first, which
# counts units), and per numeric feature the count and sum of its values. A checkpoint names
# its columns, so their order may change between versions.
COUNT_COLUMNS = tuple(dict.fromkeys(["requests", *(c for m in METRICS for c in (m.numerator, m.denominator) if c)]))
UNIT_FEATURES = tuple(dict.fromkeys(m.feature for m in METRICS if m.feature))
COLUMNS = (*COUNT_COLUMNS, *(f"{f}:{part}" for f in UNIT_FEATURES for part in ("n", "sum")))
COL = {name: i for i, name in enumerate(COLUMNS)}
_unknown = set(COUNT_COLUMNS) - RECORD_COUNTS.keys() - set(FEEDBACK_COUNTS)
if _unknown:
    raise ValueError(f"guardrail columns {sorted(_unknown)} have no definition in RECORD_COUNTS")
# Values are summed on a grid of 2^-20 (about a microsecond of latency): multiples of one
# power of two add up exactly, in any order, below 2^33 per unit. A unit's records reach two
# drift replicas in different orders (through different gateways' batches), and float sums
# in another order differ in the last bits; on the grid both replicas hold the same sums.
GRID = 2.0**20
_SAMPLE_PERSON = b"ab-unit-sample"  # a hash apart from the gateway's assignment hash


def sample_key(text: str) -> float:
    """A unit's place in [0, 1) for sampling; the same on every replica and after a restart."""
    digest = blake2b(text.encode(), digest_size=8, person=_SAMPLE_PERSON).digest()
    return int.from_bytes(digest) / 2.0**64


class UnitTable:
    """Rows of per-unit sums, grown by doubling. ``ids`` maps a unit id to its row; rows of
    units assigned request by request have no id."""

    def __init__(self, capacity: int = 64) -> None:
        self.data = np.zeros((capacity, len(COLUMNS)))
        self.keys = np.zeros(capacity)
        self.ids: dict[str, int] = {}
        self.size = 0

    def row(self, unit: str | None, key: float) -> int:
        """The unit's row, added if new (``unit`` None: always a new row)."""
        if unit is not None:
            found = self.ids.get(unit)
            if found is not None:
                return found
        if self.size == self.data.shape[0]:
            self.data = np.concatenate([self.data, np.zeros_like(self.data)])
            self.keys = np.concatenate([self.keys, np.zeros_like(self.keys)])
        r = self.size
        self.size += 1
        self.keys[r] = key
        if unit is not None:
            self.ids[unit] = r
        return r

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        np.add.at(self.data, rows, values)

    def view(self) -> np.ndarray:
        """The rows in use (a view: copy before the table changes if it must outlive that)."""
        return self.data[:self.size]

    def keep_below(self, threshold: float) -> None:
        """Drop the units whose sample key is at or over ``threshold``."""
        keep = np.flatnonzero(self.keys[:self.size] < threshold)
        renumber = np.full(self.size, -1)
        renumber[keep] = np.arange(keep.size)
        self.ids = {u: int(renumber[r]) for u, r in self.ids.items() if renumber[r] >= 0}
        self.data[:keep.size] = self.data[keep]
        self.keys[:keep.size] = self.keys[keep]
        self.data[keep.size:self.size] = 0
        self.size = keep.size

    def nbytes(self) -> int:
        return self.data.nbytes + self.keys.nbytes + 120 * len(self.ids)


def record_values(status: np.ndarray, finish_reason: list[str | None], numeric: dict[str, np.ndarray],
                  output: list[str | None]) -> np.ndarray:
    """What each record adds to its unit's row, one row per record."""
    values = np.zeros((status.size, len(COLUMNS)))
    for name in COUNT_COLUMNS:
        count = RECORD_COUNTS.get(name)
        if count is not None:
            values[:, COL[name]] = count(status, finish_reason, output)
    for f in UNIT_FEATURES:
        x = numeric[f]
        present = ~np.isnan(x)
        values[:, COL[f"{f}:n"]] = present
        values[:, COL[f"{f}:sum"]] = np.where(present, np.round(x * GRID) / GRID, 0.0)
    return values


def feedback_values(positive: bool) -> np.ndarray:
    values = np.zeros((1, len(COLUMNS)))
    values[0, COL["feedback_total"]] = 1
    values[0, COL["feedback_positive"]] = positive
    return values


def unit_means(units: np.ndarray, feature: str) -> np.ndarray:
    """Each unit's mean of ``feature`` over its requests that have it (units without: left out)."""
    n, total = units[:, COL[f"{feature}:n"]], units[:, COL[f"{feature}:sum"]]
    has = n > 0
    return total[has] / n[has]


def lead_in_means(units: np.ndarray, before: np.ndarray, feature: str) -> np.ndarray:
    """For the units ``unit_means`` keeps, in its order, their mean of ``feature`` in the
    lead-in (``before``: rows aligned with ``units``); NaN where a unit had none."""
    has = units[:, COL[f"{feature}:n"]] > 0
    n, total = before[has, COL[f"{feature}:n"]], before[has, COL[f"{feature}:sum"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.where(n > 0, n, 1), np.nan)
