"""A/B verdict bench, on users as unequal as real ones (tests/support/ab_simulation.py):

1. speed: the whole verdict over an epoch at the ledger's bound (100,000 unit rows, about
   50,000 units per arm), against scipy's own Mann-Whitney on one metric of the same data
   (target: at most 1 s; the gauges evaluate it at every scrape, within its 10 s timeout);
2. A/A, 1,000 experiments of 300 users (the issue's setting): sample-ratio holds and false
   rollbacks with the unit as the unit of analysis, against the same requests counted as
   independent (the baseline the issue measured);
3. three-day canaries of 20,000 users, four ramp steps, a look every ``--every`` hours:
   false rollbacks of A/As over the whole life, and when a 5 % slower first token is caught.

    .venv/bin/python bench/ab_analysis.py [--sims 1000] [--lives 10] [--every 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

from inferwatch.drift.ab.decision import Arm, Experiment, analyse, sample_ratio_check  # noqa: E402
from inferwatch.drift.ab.source import spent_alpha  # noqa: E402
from inferwatch.drift.ab.units import COL, COLUMNS, record_values, unit_means  # noqa: E402
from tests.support import ab_simulation as sim  # noqa: E402

ALPHA = 0.05
RAMP = ((0, 6, (0.99, 0.01)), (6, 18, (0.95, 0.05)), (18, 36, (0.75, 0.25)), (36, 72, (0.5, 0.5)))


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
    r = sim.requests(sim.users(125_000, 5, 1.0, rng), sim.split((0.5, 0.5), 0), 0, 3600, rng)
    c, t = sim.unit_tables(r)
    control, treatment = Arm("control", c, int((r.arm == 0).sum()), 0.5), Arm("treatment", t, int((r.arm == 1).sum()), 0.5)
    exp = Experiment("control", "treatment", shared_tokenizer=True)
    mc, mt = unit_means(c, "ttft_s"), unit_means(t, "ttft_s")
    full = timed(lambda: analyse(exp, control, treatment), runs)
    srm = timed(lambda: sample_ratio_check(exp, control, treatment), runs)
    scipy_mw = timed(lambda: sps.mannwhitneyu(mt, mc, method="asymptotic"), runs)
    print(f"## Analysis of one epoch: {c.shape[0]:,} / {t.shape[0]:,} units, {r.user.size:,} requests "
          f"(median of {runs} runs)\n")
    print("| what | time | vs scipy.mannwhitneyu on one metric's unit means |")
    print("| --- | ---: | ---: |")
    for name, s in (("whole verdict: 8 guardrails on units, SRM, Holm, decision", full),
                    ("sample-ratio check on units (always-valid)", srm),
                    ("baseline: scipy.stats.mannwhitneyu on unit means, one metric", scipy_mw)):
        print(f"| {name} | {s * 1e3:.1f} ms | {s / scipy_mw:.2f}x |")
    print(f"\ntarget: whole verdict <= 1 s -> {'met' if full <= 1.0 else 'MISSED'}\n")


def aa(sims: int) -> None:
    rng = np.random.default_rng(11)
    exp = Experiment("control", "treatment", alpha=ALPHA)
    counts = {"units": [0, 0], "requests": [0, 0]}
    per_arm = []
    for k in range(sims):
        users = sim.users(300, 5.6, 1.0, rng)
        s = sim.split((0.5, 0.5), 0)
        s = type(s)(s.model, s.name, f"aa-{k}".encode(), s.variants, s.weights, s.bounds)
        first, second = (sim.requests(users, s, t0, t0 + 1800, rng) for t0 in (0, 1800))
        for label, per_request in (("units", False), ("requests", True)):
            looks = []
            for r in (first, sim.concat(first, second)):
                tc, tt = sim.unit_tables(r, per_request)
                looks.append(analyse(exp, Arm("control", tc, int((r.arm == 0).sum()), 0.5),
                                     Arm("treatment", tt, int((r.arm == 1).sum()), 0.5)))
            counts[label][0] += any(x.srm.alarm for x in looks)  # type: ignore[union-attr]
            counts[label][1] += any(x.decision == "rollback" for x in looks)
        per_arm.append(looks[-1].requests[0])
    print(f"## A/A, {sims:,} experiments of 300 unequal users (log-normal activity, sigma 1.2; "
          f"{statistics.mean(per_arm):.0f} requests per arm), 50/50 by the gateway's hash, two looks each\n")
    print("| unit of analysis | held for sample ratio (nominal 0.001) | rolled back (alpha 0.05) |")
    print("| --- | ---: | ---: |")
    for label, (held, rolled) in counts.items():
        name = "the user (ours)" if label == "units" else "the request (baseline: requests as independent)"
        print(f"| {name} | {held / sims:.3f} | {rolled / sims:.3f} |")
    print()


def life(seed: int, effect: float, every: int) -> tuple[bool, int | None, int]:
    """One three-day canary on the pure path (what the ledger would hold, summed directly):
    (any SRM hold, hour of the first rollback, units per arm at the end)."""
    rng = np.random.default_rng(seed)
    users = sim.users(20_000, 9, 72, rng)
    held, caught, last_units = False, None, 0
    for epoch, (h0, h1, weights) in enumerate(RAMP):
        split = sim.split(weights, epoch)
        sums = np.zeros((2, len(users.ids), len(COLUMNS)))
        for hour in range(h0, h1):
            r = sim.requests(users, split, hour * 3600, (hour + 1) * 3600, rng, effect)
            values = record_values(r.status, r.finish_reason, r.numeric, sim.answers(r))
            for arm in (0, 1):
                np.add.at(sums[arm], r.user[r.arm == arm], values[r.arm == arm])
            if (hour + 1) % every:
                continue
            arms = [Arm(name, sums[a][sums[a][:, COL["requests"]] > 0], int(sums[a][:, COL["requests"]].sum()),
                        weights[a]) for a, name in enumerate(("control", "treatment"))]
            result = analyse(Experiment("control", "treatment", alpha=spent_alpha(ALPHA, epoch + 1)), *arms)
            held |= result.srm is not None and result.srm.alarm
            last_units = min(result.units)
            if result.decision == "rollback" and caught is None:
                caught = hour + 1
                if effect:
                    return held, caught, last_units
    return held, caught, last_units


def lives(n: int, every: int) -> None:
    print(f"## Three-day canaries: 20,000 users, ramp 1 % (6 h), 5 % (12 h), 25 % (18 h), 50 % (36 h), "
          f"a look every {every} h, {n} lives each\n")
    print("| canary | lives rolled back | hours to the rollback (median, range) | any sample-ratio hold |")
    print("| --- | ---: | --- | ---: |")
    for effect, label in ((0.0, "identical (A/A)"), (0.05, "first token 5 % slower")):
        runs = [life(1000 + i, effect, every) for i in range(n)]
        hours = [c for _, c, _ in runs if c is not None]
        span = f"{statistics.median(hours):.0f} ({min(hours)}-{max(hours)})" if hours else "-"
        print(f"| {label} | {len(hours)} / {n} | {span} | {sum(h for h, _, _ in runs)} / {n} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--lives", type=int, default=10)
    parser.add_argument("--every", type=int, default=3)
    args = parser.parse_args()
    speed(args.runs)
    aa(args.sims)
    lives(args.lives, args.every)


if __name__ == "__main__":
    main()
