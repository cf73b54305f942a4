"""Always-valid p-values and confidence sequences, so that looking every minute is honest.

A fixed-sample p-value checked at every look crosses alpha far more often than alpha
(20 looks at alpha = 0.05 reject a true null about a quarter of the time). Here each test
statistic is turned into a normal-mixture likelihood ratio (Robbins 1970; the mixture
sequential probability ratio test of Johari, Koomen, Pekelis & Walsh, 'Always Valid
Inference', Operations Research 2022):

    Lambda = sqrt(1 / (1 + v)) * exp(z^2 v / (2 (1 + v))),   v = rho^2 * n_eff

where z is the standardised effect at this look and n_eff = 1 / (1/m + 1/n) the effective
sample size of the two arms. For Gaussian increments Lambda is a nonnegative martingale under
the null, so by Ville's inequality P(Lambda ever exceeds 1/alpha) <= alpha: the p-value
min(1, 1/Lambda) is valid at every look, however many. Our statistics are asymptotically
Gaussian (a rank statistic through its Hajek projection, proportions and means through the
central limit theorem), which makes these asymptotic confidence sequences in the sense of
Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas, 'Time-uniform central limit theory and
asymptotic confidence sequences' (Annals of Statistics, 2024); the A/A simulations in
tests/drift/test_ab_sequential.py check the false-alarm rate this gives on finite samples.

rho sets where the boundary is tightest: Waudby-Smith et al. choose
rho^2 = (2 log(1/alpha) + log(2 log(1/alpha) + 1)) / n*, for the effective sample size n*
at which the analysis should be most sensitive.

The guarantee holds while the sample grows: within one drift window (and from ``since``),
records only accumulate. Once a window slides, older records leave and each window is a new
sample; the service documents this, and canaries run within one window.
"""

from __future__ import annotations

import math

import numpy as np


def rho2(alpha: float, tune_n: float) -> float:
    """Mixture precision that makes the boundary tightest at ``tune_n`` effective samples."""
    log_term = 2 * math.log(1 / alpha)
    return (log_term + math.log(log_term + 1)) / tune_n


def effective_n(n_control: float, n_treatment: float) -> float:
    """1 / (1/m + 1/n): the variance of a difference between arms scales with its inverse."""
    if n_control <= 0 or n_treatment <= 0:
        return 0.0
    return 1.0 / (1.0 / n_control + 1.0 / n_treatment)


def always_valid_p(z: float | np.ndarray, v: float | np.ndarray) -> float | np.ndarray:
    """min(1, 1/Lambda) for the two-sided normal mixture; vectorised for simulations."""
    z, v = np.asarray(z, dtype=float), np.asarray(v, dtype=float)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        log_p = 0.5 * np.log1p(v) - z * z * v / (2 * (1 + v))
        p = np.where(v > 0, np.minimum(1.0, np.exp(log_p)), 1.0)
    return float(p) if p.ndim == 0 else p


def boundary(v: float, alpha: float) -> float:
    """The |z| at which the always-valid p-value reaches alpha: the confidence sequence's
    half-width in standard errors (always above the fixed-sample z_{1-alpha/2})."""
    if v <= 0:
        return math.inf
    return math.sqrt((1 + v) / v * (2 * math.log(1 / alpha) + math.log1p(v)))


def confidence_sequence(estimate: float, se: float, v: float, alpha: float) -> tuple[float, float]:
    """estimate -/+ boundary * se: covers the true effect at every look with probability
    1 - alpha (asymptotically)."""
    half = boundary(v, alpha) * se
    return estimate - half, estimate + half
