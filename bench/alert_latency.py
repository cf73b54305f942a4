"""Fault to page, and recovery to resolved, through the real local stack.

Runs `inferwatch up` (real vLLM on the CPU, gateway, exporter, drift service, Prometheus,
Alertmanager, local pager) with the test intervals (``--fast-alerting``: 1s scrape and
evaluation, 1s group_wait, 2s group_interval) and the shipped rules with ``for`` capped at
15s, as the end-to-end tests do. Faults: vLLM SIGKILLed (the supervisor brings it back) and
shifted feature records pushed to the drift service (recovered by re-freezing the
baseline). Times are taken from the fault to the pager's receipt. The same paths are then
computed for the shipped intervals (10s scrape and evaluation, rules' own ``for``,
Alertmanager's page/ticket timings). Target: page <= for + 2 evaluation intervals + group_wait.

    python bench/alert_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import requests  # noqa: E402

from inferwatch.alerts import spec  # noqa: E402
from inferwatch.alerts.generate import cap_for, rule_files, write  # noqa: E402
from inferwatch.alerts.model import seconds  # noqa: E402
from inferwatch.deploy.monitoring import FAST_INTERVALS, Intervals  # noqa: E402
from inferwatch.serving.tiny_model import build_tiny_model  # noqa: E402
from tests.support.feature_records import body, records  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

FOR_CAP = "15s"
NAMES = ("vllm", "gateway", "exporter", "drift", "prometheus", "alertmanager", "pager", "supervisor")


class Stack:
    def __init__(self, run_dir: Path) -> None:
        self.ports = dict(zip(NAMES, free_ports(len(NAMES))))
        rules = run_dir / "rules"
        write(cap_for(rule_files(), FOR_CAP), rules)
        argv = [sys.executable, "-m", "inferwatch", "up", "--model", str(build_tiny_model()), "--dtype", "bfloat16",
                "--run-dir", str(run_dir), "--rules-dir", str(rules), "--fast-alerting",
                *(a for n in NAMES for a in (f"--{n}-port", str(self.ports[n])))]
        self.log = open(run_dir / "up.out", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                          "PYTHONUNBUFFERED": "1"})
        eventually(lambda: "Ctrl-C stops everything" in (run_dir / "up.out").read_text(), 400, 1)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def event(self, alertname: str, status: str, after: float, **labels: str) -> dict | None:
        events = requests.get(f"{self.url('pager')}/events", params={"alertname": alertname, "status": status},
                              timeout=5).json()["events"]
        return next((e for e in events if e["received_at"] > after
                     and all(e["labels"].get(k) == v for k, v in labels.items())), None)

    def kill_vllm(self) -> float:
        pid = next(c.pid for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port == self.ports["vllm"] and c.pid)
        t = time.time()
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        return t

    def vllm_healthy(self) -> bool:
        try:
            return requests.get(f"{self.url('vllm')}/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def vllm_cycle(stack: Stack) -> tuple[float, float]:
    t_fault = stack.kill_vllm()
    page = eventually(lambda: stack.event("VLLMDown", "firing", t_fault), 120)
    eventually(stack.vllm_healthy, 300, 0.05)
    t_back = time.time()
    resolved = eventually(lambda: stack.event("VLLMDown", "resolved", t_back - 0.5), 120)
    return page["received_at"] - t_fault, resolved["received_at"] - t_back


def drift_cycle(stack: Stack, run: int) -> tuple[float, float]:
    model, drift = f"drift-bench-{run}", stack.url("drift")
    now = time.time()
    requests.post(f"{drift}/v1/ingest", data=body(records(400, now - 7200, now - 5400, seed=run, model=model)),
                  timeout=10).raise_for_status()
    requests.post(f"{drift}/v1/baselines", json={"model": model, "variant": "v1", "from": now - 7200,
                                                 "to": now - 5400}, timeout=10).raise_for_status()
    shifted = body(records(400, now - 60, now, seed=100 + run, model=model, prompt_mu=7.0))
    t_fault = time.time()
    requests.post(f"{drift}/v1/ingest", data=shifted, timeout=10).raise_for_status()
    ticket = eventually(lambda: stack.event("DriftDetected", "firing", t_fault, model=model,
                                          feature="prompt_tokens"), 120)
    # recovery: the shifted traffic becomes the accepted reference
    t_fix = time.time()
    requests.post(f"{drift}/v1/baselines", json={"model": model, "variant": "v1", "from": now - 61, "to": now + 1},
                  timeout=10).raise_for_status()
    resolved = eventually(lambda: stack.event("DriftDetected", "resolved", t_fix, model=model,
                                            feature="prompt_tokens"), 120)
    return ticket["received_at"] - t_fault, resolved["received_at"] - t_fix


def _for(name: str) -> float:
    return float(seconds(next(a.for_ for a in spec.ALERTS if a.name == name)))


def computed(name: str, intervals: Intervals, tier: str, for_cap: str | None) -> tuple[float, float, float]:
    """(target to fire, worst case to fire, worst case to resolve), in seconds.

    VLLMDown has no ``for``: it needs its second failed scrape, which plays the part of one
    (one scrape interval), and resolves once its window has passed without a failure."""
    scrape, ev = seconds(intervals.scrape), seconds(intervals.evaluation)
    timing = intervals.page if tier == "page" else intervals.ticket
    gw, gi = seconds(timing.group_wait), seconds(timing.group_interval)
    if name == "VLLMDown":
        wait = (spec.VLLM_DOWN_FAILED_SCRAPES - 1) * scrape
        return wait + 2 * ev + gw, scrape + wait + ev + gw, seconds(spec.VLLM_DOWN_WINDOW) + scrape + ev + gi
    f = _for(name) if for_cap is None else min(_for(name), seconds(for_cap))
    return f + 2 * ev + gw, scrape + ev + f + ev + gw, scrape + ev + gi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    stack = Stack(Path(tempfile.mkdtemp(prefix="inferwatch-alert-bench-")))
    try:
        vllm = [vllm_cycle(stack) for _ in range(args.runs)]
        drift = [drift_cycle(stack, i) for i in range(args.runs)]
    finally:
        stack.close()

    def stats(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} s ({min(xs):.1f}–{max(xs):.1f})"

    print(f"\n#### Fault to page, recovery to resolved (median of {args.runs} runs, min–max)\n")
    print("| fault | alert → receiver | intervals | fault → received | target (for + 2 eval + group_wait)¹ | "
          "worst case computed | recovery → resolved | worst case computed |")
    print("|---|---|---|---|---|---|---|---|")
    shipped = Intervals()
    for label, name, tier, runs in (("vLLM SIGKILL", "VLLMDown → pager", "page", vllm),
                                    ("drift injected", "DriftDetected → ticket", "ticket", drift)):
        alert = name.split()[0]
        target, worst, resolve = computed(alert, FAST_INTERVALS, tier, FOR_CAP)
        print(f"| {label} | {name} | test (1s, for ≤ {FOR_CAP}) | {stats([r[0] for r in runs])} | {target:.0f} s | "
              f"{worst:.0f} s | {stats([r[1] for r in runs])} | {resolve:.0f} s |")
        target, worst, resolve = computed(alert, shipped, tier, None)
        timing = shipped.page if tier == "page" else shipped.ticket
        print(f"| {label} | {name} | shipped ({shipped.scrape} scrape and evaluation, group_wait "
              f"{timing.group_wait}) | — | {target:.0f} s | {worst:.0f} s | — | {resolve:.0f} s |")

    print("\n¹ VLLMDown has no `for`: its second failed scrape (one scrape interval) stands in for it.")


if __name__ == "__main__":
    main()
