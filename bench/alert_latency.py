"""Fault to page, and recovery to resolved, through the real local stack.

Runs `inferwatch up` (real vLLM on the CPU, gateway, exporter, drift service, Prometheus,
Alertmanager, local pager) with the shipped rules and intervals (10s scrape and evaluation,
Alertmanager's page timings), or with ``--intervals fast`` the test intervals (1s, ``for``
capped at 15s). Steady traffic runs through the gateway meanwhile. Times are taken from the
fault to the pager's receipt.

Faults:
- vLLM SIGKILLed; the supervisor brings it back (the page: VLLMDown);
- a total outage of the model: vLLM frozen (SIGSTOP) for ``--outage-s``, every request
  through the gateway fails (a 2s upstream timeout for the bench). The page is VLLMDown;
  the model's SLO page is inhibited at Alertmanager (every replica is down) and the bench
  checks it never reaches the pager. The SLO path's own detection times are promtool's
  (tests/alerts/test_paging_timelines.py): an SLO page stays firing for 35 minutes after
  each outage here, so a bench of minutes cannot time its start more than once;
- (fast intervals only) shifted feature records pushed to the drift service (a ticket).

Targets (issue 19): a total outage pages within 2 minutes of onset, group_wait included.

    python bench/alert_latency.py [--runs 3] [--intervals shipped|fast]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import requests  # noqa: E402

from inferwatch.alerts import spec  # noqa: E402
from inferwatch.alerts.generate import cap_for, rule_files, write  # noqa: E402
from inferwatch.alerts.spec import SERVED_MODEL  # noqa: E402
from inferwatch.common.durations import seconds  # noqa: E402
from inferwatch.deploy.monitoring import FAST_INTERVALS, Intervals  # noqa: E402
from inferwatch.serving.tiny_model import build_tiny_model  # noqa: E402
from tests.support.feature_records import body, records  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

FOR_CAP = "15s"
NAMES = ("vllm", "gateway", "exporter", "drift", "prometheus", "alertmanager", "pager", "supervisor")
TARGET_OUTAGE_PAGE_S = 120


class Stack:
    def __init__(self, run_dir: Path, fast: bool) -> None:
        self.ports = dict(zip(NAMES, free_ports(len(NAMES))))
        argv = [sys.executable, "-m", "inferwatch", "up", "--model", str(build_tiny_model()), "--dtype", "bfloat16",
                "--run-dir", str(run_dir), *(a for n in NAMES for a in (f"--{n}-port", str(self.ports[n])))]
        if fast:
            rules = run_dir / "rules"
            write(cap_for(rule_files(), FOR_CAP), rules)
            argv += ["--rules-dir", str(rules), "--fast-alerting"]
        self.log = open(run_dir / "up.out", "w")  # noqa: SIM115 - open while the stack runs, closed by stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "INFERWATCH_GATEWAY_UPSTREAM_TIMEOUT_S": "2"}
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        eventually(lambda: "Ctrl-C stops everything" in (run_dir / "up.out").read_text(), 400, 1)
        self.traffic = Traffic(self.url("gateway"))
        self.started = time.time()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def event(self, alertname: str, status: str, after: float, **labels: str) -> dict | None:
        events = requests.get(f"{self.url('pager')}/events", params={"alertname": alertname, "status": status},
                              timeout=5).json()["events"]
        return next((e for e in events if e["received_at"] > after
                     and all(e["labels"].get(k) == v for k, v in labels.items())), None)

    def signal_vllm(self, sig: int) -> float:
        """Send ``sig`` to vLLM's process group (its API server and engine core); the time."""
        pid = next(c.pid for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port == self.ports["vllm"] and c.pid)
        self.vllm_group = os.getpgid(pid)
        t = time.time()
        os.killpg(self.vllm_group, sig)
        return t

    def vllm_healthy(self) -> bool:
        try:
            return requests.get(f"{self.url('vllm')}/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def close(self) -> None:
        self.traffic.stop()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Traffic:
    """Steady small requests through the gateway (about 4/s), so the SLOs have events."""

    def __init__(self, gateway: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(gateway,), daemon=True)
        self._thread.start()

    def _run(self, gateway: str) -> None:
        body = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        while not self._stop.wait(0.25):
            try:
                requests.post(f"{gateway}/v1/chat/completions", json=body, timeout=10)
            except requests.RequestException:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def settle(stack: Stack) -> None:
    """Before a fault: vLLM healthy, and Prometheus knowing the model it serves, with two
    minutes of history (in production Prometheus has run long before the incident)."""
    eventually(stack.vllm_healthy, 600, 0.5)
    eventually(lambda: requests.get(f"{stack.url('prometheus')}/api/v1/query", timeout=5,
                                    params={"query": SERVED_MODEL}).json()["data"]["result"], 300, 1)
    time.sleep(max(5.0, stack.started + 120 - time.time()))


def kill_cycle(stack: Stack) -> tuple[float, float]:
    settle(stack)
    t_fault = stack.signal_vllm(signal.SIGKILL)
    page = eventually(lambda: stack.event("VLLMDown", "firing", t_fault), 300)
    eventually(stack.vllm_healthy, 600, 0.05)
    t_back = time.time()
    resolved = eventually(lambda: stack.event("VLLMDown", "resolved", t_back - 0.5), 300)
    return page["received_at"] - t_fault, resolved["received_at"] - t_back


def outage_cycle(stack: Stack, outage_s: float) -> tuple[float, float, bool]:
    """(fault → VLLMDown page, recovery → resolved, whether an SLO page reached the pager:
    it must not, every replica being down)."""
    settle(stack)
    t_fault = stack.signal_vllm(signal.SIGSTOP)
    try:
        page = eventually(lambda: stack.event("VLLMDown", "firing", t_fault), 300)
        time.sleep(max(0.0, t_fault + outage_s - time.time()))
    finally:
        os.killpg(stack.vllm_group, signal.SIGCONT)
    t_back = time.time()
    resolved = eventually(lambda: stack.event("VLLMDown", "resolved", t_back - 0.5), 300)
    slo_paged = stack.event("SLOErrorBudgetBurn", "firing", t_fault) is not None
    return page["received_at"] - t_fault, resolved["received_at"] - t_back, slo_paged


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
    return float(seconds(next(a.for_ for a in spec.DEFAULT.alerts if a.name == name)))


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
    ap.add_argument("--intervals", choices=("shipped", "fast"), default="shipped")
    ap.add_argument("--outage-s", type=float, default=150.0, help="how long the total outage lasts")
    args = ap.parse_args()
    fast = args.intervals == "fast"
    intervals = FAST_INTERVALS if fast else Intervals()
    stack = Stack(Path(tempfile.mkdtemp(prefix="inferwatch-alert-bench-")), fast)
    try:
        kills = [kill_cycle(stack) for _ in range(args.runs)]
        outages = [outage_cycle(stack, args.outage_s) for _ in range(args.runs)]
        drift = [drift_cycle(stack, i) for i in range(args.runs)] if fast else []
    finally:
        stack.close()

    def stats(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} s ({min(xs):.1f}–{max(xs):.1f})"

    label = (f"{intervals.scrape} scrape and evaluation, page group_wait {intervals.page.group_wait}"
             + (f", for ≤ {FOR_CAP}" if fast else ", the rules' own for"))
    target, _worst, resolve = computed("VLLMDown", intervals, "page", FOR_CAP if fast else None)
    print(f"\n#### Fault to page, recovery to resolved: {args.intervals} intervals ({label}); "
          f"median of {args.runs} runs (min–max)\n")
    print("| fault | alert → receiver | fault → received | target | recovery → resolved | worst case computed |")
    print("|---|---|---|---|---|---|")
    print(f"| vLLM SIGKILL (supervisor restarts it) | VLLMDown → pager | {stats([k[0] for k in kills])} | "
          f"{target:.0f} s | {stats([k[1] for k in kills])} | {resolve:.0f} s |")
    print(f"| total outage ({args.outage_s:.0f} s, vLLM frozen) | VLLMDown → pager | {stats([o[0] for o in outages])} | "
          f"{TARGET_OUTAGE_PAGE_S} s | {stats([o[1] for o in outages])} | {resolve:.0f} s |")
    if drift:
        t, _, r = computed("DriftDetected", intervals, "ticket", FOR_CAP)
        print(f"| drift injected | DriftDetected → ticket | {stats([d[0] for d in drift])} | {t:.0f} s | "
              f"{stats([d[1] for d in drift])} | {r:.0f} s |")
    print(f"\nSLO pages that reached the pager during the outages (inhibited, must be 0): "
          f"{sum(o[2] for o in outages)}")


if __name__ == "__main__":
    main()
