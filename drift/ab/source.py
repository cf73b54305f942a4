"""A/B arms read from the drift service's windows: what the gateway's feature records of one
(model, variant) add up to over the current window, or from the experiment's start.

Counts (requests, 5xx, finish reasons, and every rank metric's values on the feature's fine
bins) are exact. Raw values come from the window's reservoir: a uniform sample of at most
INFERWATCH_DRIFT_RESERVOIR values per feature, so effect sizes in seconds or tokens carry
the sampling error of that sample, which their intervals already include."""

from __future__ import annotations

from inferwatch.drift.ab.decision import Arm
from inferwatch.drift.binning import CategoricalCounts
from inferwatch.drift.state import DriftState
from inferwatch.drift.windows import split_counts

RANK_FEATURES = ("ttft_s", "tpot_s", "e2e_s", "completion_tokens")


def read_arm(state: DriftState, model: str, variant: str, since: float | None,
             feedback: tuple[int, int] | None = None) -> Arm | None:
    """The arm, or None when the variant has no window (no records, or expired)."""
    view = state.window_view((model, variant), since)
    if view is None:
        return None
    flat, samples = view
    hists = split_counts(flat)
    status, reasons = hists["status_class"], hists["finish_reason"]
    assert isinstance(status, CategoricalCounts) and isinstance(reasons, CategoricalCounts)
    classes = dict(zip(status.labels, status.counts.tolist()))
    finishes = dict(zip(reasons.labels, reasons.counts.tolist()))
    return Arm(variant, int(status.counts.sum()), int(classes["5xx"]), int(reasons.counts.sum()),
               int(finishes["length"]), {f: hists[f].counts for f in RANK_FEATURES}, samples, feedback)


def read_arms(state: DriftState, model: str, control: str, treatment: str, since: float | None,
              feedback: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)) -> tuple[Arm, Arm] | None:
    """Both arms, or None when neither variant has records (the model is unknown here). One
    without records is a variant without traffic (a canary at weight 0, before the ramp or
    after a rollback): an empty arm, which the analysis answers with "hold"."""
    found = [read_arm(state, model, v, since, fb) for v, fb in zip((control, treatment), feedback)]
    if found[0] is None and found[1] is None:
        return None
    c, t = (arm if arm is not None else Arm(v, 0, 0, 0, 0, feedback=fb)
            for arm, v, fb in zip(found, (control, treatment), feedback))
    return c, t
