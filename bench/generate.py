"""What ``inferwatch generate`` and ``inferwatch validate`` cost, as a user runs them: a new
process each time, from the installed command, on the defaults and on a team's file.

Reported: the median wall time of ``--runs`` runs of each, and its ratio to the same
interpreter starting and importing the CLI (``inferwatch --help``) in the same run. The
target is under 10 s for ``generate``.

    python bench/generate.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEAM = """
models:
  - {name: llama-3.1-8b}
  - {name: coder-7b, slos: [availability]}
  - {name: Qwen/Qwen2.5-1.5B-Instruct, slos: [availability]}
slos:
  - {name: availability, sli: availability, objective: 0.995, period: 28d}
  - {name: ttft, sli: ttft, objective: 0.99, period: 28d, threshold_s: 0.5}
cost: {gpu_hour_price: 3.25, gpu_hour_prices: {"NVIDIA H100 80GB HBM3": 4.1}}
deployment: {release: prom, registry: registry.example.com/ml, tag: "1.0.0"}
"""


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "inferwatch"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "team.yaml").write_text(TEAM)
        cases = {
            "inferwatch --help (baseline)": cli + ["--help"],
            "validate team.yaml": cli + ["validate", "team.yaml"],
            "generate, defaults (fresh folder)": None,
            "generate team.yaml (fresh folder)": None,
            "generate team.yaml (again: nothing changes)": cli + ["generate", "--config", "team.yaml", "--out", "kept"],
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for run in range(args.runs):
            for name, argv in cases.items():
                if name.startswith("generate, defaults"):
                    argv = cli + ["generate", "--out", f"defaults-{run}"]
                elif name.startswith("generate team.yaml (fresh"):
                    argv = cli + ["generate", "--config", "team.yaml", "--out", f"team-{run}"]
                results[name].append(timed(argv, work))
    base = statistics.median(results["inferwatch --help (baseline)"])
    print(f"| command (median of {args.runs}, new process each) | seconds | × baseline |")
    print("| --- | --- | --- |")
    for name, times in results.items():
        median = statistics.median(times)
        print(f"| {name} | {median:.2f} | {median / base:.1f} |")


if __name__ == "__main__":
    main()
