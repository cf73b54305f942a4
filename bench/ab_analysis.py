"""A/B verdict bench: the analysis over 1e6 requests per arm (target <= 50 ms), against
scipy's own Mann-Whitney on the same data; then the false-rollback rate of A/A experiments
checked at every look, and power against theory.

    .venv/bin/python bench/ab_analysis.py [--sims 400]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy import special  # noqa: E402
from scipy import stats as sps  # noqa: E402

from inferwatch.drift.ab import sequential as seq  # noqa: E402
from inferwatch.drift.ab import stats  # noqa: E402
from inferwatch.drift.ab.decision import Arm, Experiment, analyse, evaluate_metric  # noqa: E402
from inferwatch.drift.ab.spec import BY_NAME  # noqa: E402
from inferwatch.drift.calibration import holm  # noqa: E402
from tests.support.ab_sim import Effects, arm_at, power_proportion, stream, ttft_bin_probabilities  # noqa: E402

N = 1_000_000
RESERVOIR = 2000  # the drift service's default INFERWATCH_DRIFT_RESERVOIR
ALPHA = 0.05


def timed(fn, runs: int) -> float:
    """Median seconds of ``runs`` calls."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def speed(runs: int) -> None:
    rng = np.random.default_rng(0)
    a, b = stream(N, Effects(), rng), stream(N, Effects(ttft_factor=1.02), rng)
    control, treatment = arm_at("v1", a, N, RESERVOIR, 10), arm_at("v2", b, N, RESERVOIR, 10)
    exp = Experiment("v1", "v2", (0.5, 0.5), shared_tokenizer=True)
    raw_c = a.values["ttft_s"][np.isfinite(a.values["ttft_s"])]
    raw_t = b.values["ttft_s"][np.isfinite(b.values["ttft_s"])]
    full = timed(lambda: analyse(exp, control, treatment), runs)
    counts = timed(lambda: stats.mann_whitney_counts(control.counts["ttft_s"], treatment.counts["ttft_s"]), runs)
    shift = timed(lambda: stats.hodges_lehmann(control.samples["ttft_s"], treatment.samples["ttft_s"], ALPHA), runs)
    scipy_mw = timed(lambda: sps.mannwhitneyu(raw_t, raw_c, method="asymptotic"), max(3, runs // 2))
    ours_raw = timed(lambda: stats.mann_whitney(raw_c, raw_t), max(3, runs // 2))
    print(f"## Analysis over {N:,} requests per arm (median of {runs} runs; reservoir {RESERVOIR:,} per feature)\n")
    print("| what | time | vs scipy.mannwhitneyu on one metric's raw values |")
    print("| --- | ---: | ---: |")
    rows = [("whole verdict: 8 guardrails, SRM, Holm, decision (counts on bins + reservoir samples)", full),
            ("Mann-Whitney from bin counts, one metric (all 2e6 requests)", counts),
            ("Hodges-Lehmann + Moses interval on the 2,000-value samples, one metric", shift),
            ("Mann-Whitney on raw values (np.unique), one metric", ours_raw),
            ("baseline: scipy.stats.mannwhitneyu on raw values, one metric", scipy_mw)]
    for name, t in rows:
        print(f"| {name} | {t * 1e3:.3f} ms | {t / scipy_mw:.4f}x |")
    print(f"\ntarget: whole verdict <= 50 ms -> {'met' if full <= 0.05 else 'MISSED'}\n")


def fixed_holm_rollback(result) -> bool:
    """What a naive verdict would do: Holm on the fixed-sample p-values at every look."""
    ok = {n: m for n, m in result.metrics.items() if m.status == "ok"}
    rejected = holm({n: m.p_value for n, m in ok.items()}, ALPHA)
    return any(rejected[n] and m.spec.worse(m.sequential_effect) for n, m in ok.items())


def aa(sims: int) -> None:
    rng = np.random.default_rng(1)
    looks = np.arange(500, 8001, 500)
    exp = Experiment("a", "b", (0.5, 0.5), shared_tokenizer=True, alpha=ALPHA)
    first_seq = np.full(sims, np.inf)
    first_fixed = np.full(sims, np.inf)
    srm = 0
    for i in range(sims):
        to_b = rng.random(looks[-1]) < 0.5
        a, b = stream(looks[-1], Effects(), rng), stream(looks[-1], Effects(), rng)
        for k, total in enumerate(looks):
            nb = int(to_b[:total].sum())
            result = analyse(exp, arm_at("a", a, total - nb, 300, 5), arm_at("b", b, nb, 300, 5))
            if result.decision == "rollback":
                first_seq[i] = min(first_seq[i], k)
            if fixed_holm_rollback(result):
                first_fixed[i] = min(first_fixed[i], k)
            srm += result.srm.alarm
    bound = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / sims)
    print(f"## A/A: false rollback rate, {sims} simulated experiments, 8 guardrails, 50/50 random split, "
          f"a look every 500 requests (alpha {ALPHA}; pass bound {bound:.3f} = alpha + 3 SE)\n")
    print("| looks checked (requests) | always-valid + Holm (ours) | fixed-sample p + Holm (naive) |")
    print("| ---: | ---: | ---: |")
    for k in (0, 1, 3, 7, 15):
        print(f"| {k + 1} ({looks[k]:,}) | {np.mean(first_seq <= k):.3f} | {np.mean(first_fixed <= k):.3f} |")
    print(f"\nSRM alarms (p < 0.001) in {sims * looks.size:,} looks: {srm}\n")


def power(sims: int) -> None:
    rng = np.random.default_rng(2)
    exp = Experiment("a", "b", (0.5, 0.5), alpha=ALPHA)
    print(f"## Power at one look (always-valid p <= {ALPHA}), {sims} simulated experiments per row\n")
    print("| metric | effect | requests per arm | simulated | theory (normal approx.) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for pc, pt, label in ((0.02, 0.03, "errors 2% -> 3%"), (0.02, 0.04, "errors 2% -> 4%")):
        for n in (1000, 4000):
            xc, xt = rng.binomial(n, pc, sims), rng.binomial(n, pt, sims)
            hits = np.mean([evaluate_metric(BY_NAME["error_rate"], Arm("a", n, int(x), n, 0),
                                            Arm("b", n, int(y), n, 0), exp).p_value_sequential <= ALPHA
                            for x, y in zip(xc, xt)])
            print(f"| error_rate | {label} | {n:,} | {hits:.3f} | {power_proportion(pc, pt, n, exp):.3f} |")
    for shift in (0.04, 0.07):
        p0, p1 = ttft_bin_probabilities(0.0), ttft_bin_probabilities(shift)
        theta = float(np.dot(p1, np.cumsum(p0) - p0 / 2)) - 0.5
        for n in (1000, 4000):
            se = math.sqrt((2 * n + 1) / (12 * n * n))
            theory = float(special.ndtr(theta / se - seq.boundary(seq.rho2(ALPHA, exp.tune_n) * n / 2, ALPHA)))
            hits = np.mean([evaluate_metric(BY_NAME["ttft"], Arm("a", n, 0, n, 0, {"ttft_s": rng.multinomial(n, p0)}),
                                            Arm("b", n, 0, n, 0, {"ttft_s": rng.multinomial(n, p1)}),
                                            exp).p_value_sequential <= ALPHA for _ in range(sims)])
            print(f"| ttft | {math.exp(shift) - 1:+.0%} (lognormal, sigma 0.5) | {n:,} | {hits:.3f} | {theory:.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sims", type=int, default=400)
    args = parser.parse_args()
    speed(args.runs)
    aa(args.sims)
    power(2 * args.sims)


if __name__ == "__main__":
    main()
