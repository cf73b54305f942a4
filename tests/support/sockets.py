"""Loopback sockets for tests: free ports, a port held busy, and a raw HTTP client for what
an HTTP library will not do (pipeline, send half a request, hang up with a reset)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so the OS cannot hand one out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextmanager
def busy_port() -> Iterator[int]:
    """A loopback port something already listens on, for as long as the block runs."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def post_request(path: str, body: bytes, version: bytes = b"1.1", extra_headers: bytes = b"") -> bytes:
    """A JSON POST as bytes on the wire; ``extra_headers`` are whole ``Name: value\\r\\n`` lines."""
    return (b"POST %s HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), version, len(body), extra_headers, body))


def read_until(sock: socket.socket, marker: bytes, got: bytes = b"", times: int = 1) -> bytes:
    """Everything read until ``marker`` has arrived ``times`` times (``got``: what was read before)."""
    while got.count(marker) < times:
        data = sock.recv(65536)
        if not data:
            raise AssertionError(f"connection closed before {marker!r}; got {got[-300:]!r}")
        got += data
    return got


def read_to_close(sock: socket.socket) -> bytes:
    got = b""
    while data := sock.recv(65536):
        got += data
    return got


def reset(sock: socket.socket) -> None:
    """Hang up with a reset (SO_LINGER 0), like a killed browser tab: no orderly FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
