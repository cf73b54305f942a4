"""Experiment ledgers: what every experiment's records and ratings add up to, per weight
epoch and variant, from the experiment's first record, apart from the drift windows.

A canary runs for days and its weights change at each ramp step; a sliding window would
start a new sample every hour and mix steps. The gateway stamps each record with its
experiment, the weight epoch and the variant's weight in it, so each epoch is one sample
with known weights, kept whole for as long as the experiment lives.

Bounds: at most ``max_experiments`` experiments (records of more are counted in
``overflow`` and not kept) and at most ``max_rows`` unit rows per experiment over all its
epochs and variants (17 float64 columns and a sample key: about 150 bytes a row with its id,
so 100,000 rows are about 15 MB). Past ``max_rows`` the ledger keeps a uniform sample of
units (``drift.ab.units``), halving its sampling threshold as often as needed; request and
rating counts stay exact. An experiment without records for ``retention_s`` is dropped.

Persistence: ``snapshot`` and ``restore_ledger`` turn a ledger into bytes and back; the
drift state checkpoints them with the id of the last batch they include and replays the
batches after it, so a restart loses nothing that was acknowledged.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from inferwatch.drift.ab.units import COL, COLUMNS, UnitTable, feedback_values, record_values, sample_key
from inferwatch.drift.schema import Batch

LedgerKey = tuple[str, str]  # (model, experiment)


@dataclass
class ArmEpoch:
    """One variant in one epoch."""

    table: UnitTable = field(default_factory=UnitTable)
    requests: int = 0  # every record, kept unit or not
    feedback: tuple[int, int] = (0, 0)  # every rating: (positive, total)
    weight: float | None = None  # the variant's weight in the epoch, from its first record
    conflicts: int = 0  # records that gave another weight: the gateway reused an epoch
    first_at: float = math.inf
    last_at: float = -math.inf


class ExperimentLedger:
    def __init__(self, model: str, experiment: str, max_rows: int) -> None:
        self.model, self.experiment, self.max_rows = model, experiment, max_rows
        self.epochs: dict[int, dict[str, ArmEpoch]] = {}
        self.threshold = 1.0  # units with a sample key at or over it are not kept
        self.last_at = -math.inf
        self.dirty = True  # changed since the last checkpoint

    def arm(self, epoch: int, variant: str) -> ArmEpoch:
        arms = self.epochs.setdefault(epoch, {})
        found = arms.get(variant)
        if found is None:
            found = arms[variant] = ArmEpoch()
        return found

    def rows(self) -> int:
        return sum(a.table.size for arms in self.epochs.values() for a in arms.values())

    def add_records(self, epoch: int, variant: str, batch: Batch, rows: np.ndarray) -> None:
        arm = self.arm(epoch, variant)
        arm.requests += rows.size
        weights = batch.weight[rows]
        if arm.weight is None:
            arm.weight = float(weights[0])
        arm.conflicts += int(np.count_nonzero(weights != arm.weight))
        t = batch.finished_at[rows]
        arm.first_at, arm.last_at = min(arm.first_at, float(t.min())), max(arm.last_at, float(t.max()))
        self.last_at = max(self.last_at, arm.last_at)
        table, kept, at = arm.table, [], []
        for i in rows.tolist():
            unit = batch.unit[i]
            if unit is not None and unit in table.ids:
                kept.append(i)
                at.append(table.ids[unit])
                continue
            key = sample_key(unit if unit is not None else
                             f"{self.experiment}/{batch.finished_at[i]!r}/{batch.numeric['e2e_s'][i]!r}/{i}")
            if key < self.threshold:
                kept.append(i)
                at.append(table.row(unit, key))
        if kept:
            idx = np.array(kept)
            table.add(np.array(at), record_values(batch.status[idx], [batch.finish_reason[i] for i in kept],
                                                  {f: v[idx] for f, v in batch.numeric.items()},
                                                  [batch.categorical["output"][i] for i in kept]))
        self._bound()
        self.dirty = True

    def add_rating(self, epoch: int, variant: str, unit: str | None, positive: bool, at: float) -> None:
        """Join a rating to its answer's unit. The gateway forwards a rating at once and its
        answer's record in a batch, so the rating may come first: it takes the unit's row,
        which the record then joins. Epochs only count once they have records."""
        arm = self.arm(epoch, variant)
        arm.feedback = (arm.feedback[0] + positive, arm.feedback[1] + 1)
        key = sample_key(unit if unit is not None else f"{self.experiment}/rating/{at!r}")
        if (unit is not None and unit in arm.table.ids) or key < self.threshold:
            arm.table.add(np.array([arm.table.row(unit, key)]), feedback_values(positive))
            self._bound()
        self.dirty = True

    def recorded_epochs(self) -> list[int]:
        """Epochs with records, in order (a rating alone makes none)."""
        return sorted(e for e, arms in self.epochs.items() if any(a.requests for a in arms.values()))

    def _bound(self) -> None:
        while self.rows() > self.max_rows:
            self.threshold /= 2
            for arms in self.epochs.values():
                for a in arms.values():
                    a.table.keep_below(self.threshold)

    def nbytes(self) -> int:
        return sum(a.table.nbytes() for arms in self.epochs.values() for a in arms.values())


class Ledgers:
    """Every experiment's ledger, keyed by (model, experiment). Not thread-safe: the drift
    state holds its lock around every call."""

    def __init__(self, max_experiments: int = 32, max_rows: int = 100_000) -> None:
        self.max_experiments, self.max_rows = max_experiments, max_rows
        self.ledgers: dict[LedgerKey, ExperimentLedger] = {}
        self.overflow = 0  # records of experiments beyond max_experiments
        self.without_epoch = 0  # records of an experiment that carry no epoch (a gateway before epochs)
        self.too_old = 0  # records finished before the retention: they would keep a dead experiment alive
        self.unjoined = 0  # ratings of no known experiment

    def _ledger(self, model: str, experiment: str) -> ExperimentLedger | None:
        ledger = self.ledgers.get((model, experiment))
        if ledger is None:
            if len(self.ledgers) >= self.max_experiments:
                return None
            ledger = self.ledgers[(model, experiment)] = ExperimentLedger(model, experiment, self.max_rows)
        return ledger

    def add_batch(self, batch: Batch, oldest: float = -math.inf) -> None:
        """Add the batch's experiment records; those finished before ``oldest`` are not kept."""
        groups: dict[tuple[str, str, int, str], list[int]] = defaultdict(list)
        epochs, finished = batch.epoch.tolist(), batch.finished_at.tolist()
        for i, (experiment, epoch) in enumerate(zip(batch.experiment, epochs)):
            if experiment is None:
                continue
            if epoch < 0:
                self.without_epoch += 1
                continue
            if finished[i] < oldest:
                self.too_old += 1
                continue
            groups[(batch.model[i], experiment, epoch, batch.variant[i])].append(i)
        for (model, experiment, epoch, variant), rows in groups.items():
            ledger = self._ledger(model, experiment)
            if ledger is None:
                self.overflow += len(rows)
                continue
            ledger.add_records(epoch, variant, batch, np.array(rows))

    def add_rating(self, model: str, experiment: str, epoch: int, variant: str, unit: str | None, positive: bool,
                   at: float) -> bool:
        """Ratings join an experiment that has records (a rating never starts one)."""
        ledger = self.ledgers.get((model, experiment))
        if ledger is None:
            self.unjoined += 1
            return False
        ledger.add_rating(epoch, variant, unit, positive, at)
        return True

    def of_model(self, model: str) -> list[ExperimentLedger]:
        """The model's experiments, the latest (by its last record) first."""
        return sorted((ledger for (m, _), ledger in self.ledgers.items() if m == model), key=lambda x: -x.last_at)

    def expire(self, before: float) -> list[LedgerKey]:
        gone = [key for key, ledger in self.ledgers.items() if ledger.last_at < before and ledger.epochs]
        for key in gone:
            del self.ledgers[key]
        return gone

    def nbytes(self) -> int:
        return sum(ledger.nbytes() for ledger in self.ledgers.values())


def snapshot(ledger: ExperimentLedger) -> bytes:
    """The ledger as bytes (numpy's npz: no pickle)."""
    meta: dict[str, Any] = {"model": ledger.model, "experiment": ledger.experiment, "threshold": ledger.threshold,
                  "last_at": _finite(ledger.last_at), "columns": list(COLUMNS), "arms": []}
    arrays: dict[str, np.ndarray] = {}
    for epoch, arms in ledger.epochs.items():
        for variant, a in arms.items():
            n = len(meta["arms"])
            rows_of_ids = sorted(a.table.ids.items(), key=lambda kv: kv[1])
            meta["arms"].append({"epoch": epoch, "variant": variant, "requests": a.requests,
                                 "feedback": list(a.feedback), "weight": a.weight, "conflicts": a.conflicts,
                                 "first_at": _finite(a.first_at), "last_at": _finite(a.last_at),
                                 "ids": [u for u, _ in rows_of_ids], "id_rows": [r for _, r in rows_of_ids]})
            arrays[f"data{n}"] = a.table.view()
            arrays[f"keys{n}"] = a.table.keys[:a.table.size]
    out = io.BytesIO()
    np.savez(out, meta=np.frombuffer(orjson.dumps(meta), dtype=np.uint8), **arrays)  # type: ignore[arg-type]  # numpy types **kwds as its flags
    return out.getvalue()


def restore_ledger(blob: bytes, max_rows: int) -> ExperimentLedger:
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        meta = orjson.loads(npz["meta"].tobytes())
        unknown = set(meta["columns"]) - set(COLUMNS)
        if unknown:
            raise ValueError(f"checkpoint columns {sorted(unknown)} are not among {list(COLUMNS)}")
        # a checkpoint from before a column existed: the column starts at 0 for its units
        at = np.array([COL[name] for name in meta["columns"]], dtype=np.int64)
        ledger = ExperimentLedger(meta["model"], meta["experiment"], max_rows)
        ledger.threshold, ledger.last_at = meta["threshold"], _time(meta["last_at"], -math.inf)
        for n, doc in enumerate(meta["arms"]):
            a = ledger.arm(doc["epoch"], doc["variant"])
            a.requests, a.feedback, a.weight = doc["requests"], tuple(doc["feedback"]), doc["weight"]
            a.conflicts, a.first_at, a.last_at = doc["conflicts"], _time(doc["first_at"], math.inf), _time(
                doc["last_at"], -math.inf)
            data, keys = npz[f"data{n}"], npz[f"keys{n}"]
            table = a.table = UnitTable(max(64, data.shape[0]))
            table.data[:data.shape[0], at], table.keys[:keys.size], table.size = data, keys, data.shape[0]
            table.ids = dict(zip(doc["ids"], doc["id_rows"]))
    ledger.dirty = False
    return ledger


def _finite(t: float) -> float | None:
    return t if math.isfinite(t) else None


def _time(t: float | None, missing: float) -> float:
    return missing if t is None else t
