"""CUPED: each unit's lead-in as a covariate, so the same power needs fewer units.

Deng, Xu, Kohavi & Walker, 'Improving the Sensitivity of Online Controlled Experiments by
Utilizing Pre-Experiment Data' (WSDM 2013). A user's first-token time in the experiment
follows their first-token time before it (their prompts stay long or short); subtracting
the part the lead-in predicts, theta * (x - mean x), leaves the treatment's effect and less
noise. The lead-in is an epoch in which every unit was on the control (the treatment at
weight 0), so the covariate cannot carry the treatment's effect and the adjusted values stay
exchangeable between arms under the null: the rank test on them keeps its level.

Units without a lead-in keep a covariate at the pooled mean and a 0/1 column saying so, the
usual way to keep them in (their adjustment is a shift of their group's mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Adjusted:
    control: np.ndarray
    treatment: np.ndarray
    theta: float  # on the lead-in mean
    r2: float  # share of the pooled variance the lead-in explains: the units it saves
    with_lead_in: int  # units with a lead-in value


def adjust(y_control: np.ndarray, x_control: np.ndarray, y_treatment: np.ndarray,
           x_treatment: np.ndarray) -> Adjusted:
    """``y`` minus what the lead-in ``x`` (NaN: none) predicts, theta pooled over both arms."""
    y, x = np.concatenate([y_control, y_treatment]), np.concatenate([x_control, x_treatment])
    has = ~np.isnan(x)
    if has.sum() < 2 or np.ptp(x[has]) == 0:
        return Adjusted(y_control, y_treatment, 0.0, 0.0, int(has.sum()))
    filled = np.where(has, x, x[has].mean())
    design = np.column_stack([filled - filled.mean(), has - has.mean()])
    centred = y - y.mean()
    coef, *_ = np.linalg.lstsq(design, centred, rcond=None)
    fitted = design @ coef
    out = y - fitted
    total = float(centred @ centred)
    r2 = 1 - float((centred - fitted) @ (centred - fitted)) / total if total > 0 else 0.0
    return Adjusted(out[:y_control.size], out[y_control.size:], float(coef[0]), r2, int(has.sum()))
