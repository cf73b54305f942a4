"""Trying to lose a page, or send one twice, with `inferwatch up --ha`.

One stack (the tiny model on the CPU, `--ha --fast-alerting`, the rules' `for` capped at 15 s
as in tests/integration/test_up.py). Per scenario: something is done to the monitoring, vLLM
is SIGKILLed (the supervisor restarts it), and the pager's VLLMDown notifications are counted
until the incident has resolved and a further 20 s (a peer timeout and more) have passed. A
paused process (SIGSTOP) holds its connections and answers nothing, unlike a killed one.

| scenario | done before the fault | done after the page |
| --- | --- | --- |
| both halves | nothing | nothing |
| first Alertmanager killed, unnoticed | SIGKILL, 2 s before | the supervisor restarts it |
| first Alertmanager paused | SIGSTOP, 2 s before | SIGCONT |
| first Prometheus paused | SIGSTOP, 2 s before | SIGCONT |
| both Alertmanagers restarted | nothing | SIGKILL both; the supervisor restarts them |

Reported: the notifications in the order they came, and seconds from the kill to the page.
``--shipped``: the shipped intervals (10 s scrapes and evaluations, 30 s page group wait, 1 m
group interval) instead of ``--fast-alerting``'s, to tell what the fast ones cause.

    python bench/ha_paging.py [--shipped]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import requests  # noqa: E402

from inferwatch.alerts.generate import cap_for, rule_files, write  # noqa: E402
from inferwatch.local_stack import HA_PORT_OFFSET  # noqa: E402
from inferwatch.serving.tiny_model import build_tiny_model, default_cache_dir  # noqa: E402
from tests.support.local_stack import Stack, local_stack  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

PAGE_WITHIN_S = 120


def pid_on(port: int) -> int:
    return next(c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid)


def signal_on(port: int, sig: signal.Signals) -> None:
    os.kill(pid_on(port), sig)


def pages(stack: Stack) -> list[dict]:
    return stack.events(receiver="pager", alertname="VLLMDown")


def served_a_minute(stack: Stack) -> bool:
    expr = 'max_over_time(up{job="vllm"}[15m] offset 1m) == 1'
    ok = []
    for offset in (0, HA_PORT_OFFSET):
        url = f"http://127.0.0.1:{stack.ports['prometheus'] + offset}/api/v1/query"
        ok.append(bool(requests.get(url, params={"query": expr}, timeout=5).json()["data"]["result"]))
    return all(ok)


def scenario(stack: Stack, name: str, before, after) -> tuple[str, str, float | None]:
    eventually(lambda: served_a_minute(stack), timeout_s=180, interval_s=1)
    seen = len(pages(stack))
    before()
    time.sleep(2)
    killed_at = time.time()
    os.killpg(os.getpgid(pid_on(stack.ports["vllm"])), signal.SIGKILL)
    try:
        first = eventually(lambda: pages(stack)[seen:], timeout_s=PAGE_WITHIN_S, interval_s=0.2)[0]
    except AssertionError:  # no page: say so, and let the incident end before the next scenario
        after()
        eventually(lambda: not stack.firing_in_prometheus("VLLMDown"), timeout_s=360, interval_s=1)
        print(f"  {name}: no page within {PAGE_WITHIN_S} s", file=sys.stderr)
        return name, f"none within {PAGE_WITHIN_S} s", None
    after()
    eventually(lambda: any(p["status"] == "resolved" for p in pages(stack)[seen:]), timeout_s=360, interval_s=1)
    time.sleep(20)
    sequence = ", ".join(p["status"] for p in pages(stack)[seen:])
    latency = first["received_at"] - killed_at if first["status"] == "firing" else None
    print(f"  {name}: {sequence}; page after {latency}", file=sys.stderr)
    return name, sequence, latency


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shipped", action="store_true", help="the shipped intervals, not --fast-alerting's")
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="inferwatch-ha-"))
    rules = run_dir / "rules"
    write(cap_for(rule_files(), "15s"), rules)
    with local_stack(build_tiny_model(default_cache_dir()), run_dir, "--rules-dir", str(rules), "--ha",
                     fast=not args.shipped) as stack:
        stack.reader.until("Ctrl-C stops everything", 300)
        am, prom = stack.ports["alertmanager"], stack.ports["prometheus"]
        am_b = am + HA_PORT_OFFSET
        supervisor = stack.proc.pid
        nothing = lambda: None  # noqa: E731

        def both_ams_killed() -> None:
            signal_on(am, signal.SIGKILL)
            signal_on(am_b, signal.SIGKILL)

        def kill_unnoticed() -> None:
            os.kill(supervisor, signal.SIGSTOP)  # no restart before the fault
            signal_on(am, signal.SIGKILL)

        paused: list[int] = []

        def pause(port: int):
            def do() -> None:
                paused.append(pid_on(port))
                os.kill(paused[-1], signal.SIGSTOP)
            return do

        def resume() -> None:
            os.kill(paused.pop(), signal.SIGCONT)

        rows = [
            scenario(stack, "both halves", nothing, nothing),
            scenario(stack, "first Alertmanager killed, unnoticed", kill_unnoticed,
                     lambda: os.kill(supervisor, signal.SIGCONT)),
            scenario(stack, "first Alertmanager paused", pause(am), resume),
            scenario(stack, "first Prometheus paused", pause(prom), resume),
            scenario(stack, "both Alertmanagers restarted", nothing, both_ams_killed),
        ]
    mode = "the shipped intervals" if args.shipped else "--fast-alerting"
    print(f"\n#### HA paging under faults (`inferwatch up --ha`, {mode}), vLLM SIGKILLed\n")
    print("| scenario | notifications, in order | page after the kill |")
    print("|---|---|---|")
    for name, sequence, latency in rows:
        print(f"| {name} | {sequence} | {'—' if latency is None else f'{latency:.1f} s'} |")


if __name__ == "__main__":
    main()
