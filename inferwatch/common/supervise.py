"""Child processes of the local stack: start, wait until healthy, stop the whole group.

Each child runs in its own session (process group), so stopping it also stops what it
started itself (vLLM's engine core and workers), and Ctrl-C in the terminal reaches only
the supervisor, which then stops the children in order.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Counter, Gauge


class StartupError(RuntimeError):
    """A child did not become healthy; the message says why and where its log is."""


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path | None, env: Mapping[str, str] | None = None,
                 health_url: str | None = None, key: str | None = None,
                 warm_up: Callable[[], None] | None = None) -> None:
        """``warm_up``: run once healthy, before anyone else's request (a failure there is a
        failed start)."""
        self.name = name
        self.warm_up = warm_up
        self.key = key or name.split()[0].lower()  # the `child` label of the supervisor's metrics
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.health_url = health_url
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Output goes to ``log_path``, or, when that is None, to this process's own stdout and
        stderr (in a container, where `docker logs` is the log)."""
        if self.log_path is None:
            self._spawn(None)
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._spawn(log)

    def _spawn(self, log: IO[bytes] | None) -> None:
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT if log else None,
                                         stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
                                         preexec_fn=die_with_parent)
        except OSError as exc:
            raise StartupError(f"cannot run {self.name}: {exc}. Is {self.argv[0]} installed? "
                               "`make install` installs what the stack needs.") from None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5,
                     cancelled: Callable[[], bool] = lambda: False) -> float | None:
        """Poll ``health_url`` until it answers 200; return the seconds it took.

        Returns None if ``cancelled()`` turns true first (Ctrl-C during a slow vLLM start).
        """
        assert self.health_url is not None, f"{self.name} has no health URL"
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if cancelled():
                return None
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StartupError(f"{self.name} exited with code {code} before it became healthy.\n"
                                   f"{self.log_tail()}")
            if http_ok(self.health_url):
                if self.warm_up is not None:
                    try:
                        self.warm_up()
                    except OSError as exc:
                        raise StartupError(f"{self.name} became healthy, then failed its warm-up: {exc}.\n"
                                           f"{self.log_tail()}") from None
                return time.monotonic() - started
            time.sleep(poll_s)
        raise StartupError(f"{self.name} was not healthy at {self.health_url} after {timeout_s:.0f}s "
                           f"(raise the timeout if the machine is slow).\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the log, headed by where it is, for error messages."""
        if self.log_path is None:
            return "Its output is above."
        try:
            return f"Last lines of {self.log_path}:\n" + "\n".join(
                self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log_path})"

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                if not _group_alive(self.proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL the whole group at once (for fault tests: the process dies, it does not stop)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


def die_with_parent() -> None:
    """In a child (before exec, or a forked gateway worker): SIGTERM me if the supervisor dies, even by SIGKILL, so a
    crashed `inferwatch up` never leaves vLLM holding its port and memory (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


PR_SET_PDEATHSIG = 1


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def port_taken(url: str) -> bool:
    """Whether something already listens where ``url`` points (a second stack, say): its
    health check would answer for it, and the child would only fail to bind later."""
    parts = urllib.parse.urlsplit(url)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((parts.hostname or "127.0.0.1", parts.port or 80))
        except OSError:
            return True
    return False


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a crashed child after a delay that doubles per crash, as systemd's
    ``Restart=on-failure`` with ``RestartSec`` steps would; a child that stayed up for
    ``stable_s`` starts over at ``initial_s``."""

    initial_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0

    def next_delay(self, previous: float | None, uptime_s: float) -> float:
        if previous is None or uptime_s >= self.stable_s:
            return self.initial_s
        return min(previous * 2, self.max_s)


@dataclass
class _Watched:
    proc: ManagedProcess
    started_at: float
    delay: float | None = None  # the last backoff used
    restart_at: float | None = None  # set while a crashed child waits for its restart
    awaiting_health: bool = False


class Supervisor:
    """Keeps started children running: a child that exits is restarted with backoff, each
    restart is said on the console and counted in ``inferwatch_supervisor_restarts_total``
    so a crash loop pages. The monitoring side keeps running while a child is down."""

    def __init__(self, registry: CollectorRegistry, policy: RestartPolicy = RestartPolicy(),
                 say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.say = say
        self.clock = clock
        self.watched: list[_Watched] = []
        self.restarts = Counter("inferwatch_supervisor_restarts", "Restarts of a child after it exited.",
                                ["child"], registry=registry)
        self.up = Gauge("inferwatch_supervisor_child_up", "1 while the child process is running.", ["child"],
                        registry=registry)

    def adopt(self, proc: ManagedProcess) -> None:
        """Watch a child that was started (and found healthy) already."""
        self.watched.append(_Watched(proc, self.clock()))
        self.restarts.labels(proc.key)
        self.up.labels(proc.key).set(1)

    def poll(self) -> None:
        """One pass: notice exits, restart children whose backoff is over, report health."""
        now = self.clock()
        for w in self.watched:
            proc = w.proc
            if w.restart_at is None and not proc.alive():
                code = proc.proc.returncode if proc.proc else None
                w.delay = self.policy.next_delay(w.delay, now - w.started_at)
                w.restart_at = now + w.delay
                self.up.labels(proc.key).set(0)
                self.say(f"{proc.name} exited with code {code}; restarting in {w.delay:.0f}s. "
                         f"Last log lines:\n{proc.log_tail(5)}")
            elif w.restart_at is not None and now >= w.restart_at:
                try:
                    proc.start()
                except StartupError as exc:  # its binary or log folder went away: keep trying
                    w.delay = self.policy.next_delay(w.delay, 0.0)
                    w.restart_at = now + w.delay
                    self.say(f"{exc} Retrying in {w.delay:.0f}s.")
                    continue
                w.restart_at, w.started_at, w.awaiting_health = None, now, proc.health_url is not None
                self.restarts.labels(proc.key).inc()
                self.up.labels(proc.key).set(1)
                self.say(f"{proc.name} restarted (pid {proc.pid})")
            elif w.awaiting_health and proc.health_url is not None and proc.alive() and http_ok(proc.health_url, timeout_s=0.5):
                w.awaiting_health = False
                self.say(f"{proc.name} healthy again after {now - w.started_at:.1f}s")
                if proc.warm_up is not None:
                    try:
                        proc.warm_up()
                    except OSError as exc:  # it dies, and the next pass restarts it; or a client finds it broken
                        self.say(f"{proc.name} failed its warm-up: {exc}")
