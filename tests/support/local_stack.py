"""`inferwatch up` (what `make up` runs) as a test fixture: every part on a free port, with
``--fast-alerting`` (1 s scrape and evaluation, 1-2 s Alertmanager waits), the suite's vLLM
arguments, and its output read on a thread. The stack is stopped with Ctrl-C at the end,
killed if it does not stop."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from inferwatch.local_stack import HA_PORT_OFFSET
from tests.conftest import TINY_MODEL_NAME, VLLM_TEST_ARGS, VLLM_TEST_ENV
from tests.support.sockets import free_ports

PARTS = ("vllm", "gateway", "exporter", "drift", "prometheus", "alertmanager", "pager", "supervisor", "canary")
MONITORING_PARTS = ("prometheus", "alertmanager", "pager", "supervisor")


class OutputReader:
    """Collects a child's stdout on a thread (select() on a buffered pipe misses lines)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.text = ""
        threading.Thread(target=lambda: [self.lines.put(line) for line in proc.stdout], daemon=True).start()

    def until(self, marker: str, timeout_s: float) -> str:
        """Wait for ``marker``; fail at once, with everything printed, if the process exits."""
        deadline = time.monotonic() + timeout_s
        while marker not in self.text:
            try:
                self.text += self.lines.get(timeout=0.5)
            except queue.Empty:
                exited = self.proc.poll() is not None
                if exited or time.monotonic() > deadline:
                    why = f"exited with {self.proc.returncode}" if exited else f"not within {timeout_s}s"
                    raise AssertionError(f"'{marker}' not printed ({why}); output:\n{self.text}") from None
        return self.text


@dataclass
class Stack:
    proc: subprocess.Popen
    reader: OutputReader
    ports: dict[str, int]
    run_dir: Path

    def url(self, what: str) -> str:
        return f"http://127.0.0.1:{self.ports[what]}"

    def url_flags(self) -> list[str]:
        """The `inferwatch demo` flags that point it at this stack."""
        return [arg for what in ("gateway", "vllm", "prometheus", "pager", "drift")
                for arg in (f"--{what}-url", self.url(what))]

    def events(self, **query: str) -> list[dict]:
        return requests.get(f"{self.url('pager')}/events", params=query, timeout=5).json()["events"]

    def firing_in_prometheus(self, alertname: str) -> list[dict]:
        alerts = requests.get(f"{self.url('prometheus')}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]

    def chat(self, n: int = 1) -> list[int]:
        """n small requests through the gateway; their HTTP status codes."""
        codes = []
        for _ in range(n):
            r = requests.post(f"{self.url('gateway')}/v1/chat/completions", timeout=30,
                              json={"model": TINY_MODEL_NAME, "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "hi"}]})
            codes.append(r.status_code)
        return codes


def port_open(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
        return True
    except requests.ConnectionError:
        return False


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stack_ports(parts: tuple[str, ...] = PARTS) -> dict[str, int]:
    """A free port per part, where the second Prometheus and Alertmanager of ``--ha``
    (HA_PORT_OFFSET above) and the Alertmanagers' gossip ports (one above) are free too."""
    while True:
        ports = dict(zip(parts, free_ports(len(parts))))
        extra = [ports["prometheus"] + HA_PORT_OFFSET, ports["alertmanager"] + HA_PORT_OFFSET]
        extra += [p + 1 for p in (ports["alertmanager"], extra[1])]
        if len(set(extra) | set(ports.values())) == len(extra) + len(ports) and all(map(_free, extra)):
            return ports


def _up(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inferwatch", "up", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **VLLM_TEST_ENV, "INFERWATCH_VLLM_ARGS": shlex.join(VLLM_TEST_ARGS)})


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:  # a failed test: still stop the stack, children included
        proc.send_signal(signal.SIGCONT)  # a test may have paused it
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def monitoring_stack(of: Stack, run_dir: Path, *flags: str) -> Iterator[Stack]:
    """`inferwatch up --monitoring-only` watching ``of``'s vLLM and gateway: Prometheus,
    Alertmanager and a pager of its own."""
    ports = stack_ports(MONITORING_PARTS)
    proc = _up(["--monitoring-only", "--name", TINY_MODEL_NAME, "--run-dir", str(run_dir), "--fast-alerting",
                "--vllm-port", str(of.ports["vllm"]), "--gateway-port", str(of.ports["gateway"]),
                "--exporter-port", "0", "--drift-port", "0", "--canary-port", "0", *flags,
                *(arg for name in MONITORING_PARTS for arg in (f"--{name}-port", str(ports[name])))])
    try:
        yield Stack(proc, OutputReader(proc), ports, run_dir)
    finally:
        _stop(proc)


@contextmanager
def local_stack(tiny_model: Path, run_dir: Path, *flags: str, fast: bool = True) -> Iterator[Stack]:
    """``fast`` False: the shipped intervals (10 s scrapes, Alertmanager's 30 s page group wait)."""
    ports = stack_ports()
    proc = _up(["--model", str(tiny_model), "--name", TINY_MODEL_NAME, "--dtype", "bfloat16", "--run-dir", str(run_dir),
                *(["--fast-alerting"] if fast else []), *flags,
                *(arg for name in PARTS for arg in (f"--{name}-port", str(ports[name])))])
    try:
        yield Stack(proc, OutputReader(proc), ports, run_dir)
    finally:
        _stop(proc)
