"""The supervisor keeps children running: restart with backoff, counted, said on the console."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from inferwatch.common.supervise import ManagedProcess, RestartPolicy, Supervisor
from tests.support.clock import Clock
from tests.support.waiting import eventually


def test_backoff_doubles_up_to_the_cap_and_resets_after_a_stable_run():
    policy = RestartPolicy(initial_s=1, max_s=8, stable_s=60)
    delays, previous = [], None
    for _ in range(6):
        previous = policy.next_delay(previous, uptime_s=5)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 8, 8]
    assert policy.next_delay(8, uptime_s=61) == 1


def test_a_child_that_exits_is_restarted_after_its_backoff_and_counted(tmp_path):
    registry, clock, said = CollectorRegistry(), Clock(), []
    supervisor = Supervisor(registry, RestartPolicy(initial_s=2, max_s=30, stable_s=60), say=said.append, clock=clock)
    child = ManagedProcess("flaky thing", [sys.executable, "-c", "import time; time.sleep(0.2)"],
                           log_path=tmp_path / "flaky.log", key="flaky")
    child.start()
    supervisor.adopt(child)
    first_pid = child.pid
    assert registry.get_sample_value("inferwatch_supervisor_child_up", {"child": "flaky"}) == 1

    eventually(lambda: not child.alive(), timeout_s=10)
    supervisor.poll()
    assert "flaky thing exited with code 0; restarting in 2s" in said[-1]
    assert registry.get_sample_value("inferwatch_supervisor_child_up", {"child": "flaky"}) == 0

    clock.now += 1.9
    supervisor.poll()  # backoff not over: still down
    assert registry.get_sample_value("inferwatch_supervisor_restarts_total", {"child": "flaky"}) == 0
    clock.now += 0.2
    supervisor.poll()
    assert child.alive() and child.pid != first_pid
    assert said[-1].startswith("flaky thing restarted")
    assert registry.get_sample_value("inferwatch_supervisor_restarts_total", {"child": "flaky"}) == 1

    # it crashes again soon after: the next delay doubles
    eventually(lambda: not child.alive(), timeout_s=10)
    clock.now += 1
    supervisor.poll()
    assert "restarting in 4s" in said[-1]
    child.stop()


def test_other_children_keep_running_while_one_is_down(tmp_path):
    registry, clock = CollectorRegistry(), Clock()
    supervisor = Supervisor(registry, say=lambda _: None, clock=clock)
    steady = ManagedProcess("steady", [sys.executable, "-c", "import time; time.sleep(60)"],
                            log_path=tmp_path / "s.log")
    crasher = ManagedProcess("crasher", [sys.executable, "-c", "raise SystemExit(3)"], log_path=tmp_path / "c.log")
    for p in (steady, crasher):
        p.start()
        supervisor.adopt(p)
    eventually(lambda: not crasher.alive(), timeout_s=10)
    supervisor.poll()
    assert steady.alive()
    assert registry.get_sample_value("inferwatch_supervisor_child_up", {"child": "steady"}) == 1
    assert registry.get_sample_value("inferwatch_supervisor_child_up", {"child": "crasher"}) == 0
    steady.stop()


def test_a_restart_that_cannot_exec_is_retried_not_fatal(tmp_path):
    registry, clock, said = CollectorRegistry(), Clock(), []
    supervisor = Supervisor(registry, RestartPolicy(initial_s=1, max_s=8), say=said.append, clock=clock)
    child = ManagedProcess("vanishing", [sys.executable, "-c", "pass"], log_path=tmp_path / "v.log")
    child.start()
    supervisor.adopt(child)
    eventually(lambda: not child.alive(), timeout_s=10)
    supervisor.poll()
    child.argv = [str(tmp_path / "no-such-binary")]
    clock.now += 1
    supervisor.poll()
    assert "cannot run vanishing" in said[-1] and "Retrying in 2s" in said[-1]
    assert registry.get_sample_value("inferwatch_supervisor_restarts_total", {"child": "vanishing"}) == 0


def test_a_child_without_a_log_file_writes_to_our_own_output():
    """`inferwatch vllm --log-file -` in a container: vLLM's lines must reach `docker logs`,
    and a failed start must say where they are."""
    script = ("import sys; from inferwatch.common.supervise import ManagedProcess, StartupError\n"
              "p = ManagedProcess('child', [sys.executable, '-c', "
              "'import sys; print(\"out-marker\"); print(\"err-marker\", file=sys.stderr); sys.exit(3)'], "
              "log_path=None, health_url='http://127.0.0.1:9/health')\n"
              "p.start()\n"
              "try:\n    p.wait_healthy(30)\nexcept StartupError as e:\n    print('ERROR', e)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert "out-marker" in result.stdout and "err-marker" in result.stderr
    assert "exited with code 3 before it became healthy" in result.stdout
    assert "Its output is above." in result.stdout
