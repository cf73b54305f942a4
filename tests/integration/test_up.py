"""`inferwatch up` (what `make up` runs): real vLLM + gateway, URLs printed, Ctrl-C stops all."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest
import requests

from tests.conftest import TINY_MODEL_NAME
from tests.support.servers import eventually, free_ports

pytestmark = pytest.mark.vllm


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


def port_open(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
        return True
    except requests.ConnectionError:
        return False


def test_up_serves_through_the_gateway_and_ctrl_c_stops_everything(tiny_model, tmp_path):
    vllm_port, gw_port, exp_port, drift_port = free_ports(4)
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch", "up", "--model", str(tiny_model), "--name", TINY_MODEL_NAME,
         "--vllm-port", str(vllm_port), "--gateway-port", str(gw_port), "--exporter-port", str(exp_port), "--drift-port", str(drift_port),
         "--dtype", "bfloat16",
         "--run-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        reader = OutputReader(proc)
        out = reader.until("Ctrl-C stops everything", 300)
        assert f"http://127.0.0.1:{gw_port}/v1" in out
        assert f"http://127.0.0.1:{gw_port}/metrics" in out and f"http://127.0.0.1:{vllm_port}/metrics" in out

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw_port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert reply.usage.completion_tokens == 4
        assert "inferwatch_gateway_requests_total" in requests.get(f"http://127.0.0.1:{gw_port}/metrics").text
        # no GPU here: the exporter runs and says so in its metrics
        assert f"http://127.0.0.1:{exp_port}/metrics" in out
        assert "inferwatch_nvml_up 0.0" in requests.get(f"http://127.0.0.1:{exp_port}/metrics").text

        # the request's feature record reaches the drift service that up started
        assert f"http://127.0.0.1:{drift_port}/report" in out
        segs = eventually(lambda: requests.get(f"http://127.0.0.1:{drift_port}/v1/drift").json()["segments"])
        assert [(s["model"], s["window_records"]) for s in segs] == [(TINY_MODEL_NAME, 1)]

        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        rest = reader.until("stopping vLLM", 5)
        assert proc.returncode == 0, rest
        assert not any(port_open(p) for p in (gw_port, vllm_port, exp_port, drift_port))
        assert (tmp_path / "vllm.log").stat().st_size > 0 and (tmp_path / "gateway.log").exists()
    finally:
        if proc.poll() is None:  # a failed assertion: still stop the stack, children included
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
