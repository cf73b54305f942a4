"""A/B arms read from the experiment ledgers, and the alpha each weight epoch may spend.

Each epoch is a sample of its own (its weights, its units); looking at every epoch at every
look would spend alpha once per epoch. The epochs in which both arms took traffic are
numbered k = 1, 2, ... in order, and epoch k is judged at alpha / 2^k: over an experiment's
whole life, however many ramp steps and looks, the chance of a false rollback stays under
alpha (sum over k of alpha / 2^k < alpha). The first steps, usually small, get the larger
share; four ramp steps judge the last at alpha / 16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from inferwatch.drift.ab.decision import Arm
from inferwatch.drift.ab.ledger import ExperimentLedger
from inferwatch.drift.ab.units import UnitTable


@dataclass(frozen=True)
class EpochArms:
    epoch: int
    ordinal: int | None  # k among the epochs where both arms took traffic; None if one did not
    alpha: float  # what this epoch may spend
    control: Arm
    treatment: Arm
    variants: tuple[str, ...]  # every variant with records in the epoch
    first_at: float | None  # the two arms' first and last records
    last_at: float | None
    lead_in: int | None = None  # the epoch whose units' values are the CUPED covariate


def judged_epochs(ledger: ExperimentLedger, control: str, treatment: str) -> list[int]:
    """Epochs in which both variants have records, in order."""
    return sorted(e for e, arms in ledger.epochs.items()
                  if arms.get(control) is not None and arms[control].requests
                  and arms.get(treatment) is not None and arms[treatment].requests)


def spent_alpha(alpha: float, ordinal: int | None) -> float:
    return alpha / 2.0 ** (ordinal if ordinal is not None else 1)


def read_arm(ledger: ExperimentLedger, epoch: int, variant: str) -> Arm:
    """The arm as of now: a copy of its unit rows (the ledger keeps changing after), in
    ``canonical_order``."""
    a = ledger.epochs.get(epoch, {}).get(variant)
    if a is None:
        return Arm(variant)
    return Arm(variant, a.table.view()[canonical_order(a.table)], a.requests, a.weight, a.conflicts, a.feedback,
               ledger.threshold)


def canonical_order(table: UnitTable) -> np.ndarray:
    """The table's rows by their units' sample keys, not by arrival. Two drift replicas get
    the gateways' batches in different orders, so their rows come in different orders, and
    floating-point sums over units in a different order differ in the last bits: the twins'
    verdicts would differ now and then (tests/integration/test_fleet.py saw it)."""
    return np.argsort(table.keys[:table.size], kind="stable")


def lead_in_epoch(ledger: ExperimentLedger, control: str, treatment: str) -> int | None:
    """The latest epoch before the treatment's first records in which the control took
    traffic: every unit then was on the control (the treatment at weight 0), so what a unit
    did there cannot carry the treatment's effect, and it is the CUPED covariate."""
    treated = [e for e, arms in ledger.epochs.items() if arms.get(treatment) is not None and arms[treatment].requests]
    first = min(treated, default=None)
    before = [e for e, arms in ledger.epochs.items() if (first is None or e < first)
              and arms.get(control) is not None and arms[control].requests
              and not any(a.requests for v, a in arms.items() if v != control)]
    return max(before, default=None)


def with_lead_in(ledger: ExperimentLedger, arm: Arm, epoch: int, lead_in: int, control: str) -> Arm:
    """``arm`` with each unit's lead-in sums, rows aligned with its own; zeros for units the
    lead-in did not see (or assigned on their own, which have no id to join on)."""
    own = ledger.epochs.get(epoch, {}).get(arm.name)
    lead = ledger.epochs[lead_in][control].table
    before = np.zeros_like(arm.units)
    if own is not None:
        for unit, row in own.table.ids.items():
            found = lead.ids.get(unit)
            if found is not None:
                before[row] = lead.data[found]
        before = before[canonical_order(own.table)]  # in the order read_arm gave the rows
    return replace(arm, before=before)


def read_epoch(ledger: ExperimentLedger, epoch: int, control: str, treatment: str, alpha: float) -> EpochArms:
    judged = judged_epochs(ledger, control, treatment)
    ordinal = judged.index(epoch) + 1 if epoch in judged else None
    arms = ledger.epochs.get(epoch, {})
    both = [a for v, a in arms.items() if v in (control, treatment) and a.requests]
    pair = [read_arm(ledger, epoch, control), read_arm(ledger, epoch, treatment)]
    lead_in = lead_in_epoch(ledger, control, treatment)
    if lead_in is None or lead_in >= epoch:
        lead_in = None
    else:
        pair = [with_lead_in(ledger, arm, epoch, lead_in, control) for arm in pair]
    return EpochArms(epoch, ordinal, spent_alpha(alpha, ordinal), pair[0], pair[1],
                     tuple(sorted(v for v, a in arms.items() if a.requests)),
                     min((a.first_at for a in both), default=None), max((a.last_at for a in both), default=None),
                     lead_in)
