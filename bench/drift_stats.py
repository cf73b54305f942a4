"""Drift statistics cost: binning plus every distance method for 2 features x 1e6 values,
reference and current, on one core; each method on prepared bins; and Evidently's
DataDriftPreset on the same data, side by side, when its venv exists.

    python bench/drift_stats.py [--values 1000000] [--runs 7]

Evidently runs in its own environment (bench/.venv-evidently, made by `make bench-drift`)
so it never enters the project's dependencies; this script calls it as a subprocess on
the same .npy files and reads back its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from inferwatch.drift.binning import histogram, log_edges  # noqa: E402
from inferwatch.drift.methods import METHODS, evaluate, prepare  # noqa: E402

EVIDENTLY_VENV = ROOT / "bench" / ".venv-evidently"
EVIDENTLY_PY = EVIDENTLY_VENV / "bin" / "python"
NUMERIC = [m for m, s in METHODS.items() if s.applies_to == "numeric"]

EVIDENTLY_SCRIPT = """
import sys, time, json
import numpy as np, pandas as pd
from evidently import Report
from evidently.presets import DataDriftPreset
d = sys.argv[1]
ref = pd.DataFrame({"prompt_tokens": np.load(d + "/ref_a.npy"), "ttft_s": np.load(d + "/ref_b.npy")})
cur = pd.DataFrame({"prompt_tokens": np.load(d + "/cur_a.npy"), "ttft_s": np.load(d + "/cur_b.npy")})
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    Report([DataDriftPreset()]).run(reference_data=ref, current_data=cur)
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ref_a": rng.lognormal(5.0, 1.0, n).round(),  # prompt tokens
        "cur_a": rng.lognormal(5.3, 1.1, n).round(),
        "ref_b": rng.gamma(2.0, 0.1, n),  # time to first token, seconds
        "cur_b": rng.gamma(2.2, 0.1, n),
    }


def ours(d: dict[str, np.ndarray]) -> dict:
    edges = {"a": log_edges(1, 32768, 30), "b": log_edges(0.001, 60, 30)}
    results = {}
    for f in ("a", "b"):
        ref, cur = histogram(d[f"ref_{f}"], edges[f]), histogram(d[f"cur_{f}"], edges[f])
        pp = prepare(ref, cur)
        results[f] = {m: evaluate(m, ref, cur, prepared=pp).score for m in NUMERIC}
    return results


def time_runs(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def per_method(d: dict[str, np.ndarray], repeats: int = 20000) -> list[str]:
    edges = log_edges(1, 32768, 30)
    ref, cur = histogram(d["ref_a"], edges), histogram(d["cur_a"], edges)
    pp = prepare(ref, cur)
    rows = []
    t_prep = time_runs(lambda: prepare(ref, cur), 2000)
    rows.append(f"| prepare (once per pair) | {statistics.median(t_prep) * 1e6:.1f} µs |")
    for m in NUMERIC:
        evaluate(m, ref, cur, prepared=pp)
        t0 = time.perf_counter()
        for _ in range(repeats):
            evaluate(m, ref, cur, prepared=pp)
        rows.append(f"| {m} on prepared bins | {(time.perf_counter() - t0) / repeats * 1e6:.1f} µs |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--evidently-runs", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})  # one core
    d = data(args.values)
    ours(d)  # warm-up
    t_ours = statistics.median(time_runs(lambda: ours(d), args.runs))
    print(f"## Drift: 2 features x {args.values:,} values, reference and current, one core\n")
    print("| implementation | median | ratio |\n|---|---|---|")
    print(f"| inferwatch: binning + {', '.join(NUMERIC)} | {t_ours * 1e3:.1f} ms | 1x |")
    if (EVIDENTLY_VENV / ".installed").exists():
        with tempfile.TemporaryDirectory() as tmp:
            for k, v in d.items():
                np.save(f"{tmp}/{k}.npy", v)
            out = subprocess.run(["taskset", "-c", "0", str(EVIDENTLY_PY), "-c", EVIDENTLY_SCRIPT, tmp,
                                  str(args.evidently_runs)], capture_output=True, text=True, check=True).stdout
        t_ev = statistics.median(json.loads(out.strip().splitlines()[-1]))
        print(f"| Evidently DataDriftPreset (same data) | {t_ev * 1e3:,.0f} ms | {t_ev / t_ours:,.0f}x slower |")
    else:
        print("| Evidently DataDriftPreset | not measured: run `make bench-drift` to create its venv | |")
    print("\n| method | time |\n|---|---|")
    print("\n".join(per_method(d)))


if __name__ == "__main__":
    main()
