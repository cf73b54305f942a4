"""A/B arms read from the experiment ledgers, and the alpha each weight epoch may spend.

Each epoch is a sample of its own (its weights, its units); looking at every epoch at every
look would spend alpha once per epoch. The epochs in which both arms took traffic are
numbered k = 1, 2, ... in order, and epoch k is judged at alpha / 2^k: over an experiment's
whole life, however many ramp steps and looks, the chance of a false rollback stays under
alpha (sum over k of alpha / 2^k < alpha). The first steps, usually small, get the larger
share; four ramp steps judge the last at alpha / 16.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.drift.ab.decision import Arm
from inferwatch.drift.ab.ledger import ExperimentLedger


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


def judged_epochs(ledger: ExperimentLedger, control: str, treatment: str) -> list[int]:
    """Epochs in which both variants have records, in order."""
    return sorted(e for e, arms in ledger.epochs.items()
                  if arms.get(control) is not None and arms[control].requests
                  and arms.get(treatment) is not None and arms[treatment].requests)


def spent_alpha(alpha: float, ordinal: int | None) -> float:
    return alpha / 2 ** (ordinal if ordinal is not None else 1)


def read_arm(ledger: ExperimentLedger, epoch: int, variant: str) -> Arm:
    """The arm as of now: a copy of its unit rows (the ledger keeps changing after)."""
    a = ledger.epochs.get(epoch, {}).get(variant)
    if a is None:
        return Arm(variant)
    return Arm(variant, a.table.view().copy(), a.requests, a.weight, a.conflicts, a.feedback, ledger.threshold)


def read_epoch(ledger: ExperimentLedger, epoch: int, control: str, treatment: str, alpha: float) -> EpochArms:
    judged = judged_epochs(ledger, control, treatment)
    ordinal = judged.index(epoch) + 1 if epoch in judged else None
    arms = ledger.epochs.get(epoch, {})
    both = [a for v, a in arms.items() if v in (control, treatment) and a.requests]
    return EpochArms(epoch, ordinal, spent_alpha(alpha, ordinal), read_arm(ledger, epoch, control),
                     read_arm(ledger, epoch, treatment), tuple(sorted(v for v, a in arms.items() if a.requests)),
                     min((a.first_at for a in both), default=None), max((a.last_at for a in both), default=None))
