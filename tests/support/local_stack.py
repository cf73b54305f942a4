"""`inferwatch up` (what `make up` runs) as a test fixture: every part on a free port, with
``--fast-alerting`` (1 s scrape and evaluation, 1-2 s Alertmanager waits), the suite's vLLM
arguments, and its output read on a thread. The stack is stopped with Ctrl-C at the end,
killed if it does not stop."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.conftest import TINY_MODEL_NAME, VLLM_TEST_ARGS, VLLM_TEST_ENV
from tests.support.sockets import free_ports

PARTS = ("vllm", "gateway", "exporter", "drift", "prometheus", "alertmanager", "pager", "supervisor", "canary")


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


@contextmanager
def local_stack(tiny_model: Path, run_dir: Path, *flags: str) -> Iterator[Stack]:
    ports = dict(zip(PARTS, free_ports(len(PARTS))))
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch", "up", "--model", str(tiny_model), "--name", TINY_MODEL_NAME,
         "--dtype", "bfloat16", "--run-dir", str(run_dir), "--fast-alerting", *flags,
         *(arg for name in PARTS for arg in (f"--{name}-port", str(ports[name])))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **VLLM_TEST_ENV, "INFERWATCH_VLLM_ARGS": shlex.join(VLLM_TEST_ARGS)},
    )
    try:
        yield Stack(proc, OutputReader(proc), ports, run_dir)
    finally:
        if proc.poll() is None:  # a failed test: still stop the stack, children included
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
