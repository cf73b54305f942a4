"""Drift ingest over HTTP (batches of 1,000 records) and window memory vs records absorbed.

The service runs pinned to core 0 by default (`inferwatch drift serve`, SQLite on local
disk; `--service-cpus 0,1` lets its checkpoint thread use the other core); wrk posts the
same 1,000-record batch from core 1. Baseline in the same run: the in-process
cost of each ingest step (parse + validate, bin, persist), to show where a batch's time
goes and how much is HTTP.

    python bench/drift_ingest.py [--seconds 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import running  # noqa: E402
from inferwatch.drift.schema import parse_batch  # noqa: E402
from inferwatch.drift.service.state import DriftState  # noqa: E402
from inferwatch.drift.store import Store  # noqa: E402
from inferwatch.drift.window_config import WindowConfig  # noqa: E402
from inferwatch.drift.windows import segments_of  # noqa: E402
from tests.support.feature_records import body, records  # noqa: E402
from tests.support.sockets import free_port  # noqa: E402

SERVICE_CPUS = ""  # taskset CPU list for the service, set by --service-cpus


def wrk_post(url: str, payload: Path, seconds: int, connections: int) -> dict:
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'local f = io.open("{payload}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
                      'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True, check=True).stdout
    script.unlink()
    if "Non-2xx" in out:
        raise RuntimeError(out)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p50.group(2)]
    return {"rps": rps, "p50_ms": float(p50.group(1)) * scale}


def http_rows(seconds: int, runs: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="inferwatch-bench-drift-") as tmp:
        return _http_rows(Path(tmp), seconds, runs)


def _http_rows(tmp: Path, seconds: int, runs: int) -> list[str]:
    port = free_port()
    now = time.time()
    payload = tmp / "batch.json"
    payload.write_bytes(body(records(1000, now - 60, now, seed=1)))
    argv = [sys.executable, "-m", "inferwatch", "drift", "serve", "--port", str(port), "--db-path",
            str(tmp / "drift.sqlite3")]
    url = f"http://127.0.0.1:{port}"
    with running("drift", argv, url + "/health", cpus=SERVICE_CPUS or None):
        wrk_post(url + "/v1/ingest", payload, 1, 2)  # warm-up
        rows = []
        for conns in (1, 4):
            results = [wrk_post(url + "/v1/ingest", payload, seconds, conns) for _ in range(runs)]
            rps = statistics.median(r["rps"] for r in results)
            p50 = statistics.median(r["p50_ms"] for r in results)
            rows.append(f"| HTTP ingest, {conns} connection(s) | {rps * 1000:,.0f} records/s | "
                        f"{p50:.2f} ms per 1,000-record batch (p50) | target ≥ 200,000 records/s |")
        return rows


def step_rows(repeats: int = 200) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="inferwatch-bench-drift-") as tmp:
        return _step_rows(Path(tmp), repeats)


def _step_rows(tmp: Path, repeats: int) -> list[str]:
    now = time.time()
    raw = body(records(1000, now - 60, now, seed=2))
    state = DriftState(Store(tmp / "s.sqlite3"), WindowConfig())
    batch = parse_batch(raw, now)

    def timed(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats

    parse = timed(lambda: parse_batch(raw, now))
    count = timed(lambda: state.ingest.count(batch, now))
    store = timed(lambda: state.store.append(raw, now - 60, now, now))
    group = timed(lambda: segments_of(batch))
    assigned = parse_batch(body([r | {"experiment": "canary", "epoch": 0, "weight": 0.5, "unit": f"{i % 300:016x}"}
                                 for i, r in enumerate(records(1000, now - 60, now, seed=2))]), now)
    ledger = timed(lambda: state.ledgers.ledgers.add_batch(assigned))
    total = parse + count + store
    return [f"| in-process: parse + validate | {parse * 1e3:.2f} ms | {parse / total:.0%} of a batch | |",
            f"| in-process: bin into windows (incl. grouping {group * 1e3:.2f} ms) | {count * 1e3:.2f} ms | "
            f"{count / total:.0%} | |",
            f"| in-process: persist (SQLite WAL) | {store * 1e3:.2f} ms | {store / total:.0%} | |",
            f"| in-process: add to an experiment ledger (every record assigned, 300 users) | {ledger * 1e3:.2f} ms "
            f"| {ledger / total:.0%} more | |",
            f"| in-process total | {total * 1e3:.2f} ms | {1000 / total:,.0f} records/s without HTTP | |"]


def memory_rows() -> list[str]:
    clock = [1e9]
    state = DriftState(Store(":memory:"), WindowConfig(), clock=lambda: clock[0])
    raw = body(records(1000, clock[0] - 600, clock[0], seed=3))
    rows = []
    absorbed = 0
    for target in (1_000, 10_000, 100_000, 1_000_000):
        while absorbed < target:
            state.ingest.add(raw)
            absorbed += 1000
        rows.append(f"| window memory after {absorbed:,} records | {state.ingest.windows[('m', 'v1')].nbytes():,} bytes | "
                    "— | must not grow |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--service-cpus", default="0", help="taskset list for the service ('' = unpinned)")
    args = parser.parse_args()
    global SERVICE_CPUS
    SERVICE_CPUS = args.service_cpus
    os.sched_setaffinity(0, {1})
    print(f"## Drift ingest (median of {args.runs} runs x {args.seconds}s)\n")
    print("| what | value | detail | note |\n|---|---|---|---|")
    for row in http_rows(args.seconds, args.runs) + step_rows() + memory_rows():
        print(row)


if __name__ == "__main__":
    main()
