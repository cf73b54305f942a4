"""``inferwatch gateway --workers N``: N gateway processes on one port, one core each.

A gateway process is one event loop on one core (the GIL), so a pod with more cores runs
more processes. The parent forks them before anything has started a thread or an event
loop (each worker builds its own app, its own Redis replica id, its own exporters) and
then only waits: a worker that crashes or is killed is started again; one that exits with 2
or 3 (a file it cannot read, a port it cannot bind: it would fail the same way again) stops
the others, and the parent exits with its code.

Each worker binds the port itself with SO_REUSEPORT: the kernel spreads new connections over
the workers' listening sockets, and a dead worker's socket leaves the group with it, so no
connection waits behind a process that will not accept it. The parent keeps one loopback
socket per worker for serving/worker_metrics.py, bound before the first fork so that a
restarted worker answers its siblings on the same port.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.common.supervise import die_with_parent

log = logging.getLogger(__name__)

# Exit codes of a worker that cannot start (cli._fail, uvicorn's startup failure).
CANNOT_START = (2, 3)
# A worker that dies this young is started again only after RESTART_DELAY_S, so that one
# that crashes at once does not fork in a loop.
YOUNG_S = 5.0
RESTART_DELAY_S = 1.0


@dataclass(frozen=True)
class WorkerSlot:
    """What a worker is told: its index, its loopback socket and every worker's port there."""

    index: int
    sock: socket.socket
    ports: tuple[int, ...]


# Runs a worker to its end; returns its exit code.
Serve = Callable[[WorkerSlot], int]


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other workers' sockets share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def check_port(host: str, port: int) -> None:
    """Raise OSError (e.g. address in use by another program) before any worker starts."""
    reuse_port_socket(host, port).close()


def run(count: int, serve: Serve) -> int:
    """Fork ``count`` workers, keep them running until SIGTERM or SIGINT; the exit code."""
    loopback = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = tuple(s.getsockname()[1] for s in loopback)
    children: dict[int, tuple[int, float]] = {}  # pid -> (index, when forked)
    stopping = False

    def start(index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(index, parent, loopback, ports, serve)
        children[pid] = (index, time.monotonic())

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            _signal(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(count):
        start(i)
    code = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        index, forked = children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if stopping:
            continue
        if exit_code in CANNOT_START:
            log.error("gateway worker %d cannot start (exit %d); stopping the others", index, exit_code)
            code = exit_code
            stop(signal.SIGTERM, None)
            continue
        log.warning("gateway worker %d (pid %d) exited with %d; starting it again", index, pid, exit_code)
        if time.monotonic() - forked < YOUNG_S:
            time.sleep(RESTART_DELAY_S)
        start(index)
    for s in loopback:
        s.close()
    return code


def _child(index: int, parent: int, loopback: list[socket.socket], ports: tuple[int, ...], serve: Serve) -> None:
    """In the forked worker: never returns into the parent's loop."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgid(0, 0)  # Ctrl-C reaches the parent alone, which stops each worker once
        die_with_parent()
        if os.getppid() != parent:  # it died before prctl
            os._exit(1)
        for i, s in enumerate(loopback):
            if i != index:
                s.close()
        code = serve(WorkerSlot(index, loopback[index], ports))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
