"""Calibrated drift verdicts: false-alarm rates before and after, power, scoring cost, and
memory and /metrics under a flood of segments.

    python bench/drift_calibration.py [--sims 200] [--runs 5]

False alarms: fresh same-distribution (reference, window) pairs of n records each,
TTFT-like gamma values and finish reasons; "fixed" is what the service did before (the
default thresholds on one-bin-per-doubling edges, chi-square against the reference's
proportions), "calibrated" is now (alpha 0.01, 1,999 resamples). Scoring, calibration and
/metrics are medians of --runs runs; ratios are against the cheapest row of their table.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from scipy import stats  # noqa: E402

from inferwatch.drift.binning import (  # noqa: E402
    categorical_counts,
    histogram,
    log_edges,
    merge,
    merged_bins,
    merged_edges,
    quantile_starts,
)
from inferwatch.drift.calibration import STATISTICS, holm, null_distribution, size_band, statistics as stat_rows  # noqa: E402
from inferwatch.drift.methods import METHODS, chi_square, evaluate  # noqa: E402
from inferwatch.drift.schema import FEATURES  # noqa: E402
from inferwatch.drift.service.collector import DriftCollector  # noqa: E402
from inferwatch.drift.service.state import DriftState  # noqa: E402
from inferwatch.drift.store import Store  # noqa: E402
from inferwatch.drift.verdicts import CalibrationCache, Policy, method_results, score  # noqa: E402
from inferwatch.drift.window_config import WindowConfig  # noqa: E402
from tests.support.feature_records import body, records  # noqa: E402

ALPHA = 0.01
OLD_EDGES = log_edges(0.001, 64, 16)  # the ttft grid before: one bin per doubling
GRID = FEATURES["ttft_s"].edges
REASONS = ("stop", "length", "tool_calls", "content_filter", "abort")
REASON_P = np.array([0.75, 0.2, 0.04, 0.005, 0.005])


def one_pair(rng: np.random.Generator, n: int, seed: int, scale: float = 1.0) -> dict[str, tuple[bool, bool]]:
    """(fixed verdict, calibrated verdict) per method, plus the segment (Holm) verdict."""
    a, b = rng.gamma(2.0, 0.1, n), rng.gamma(2.0, 0.1 * scale, n)
    out = {}
    old_ref, old_cur = histogram(a, OLD_EDGES), histogram(b, OLD_EDGES)
    fixed = {m: evaluate(m, old_ref, old_cur).drifted for m in ("kl", "js", "psi", "wasserstein", "ks")}
    ref, cur = histogram(a, GRID), histogram(b, GRID)
    bins = merged_bins(ref.total)
    starts = quantile_starts(ref.counts, bins)
    edges = merged_edges(GRID, starts)
    null = null_distribution(ref.counts, GRID, size_band(n), bins, 1999, seed)
    observed = stat_rows(merge(ref, starts, edges).counts, merge(cur, starts, edges).counts, edges.centers)[:, 0]
    p = {m: null.p_value(m, v) for m, v in zip(STATISTICS, observed)}
    for m in p:
        out[m] = (fixed[m], p[m] <= ALPHA)
    ra = categorical_counts(list(np.array(REASONS)[rng.choice(5, n, p=REASON_P)]), REASONS)
    rb = categorical_counts(list(np.array(REASONS)[rng.choice(5, n, p=REASON_P)]), REASONS)
    one_sample = stats.chisquare(rb.counts, np.where(ra.counts == 0, 1e-4, ra.counts / ra.total) * rb.total
                                 / np.where(ra.counts == 0, 1e-4, ra.counts / ra.total).sum()).pvalue < 0.05
    chi_p = chi_square(ra, rb)[1]
    out["chi2"] = (bool(one_sample), chi_p <= ALPHA)
    feature_p = null.feature_p_value(min(p.values()))
    out["segment (Holm)"] = (any(fixed.values()) or bool(one_sample),
                             any(holm({"ttft": feature_p, "finish_reason": chi_p}, ALPHA).values()))
    return out


def false_alarm_rows(sims: int) -> list[str]:
    sizes = (50, 500, 5000, 50000)
    rates: dict[str, dict[int, tuple[float, float]]] = {}
    for n in sizes:
        rng = np.random.default_rng(n)
        counts: dict[str, list[int]] = {}
        for i in range(sims):
            for name, (old, new) in one_pair(rng, n, i).items():
                c = counts.setdefault(name, [0, 0])
                c[0] += old
                c[1] += new
        for name, (old, new) in counts.items():
            rates.setdefault(name, {})[n] = (old / sims, new / sims)
    bound = stats.binom.ppf(0.999, sims, ALPHA) / sims
    rows = ["| method | " + " | ".join(f"n={n:,} fixed → calibrated" for n in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    for name, by_n in rates.items():
        rows.append(f"| {name} | " + " | ".join(f"{old:.1%} → {new:.1%}" for old, new in by_n.values()) + " |")
    rows.append(f"\n{sims} pairs per size; alpha {ALPHA}; 99.9 % binomial bound on a calibrated rate: {bound:.1%}.")
    return rows


def power_rows(sims: int) -> list[str]:
    """Smallest TTFT scale shift found in 80 % of windows, per n (calibrated, any method)."""
    rows = ["| n | smallest scale shift detected 80 % of the time |", "|---|---|"]
    for n in (50, 500, 5000, 50000):
        found = "> 2.0"
        for shift in (1.02, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0):
            rng = np.random.default_rng(int(shift * 1000) + n)
            hits = sum(any(v[1] for k, v in one_pair(rng, n, i, shift).items() if k in STATISTICS)
                       for i in range(sims))
            if hits >= 0.8 * sims:
                found = f"×{shift}"
                break
        rows.append(f"| {n:,} | {found} |")
    return rows


def median_time(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def scoring_rows(runs: int) -> list[str]:
    clock = [1e9]
    state = DriftState(Store(":memory:"), WindowConfig(), clock=lambda: clock[0])
    state.ingest.add(body(records(5000, clock[0] - 7200, clock[0] - 5400, seed=1)))
    baseline = state.baselines.freeze(("m", "v1"), clock[0] - 7200, clock[0] - 5400)
    state.ingest.add(body(records(3000, clock[0] - 600, clock[0], seed=2)))
    current = state.ingest.current(("m", "v1"))
    policy = Policy(ALPHA)

    def cold() -> None:
        score(baseline.reference, current, policy, CalibrationCache())

    cache = CalibrationCache()
    score(baseline.reference, current, policy, cache)
    warm = median_time(lambda: score(baseline.reference, current, policy, cache), runs * 20)
    t_cold = median_time(cold, runs)
    # 20 numeric features x the 5 numeric methods + chi2, warm nulls (the sizing)
    ref_h, cur_h = baseline.reference.merged("ttft_s"), current["ttft_s"]
    cur_m = merge(cur_h, baseline.starts["ttft_s"], ref_h.edges)
    null = cache.get(baseline.reference, "ttft_s", cur_m.total, policy.resamples)
    cats = (baseline.histograms["finish_reason"], current["finish_reason"])

    def twenty() -> None:
        for _ in range(20):
            method_results(ref_h, cur_m, null, policy, (baseline.histograms["ttft_s"], cur_h))
            chi_square(*cats)

    t20 = median_time(twenty, runs * 5)
    fixed = median_time(lambda: [evaluate(m, ref_h, cur_m) for m in METHODS if m != "chi2"], runs * 20)
    return ["| what | median | ratio | target |", "|---|---|---|---|",
            f"| fixed thresholds, 1 feature x 5 methods (before) | {fixed * 1e3:.3f} ms | 1x | |",
            f"| score one segment (8 features, 32 results), warm cache | {warm * 1e3:.2f} ms | {warm / fixed:.0f}x | |",
            f"| 20 features x 6 methods, warm cache | {t20 * 1e3:.2f} ms | {t20 / fixed:.0f}x | ≤ 5 ms |",
            f"| calibrate one baseline (6 numeric features, one size band) + score | {t_cold * 1e3:.0f} ms | "
            f"{t_cold / fixed:.0f}x | ≤ 1 s |"]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def flood_rows(runs: int) -> list[str]:
    clock = [2e9]
    state = DriftState(Store(":memory:"), WindowConfig(max_segments=10_001), clock=lambda: clock[0])
    before = rss_mb()
    batch = records(10_000, clock[0] - 60, clock[0], seed=3)
    for i, rec in enumerate(batch):
        rec["model"] = f"model-{i}"
    import orjson
    t0 = time.perf_counter()
    state.ingest.add(orjson.dumps({"records": batch}))
    t_ingest = time.perf_counter() - t0
    windows = state.ingest.memory_bytes()
    grown = rss_mb() - before
    registry = CollectorRegistry()
    registry.register(DriftCollector(state))
    t_metrics = median_time(lambda: generate_latest(registry), runs)
    size = len(generate_latest(registry))
    # baselines on 200 of them, each with a window of 60 records: scored at scrape time
    for i in range(200):
        seg = (f"model-{i}", "v1")
        state.ingest.add(body(records(200, clock[0] - 7200, clock[0] - 5400, seed=10 + i, model=seg[0])))
        state.ingest.add(body(records(60, clock[0] - 60, clock[0], seed=1000 + i, model=seg[0])))
        state.baselines.freeze(seg, clock[0] - 7200, clock[0] - 5400)
    t_first = median_time(lambda: generate_latest(registry), 1)
    state.calibrator.wait()  # the background worker calibrates what the first scrape asked for
    generate_latest(registry)  # verdicts computed once, then cached until a window changes
    t_warm = median_time(lambda: generate_latest(registry), runs)
    size_b = len(generate_latest(registry))
    return ["| what | value |", "|---|---|",
            f"| ingest 1 batch of 10,000 records with 10,000 new model names | {t_ingest:.2f} s |",
            f"| window memory for 10,000 segments (counts + samples) | {windows / 1e6:.1f} MB "
            f"({windows / 10_000 / 1e3:.1f} KB per one-bucket segment) |",
            f"| process peak RSS growth during the flood | {grown:.0f} MB |",
            f"| /metrics, 10,000 segments without baselines | {size / 1e6:.2f} MB in {t_metrics * 1e3:.0f} ms |",
            f"| /metrics, + 200 baselines, first scrape (calibration queued, not waited for) | {t_first:.2f} s |",
            f"| /metrics, + 200 baselines, once calibrated (cached) | {size_b / 1e6:.2f} MB in {t_warm * 1e3:.0f} ms |",
            "| the first scrape with every threshold calibrated inline, as before | see bench/drift_first_scrape.py |",
            "| service default bound | INFERWATCH_DRIFT_MAX_SEGMENTS=1000 (records of more go to model=variant=other) |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=200)
    parser.add_argument("--power-sims", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    print("## False alarms on same-distribution windows (share of windows flagged)\n")
    print("\n".join(false_alarm_rows(args.sims)))
    print("\n## Power: TTFT scaled by a factor, calibrated at alpha 0.01\n")
    print("\n".join(power_rows(args.power_sims)))
    print(f"\n## Scoring cost (median of {args.runs}+ runs, one core)\n")
    print("\n".join(scoring_rows(args.runs)))
    print("\n## A flood of 10,000 segments\n")
    print("\n".join(flood_rows(args.runs)))


if __name__ == "__main__":
    main()
