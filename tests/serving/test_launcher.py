"""The vLLM launcher and process supervision, without starting vLLM itself."""

import os
import subprocess
import sys

import pytest

from inferwatch.common.supervise import ManagedProcess, StartupError
from inferwatch.serving.vllm_launcher import VLLMConfig, command, environment
from tests.support.sockets import free_port
from tests.support.waiting import eventually


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_command_uses_the_module_entry_point_and_passes_tracing():
    cfg = VLLMConfig("/models/tiny", "tiny", port=8123, dtype="bfloat16",
                     otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces", extra_args=("--seed", "1"))
    argv = command(cfg)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--model"] == "/models/tiny" and pairs["--served-model-name"] == "tiny"
    assert pairs["--port"] == "8123" and pairs["--dtype"] == "bfloat16"
    assert pairs["--otlp-traces-endpoint"] == "http://127.0.0.1:4318/v1/traces"
    assert argv[-2:] == ["--seed", "1"]
    assert "--enable-prompt-tokens-details" in argv  # cached prompt tokens in the usage, per tenant
    assert "--disable-log-requests" not in argv  # current vLLM refuses to start with it


def test_aliases_follow_the_served_name_vllm_labels_its_metrics_with():
    argv = command(VLLMConfig("/models/tiny", "tiny", aliases=("tiny-twin", "tiny-b")))
    at = argv.index("--served-model-name")
    assert argv[at + 1:at + 4] == ["tiny", "tiny-twin", "tiny-b"] and argv[at + 4] == "--host"


def test_environment_sets_otlp_protocol_and_keeps_operator_choices():
    cfg = VLLMConfig("m", "m", otlp_traces_endpoint="http://x:4318/v1/traces")
    env = environment(cfg, {"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/bin"})
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in environment(VLLMConfig("m", "m"), {})


def test_exit_before_healthy_reports_the_log(tmp_path):
    proc = ManagedProcess("crasher", [sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(3)"],
                          log_path=tmp_path / "c.log", health_url=f"http://127.0.0.1:{free_port()}/health")
    proc.start()
    with pytest.raises(StartupError) as info:
        proc.wait_healthy(30, poll_s=0.05)
    assert "exited with code 3" in str(info.value) and "CUDA out of memory" in str(info.value)


def test_timeout_message_names_url_and_timeout(tmp_path):
    port = free_port()
    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          log_path=tmp_path / "s.log", health_url=f"http://127.0.0.1:{port}/health")
    proc.start()
    try:
        with pytest.raises(StartupError) as info:
            proc.wait_healthy(1.0, poll_s=0.1)
        assert f"127.0.0.1:{port}/health" in str(info.value) and "after 1s" in str(info.value)
    finally:
        proc.stop()


def test_healthy_child_and_stop_takes_the_whole_group(tmp_path):
    port = free_port()
    pidfile = tmp_path / "grandchild.pid"
    script = (
        "import http.server, subprocess, sys\n"
        f"g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    proc = ManagedProcess("server", [sys.executable, "-c", script], log_path=tmp_path / "h.log",
                          health_url=f"http://127.0.0.1:{port}/")
    proc.start()
    assert proc.wait_healthy(30, poll_s=0.05) is not None
    grandchild = int(pidfile.read_text())
    proc.stop(grace_s=5)
    assert not proc.alive()
    eventually(lambda: gone(grandchild), timeout_s=5)  # the child's own child does not survive stop()


def test_children_die_with_their_supervisor(tmp_path):
    """A supervisor killed with SIGKILL (no chance to clean up) still takes its child along."""
    pidfile = tmp_path / "child.pid"
    supervisor = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from inferwatch.common.supervise import ManagedProcess\n"
        "p = ManagedProcess('c', [sys.executable, '-c', 'import time; time.sleep(300)'],\n"
        f"                   log_path=Path({str(tmp_path / 'c.log')!r}))\n"
        "p.start()\n"
        f"Path({str(pidfile)!r}).write_text(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", supervisor])
    eventually(pidfile.exists, timeout_s=20)
    child = int(pidfile.read_text())
    parent.kill()
    parent.wait()
    try:
        eventually(lambda: gone(child), timeout_s=10)
    except AssertionError:
        os.kill(child, 9)
        pytest.fail("the child outlived its SIGKILLed supervisor")


def test_wait_can_be_cancelled(tmp_path):
    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          log_path=tmp_path / "s.log", health_url=f"http://127.0.0.1:{free_port()}/health")
    proc.start()
    try:
        assert proc.wait_healthy(60, poll_s=0.05, cancelled=lambda: True) is None
    finally:
        proc.stop()


class _Engine:
    """/health 200; /v1/completions answers ``status`` and keeps what it was sent."""

    def __init__(self, status: int) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        engine = self
        self.sent: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()

            def do_POST(self):
                engine.sent.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("status", [200, 500])
def test_a_started_vllm_is_warmed_up_before_it_counts_as_started(status):
    """vLLM's CPU build lost its engine to a first request of one or two prompt tokens: one
    longer completion goes first; a failed one is a failed start that says so."""
    from inferwatch.serving.vllm_launcher import WARM_UP_PROMPT, vllm_process

    engine = _Engine(status)
    try:
        cfg = VLLMConfig("/models/tiny", "tiny", port=engine.port)
        proc = vllm_process(cfg, None)
        proc.argv = [sys.executable, "-c", "import time; time.sleep(30)"]  # the engine above stands in
        proc.start()
        try:
            if status == 200:
                assert proc.wait_healthy(10) is not None
            else:
                with pytest.raises(StartupError, match="failed its warm-up"):
                    proc.wait_healthy(10)
        finally:
            proc.stop()
        assert engine.sent == [{"model": "tiny", "prompt": WARM_UP_PROMPT, "max_tokens": 1}]
    finally:
        engine.server.shutdown()
