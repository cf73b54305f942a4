"""One name, one quantity: ``wasserstein`` in /v1/drift (and /metrics, the report) is the
same W1 / reference standard deviation as /v1/drift/exact's, computed from counts.

It used to be computed on the ~20 merged quantile bins, whose open outer bins (TTFT: up to
64 s) put the top 5 % of the mass at one far-away center: the reference's standard deviation
came out several times too large, so /v1/drift said 0.22 where the exact endpoint and scipy
said 0.43, and a change above the top few percent moved nothing. It is now computed on the
feature's fine grid (four bins per doubling, each bin's mass at its geometric center).

Stated tolerance: within 5 % of scipy's W1 over numpy's standard deviation on log-normal
data (TTFT-like, sigma 0.5 in log space: a narrow feature on the grid).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.feature_records import body, records

HOUR = 3600.0
NOW = 1_700_000_000.0
TOLERANCE = 0.05


def _with_ttft(recs: list[dict], ttft: np.ndarray) -> list[dict]:
    for r, t in zip(recs, ttft):
        r["ttft_s"] = float(t)
        r["e2e_s"] = float(t) + r["tpot_s"] * r["completion_tokens"]
        r["started_at"] = r["finished_at"] - r["e2e_s"]
    return recs


def _scores(reference: np.ndarray, current: np.ndarray) -> tuple[float, float, float]:
    """(/v1/drift's wasserstein, /v1/drift/exact's, scipy's) for ttft_s."""
    state = DriftState(Store(":memory:"), WindowConfig(reservoir=current.size), clock=lambda: NOW)
    state.ingest.add(body(_with_ttft(records(reference.size, NOW - 3 * HOUR, NOW - 2 * HOUR, seed=1), reference)))
    state.baselines.freeze(("m", "v1"), NOW - 3 * HOUR, NOW - 2 * HOUR)
    state.ingest.add(body(_with_ttft(records(current.size, NOW - HOUR / 2, NOW - 1, seed=2), current)))
    verdict = state.verdicts.calibrated(("m", "v1"))
    assert verdict is not None and verdict.status in ("drift", "no_drift")
    binned = verdict.features["ttft_s"].methods["wasserstein"].score
    exact = state.verdicts.exact(("m", "v1"), "ttft_s")["wasserstein"]
    truth = stats.wasserstein_distance(reference, current) / np.std(reference)
    assert binned is not None
    return binned, exact, truth


def test_binned_and_exact_wasserstein_agree_with_scipy_on_a_shift() -> None:
    rng = np.random.default_rng(0)
    reference = rng.lognormal(np.log(0.2), 0.5, 5000)  # the whole baseline is the exact sample (5,000)
    binned, exact, truth = _scores(reference, rng.lognormal(np.log(0.2 * 1.3), 0.5, 2000))
    assert exact == pytest.approx(truth, rel=1e-9)
    assert binned == pytest.approx(truth, rel=TOLERANCE)


def test_a_change_above_the_top_three_percent_is_visible_and_measured_alike() -> None:
    rng = np.random.default_rng(1)
    reference = rng.lognormal(np.log(0.2), 0.5, 5000)
    current = rng.lognormal(np.log(0.2), 0.5, 2000)
    calm, _, _ = _scores(reference, current)
    tail = current.copy()
    top = tail > np.quantile(reference, 0.97)
    tail[top] *= 4  # only the slowest ~3 % of requests get four times slower
    binned, _exact, truth = _scores(reference, tail)
    assert binned == pytest.approx(truth, rel=TOLERANCE)
    assert binned > 3 * calm
