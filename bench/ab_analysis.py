"""A/B verdict bench, on users as unequal as real ones (tests/support/ab_simulation.py):

1. speed: the whole verdict over an epoch at the ledger's bound (100,000 unit rows, about
   50,000 units per arm), against scipy's own Mann-Whitney on one metric of the same data
   (target: at most 1 s; the gauges evaluate it at every scrape, within its 10 s timeout);
2. A/A, 1,000 experiments of 300 users (the issue's setting): sample-ratio holds and false
   rollbacks with the unit as the unit of analysis, against the same requests counted as
   independent (the baseline the issue measured);
3. broken splits: experiments of 300, 3,000 and 30,000 users that lost part of one arm's
   units (a logging path that drops them), looked at four times an hour: how often they are
   held for sample ratio and how often promoted, beside A/As of the same size;
4. a regression only the heaviest users meet (the tenth most active, near half the
   requests, 50 % slower first token): rolled back, and by which guardrail, beside A/As;
5. CUPED: the factor fewer units a user's lead-in saves on the first-token rank test, and
   the A/A rates with and without it;
6. three-day canaries of 20,000 users, four ramp steps, a look every ``--every`` hours:
   false rollbacks of A/As over the whole life, and when a 5 % slower first token is caught.

    .venv/bin/python bench/ab_analysis.py [--sims 1000] [--cases 30] [--lives 10] [--every 3]
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

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

from inferwatch.drift.ab.decision import AbResult, Arm, Experiment, analyse, sample_ratio_check  # noqa: E402
from inferwatch.drift.ab.source import spent_alpha  # noqa: E402
from inferwatch.drift.ab.spec import METRICS  # noqa: E402
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
    for name, s in ((f"whole verdict: {len(METRICS)} guardrails on units, SRM, Holm, decision", full),
                    ("sample-ratio check on units (always-valid and chi-square)", srm),
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
    print("| unit of analysis | held for sample ratio (nominal 0.001 a look) | rolled back (alpha 0.05) |")
    print("| --- | ---: | ---: |")
    for label, (held, rolled) in counts.items():
        name = "the user (ours)" if label == "units" else "the request (baseline: requests as independent)"
        print(f"| {name} | {held / sims:.3f} | {rolled / sims:.3f} |")
    print()


def users_for(units: int, per_user: float) -> int:
    """Users to simulate for ``units`` of them to send at least one request in the hour (the
    quiet ones do not): what an experiment's size in units means."""
    rate = sim.users(100_000, per_user, 1.0, np.random.default_rng(0)).rate
    return round(units / float(np.mean(-np.expm1(-rate))))


def experiment(units: int, per_user: float, rng: np.random.Generator, tag: str, lost: float = 0.0,
               effect: float = 0.0, heavy: float = 0.0, looks: int = 4) -> list[AbResult]:
    """One hour of one experiment, 50/50, of about ``units`` active users before any is lost,
    looked at ``looks`` times: ``lost`` of the treatment's users never reach the drift
    service; ``effect`` slows the first token of the treatment's users (the ``heavy`` most
    active only, if given)."""
    n_users = users_for(units, per_user)
    users = sim.users(n_users, per_user, 1.0, rng)
    split = sim.split((0.5, 0.5), 0)
    split = type(split)(split.model, split.name, tag.encode(), split.variants, split.weights, split.bounds)
    affected = sim.heaviest(users, heavy) if heavy else None
    r = sim.lose(sim.requests(users, split, 0, 3600, rng, effect, affected), 1, rng.random(n_users) < lost)
    out = []
    for k in range(1, looks + 1):
        seen = sim.subset(r, r.finished_at <= 3600 * k / looks)
        c, t = sim.unit_tables(seen)
        out.append(analyse(Experiment("control", "treatment", alpha=ALPHA),
                           Arm("control", c, int((seen.arm == 0).sum()), 0.5),
                           Arm("treatment", t, int((seen.arm == 1).sum()), 0.5)))
    return out


BROKEN = ((300, 0.5, "held >= 0.9"), (3_000, 0.2, "held >= 0.9"), (30_000, 0.06, "held >= 0.9"),
          (3_000, 0.1, "promoted <= 0.05"), (30_000, 0.02, ""), (300, 0.0, ""), (3_000, 0.0, ""), (30_000, 0.0, ""))


def broken_splits(cases: int) -> None:
    print(f"## Broken splits: one arm loses some of its users' records; {cases} experiments a row, 5.6 requests "
          "per user an hour, looked at after 15, 30, 45 and 60 minutes\n")
    print("| units (active users) | treatment's units lost | held at any look | held at the last | "
          "promoted at any look | target | met |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for n, lost, target in BROKEN:
        rng = np.random.default_rng(int(n + lost * 1000))
        runs = [experiment(n, 5.6, rng, f"broken-{n}-{lost}-{k}", lost=lost) for k in range(cases)]
        held = sum(any(x.srm.alarm for x in looks) for looks in runs) / cases  # type: ignore[union-attr]
        last = sum(looks[-1].srm.alarm for looks in runs) / cases  # type: ignore[union-attr]
        promoted = sum(any(x.decision == "promote" for x in looks) for looks in runs) / cases
        met = "-"
        if target:
            what, op, bound = target.split()
            value = {"held": held, "promoted": promoted}[what]
            met = "met" if (value >= float(bound) if op == ">=" else value <= float(bound)) else "MISSED"
        print(f"| {n:,} | {lost:.0%} | {held:.2f} | {last:.2f} | {promoted:.2f} | {target or '-'} | {met} |")
    print("\nA/A rows: the fixed-horizon check's false holds are at most 0.001 a look (four looks); the "
          "always-valid one's 0.001 over all of them.\n")


def heavy_users(cases: int) -> None:
    n = 10_000
    print(f"## The heaviest tenth of {n:,} active users (near half the requests) get a 50 % slower first token; "
          f"{cases} experiments a row, four looks an hour\n")
    print("| experiment | rolled back | by ttft (unit means) | by ttft_per_request | target |")
    print("| --- | ---: | ---: | ---: | --- |")
    for effect, label, target in ((0.5, "heaviest tenth 50 % slower", ">= 0.8"), (0.0, "A/A", "<= 0.05")):
        rng = np.random.default_rng(21 if effect else 22)
        firsts = []
        for k in range(cases):
            rolled = [x for x in experiment(n, 5.6, rng, f"heavy-{effect}-{k}", effect=effect, heavy=0.1)
                      if x.decision == "rollback"]
            firsts.append(rolled[0].worse if rolled else None)
        share = sum(w is not None for w in firsts) / cases
        by = {m: sum(w is not None and m in w for w in firsts) / cases for m in ("ttft", "ttft_per_request")}
        print(f"| {label} | {share:.2f} | {by['ttft']:.2f} | {by['ttft_per_request']:.2f} | rolled back {target} |")
    print()


def cuped(cases: int, aa_sims: int) -> None:
    """The units saved: a z-test's units for a given power scale with 1 / z^2 at a fixed effect."""
    print("## CUPED: each user's lead-in (an epoch with the treatment at weight 0) adjusts the rank tests\n")
    print("| lead-in | users | mean z of a 5 % slower first token, plain | with CUPED | units saved "
          "(1 - (z_plain / z_cuped)^2) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for hours in (1, 24):
        rng = np.random.default_rng(31 + hours)
        zs = np.array([_cuped_pair(3000, rng, f"cuped-{hours}-{k}", 0.05, hours, "ttft") for k in range(cases)])
        plain, adjusted = zs.mean(axis=0)
        print(f"| {hours} h | 3,000 | {plain:.2f} | {adjusted:.2f} | {1 - (plain / adjusted) ** 2:.0%} |")
    rng = np.random.default_rng(40)
    rates = np.array([_cuped_pair(300, rng, f"cuped-aa-{k}", 0.0, 1, "rollback") for k in range(aa_sims)])
    print(f"\nA/A, {aa_sims:,} experiments of 300 users with an hour's lead-in, one look: rolled back "
          f"{rates[:, 0].mean():.3f} plain, {rates[:, 1].mean():.3f} with CUPED (alpha {ALPHA}); ttft's fixed-sample "
          f"p < 0.05 in {rates[:, 2].mean():.3f} plain, {rates[:, 3].mean():.3f} with CUPED (nominal 0.05)\n")


def _cuped_pair(n: int, rng: np.random.Generator, tag: str, effect: float, hours: float, what: str) -> tuple:
    users = sim.users(n, 5.6, 1.0, rng)
    split = sim.split((0.5, 0.5), 1)
    split = type(split)(split.model, split.name, tag.encode(), split.variants, split.weights, split.bounds, 1)
    lead_in = sim.requests(users, sim.split((1.0, 0.0), 0), -3600 * hours, 0, rng)
    r = sim.requests(users, split, 0, 3600, rng, effect)
    c, t = sim.unit_tables(r)
    bc, bt = sim.lead_in_tables(lead_in, r, n)
    control, treatment = Arm("control", c, int((r.arm == 0).sum()), 0.5), Arm("treatment", t, int((r.arm == 1).sum()), 0.5)
    exp = Experiment("control", "treatment", alpha=ALPHA)
    plain = analyse(exp, control, treatment)
    adjusted = analyse(exp, replace(control, before=bc), replace(treatment, before=bt))
    if what == "ttft":
        return tuple(math.copysign(float(sps.norm.isf(x.metrics["ttft"].p_value / 2)), x.metrics["ttft"].effect)
                     for x in (plain, adjusted))
    return (plain.decision == "rollback", adjusted.decision == "rollback", plain.metrics["ttft"].p_value < 0.05,
            adjusted.metrics["ttft"].p_value < 0.05)


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
    parser.add_argument("--cases", type=int, default=30, help="experiments a row in the broken-split, heavy-user "
                                                                "and CUPED tables")
    parser.add_argument("--lives", type=int, default=10)
    parser.add_argument("--every", type=int, default=3)
    args = parser.parse_args()
    speed(args.runs)
    aa(args.sims)
    broken_splits(args.cases)
    heavy_users(args.cases)
    cuped(args.cases, args.sims)
    lives(args.lives, args.every)


if __name__ == "__main__":
    main()
