"""Non-streaming clients that leave together (issue 27): what vLLM generates for them and
what the gateway records, through the gateway and to vLLM directly, in one run.

A burst is N leaving clients and M staying ones, sent back to back on raw sockets (so the
bench decides how a client goes: a normal close, or a reset through SO_LINGER 0, in turn).
Each asks for ``--max-tokens`` tokens with ``ignore_eos``; a leaving client hangs up
``--leave-after-s`` after sending (the k-th of them ``k/(N-1) * --leave-spread-s`` later), a
staying one reads its whole answer. Before hanging up, a leaving client peeks at its socket:
one whose answer had already come was answered, and its 2xx is right.

The truth is vLLM's own counters, read before and after each burst once the engine is idle:
how many leaving requests ran to ``max_tokens`` (``vllm:request_success_total`` with
``finished_reason="length"``, less the staying ones) and the tokens generated for them
(``vllm:generation_tokens_total`` less the staying answers' usage). The gateway's
``/metrics`` says what it recorded. Between the gateway and vLLM sits a tap (a byte relay in
this process) that stamps, per request, when vLLM's answer came and when the gateway closed
the upstream connection, on the clients' clock: how long after a client's close the gateway
cut its request, and which requests it read to the end although their client had left.

    python bench/disconnect_burst.py [--vllm-url http://127.0.0.1:8000] [--rounds 2]
    python bench/disconnect_burst.py --leave-after-s 0.005 --leave-spread-s 0.1 --staying 0 --leaving 12
    python bench/disconnect_burst.py --pad-bytes 80000   # bodies past the 64 KiB the server buffers

Without ``--vllm-url`` it starts vLLM (CPU build, the tiny model; ~50 s) and stops it after.
The gateway is ``python -m inferwatch gateway``, whichever inferwatch that imports. Loopback
only; every socket and wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import running  # noqa: E402

MODEL = "tiny-llama"
MARKER = re.compile(rb"burst-\d+-\d+")
SOCKET_TIMEOUT_S = 120.0  # a staying client's whole answer, on a loaded two-core machine
SETTLE_TIMEOUT_S = 120.0
MAX_CLIENTS = 64


@dataclass(frozen=True)
class Burst:
    leaving: int
    staying: int
    max_tokens: int
    leave_after_s: float
    leave_spread_s: float
    spacing_s: float  # between two clients' sends
    pad_bytes: int  # JSON whitespace after each body: a long prompt's size without its tokens


@dataclass
class Client:
    """One client of a burst, on the bench's ``time.monotonic()`` clock."""

    tag: str  # burst-<round>-<index>, in the prompt: the tap finds the request by it
    kind: str  # "fin", "rst" (leaving) or "stay"
    leave_after_s: float = 0.0
    sent: float = 0.0
    closed: float = 0.0  # leaving: when it hung up
    answered_first: bool = False  # leaving: its answer had come before it hung up
    status: int = 0  # staying: the answer's status
    completion_tokens: int = 0  # staying: vLLM's usage
    error: str = ""


@dataclass
class TapRecord:
    """What the tap saw of one request on its way from the gateway to vLLM."""

    answered: float = 0.0  # vLLM's answer began
    cut: float = 0.0  # the gateway closed the connection before vLLM's answer came


# -- the tap between the gateway and vLLM ---------------------------------------------------


class Tap:
    """A byte relay between the gateway and vLLM, on its own thread and event loop."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.records: dict[str, TapRecord] = {}
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Tap:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the tap did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.loop.create_server(lambda: _TapSide(self), "127.0.0.1", self.port))
        self._started.set()
        self.loop.run_forever()


class _TapSide(asyncio.Protocol):
    """The gateway's connection to the tap; vLLM's side is ``_TapUpstream``."""

    def __init__(self, tap: Tap) -> None:
        self.tap = tap
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.current: TapRecord | None = None  # the request on this connection now (keep-alive)
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            self.upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: _TapUpstream(self), "127.0.0.1", self.tap.upstream_port)
        except OSError:
            self.transport.close()
            return
        if self.gone:
            self.upstream.close()
            return
        for data in self.pending:
            self.upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        found = MARKER.search(data)
        if found is not None:
            self.current = self.tap.records.setdefault(found.group(0).decode(), TapRecord())
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def eof_received(self) -> bool:
        self._gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def _gone(self) -> None:
        if self.gone:
            return
        self.gone = True
        record = self.current
        if record is not None and not record.answered:
            record.cut = time.monotonic()
        if self.upstream is not None:
            self.upstream.close()

    def answer(self, data: bytes) -> None:
        if self.current is not None and not self.current.answered:
            self.current.answered = time.monotonic()
        self.transport.write(data)


class _TapUpstream(asyncio.Protocol):
    def __init__(self, side: _TapSide) -> None:
        self.side = side

    def data_received(self, data: bytes) -> None:
        self.side.answer(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.side.transport.close()


# -- the clients ---------------------------------------------------------------------------


def request_bytes(tag: str, burst: Burst) -> bytes:
    body = json.dumps({"model": MODEL, "max_tokens": burst.max_tokens, "ignore_eos": True, "temperature": 0.0,
                       "messages": [{"role": "user", "content": f"{tag} tell me about time to first token"}]})
    body += " " * burst.pad_bytes
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S)


def leave(url: str, client: Client, burst: Burst) -> None:
    """Send, wait, hang up: a normal close (FIN) or a reset (SO_LINGER 0).

    Closing a socket with unread data makes the kernel send a reset, so the client peeks
    rather than reads: an answer that came first is noted, not consumed."""
    sock = _connect(url)
    try:
        sock.sendall(request_bytes(client.tag, burst))
        client.sent = time.monotonic()
        time.sleep(max(0.0, client.sent + client.leave_after_s - time.monotonic()))
        sock.setblocking(False)  # a socket with a timeout would wait for the answer
        try:
            client.answered_first = bool(sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            client.answered_first = False
        if client.kind == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.closed = time.monotonic()
    finally:
        sock.close()


def stay(url: str, client: Client, burst: Burst) -> None:
    """Send and read the whole answer (the gateway and vLLM send it with a Content-Length)."""
    with _connect(url) as sock:
        sock.sendall(request_bytes(client.tag, burst))
        client.sent = time.monotonic()
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            if not chunk:
                client.error = "closed before the answer's head"
                return
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        client.status = int(head.split(b" ", 2)[1])
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        while len(body) < (int(length.group(1)) if length else 0):
            chunk = sock.recv(65536)
            if not chunk:
                client.error = "closed in the middle of the answer"
                return
            body += chunk
        try:
            client.completion_tokens = json.loads(body)["usage"]["completion_tokens"]
        except (ValueError, KeyError, TypeError):
            client.error = f"an answer without usage: {body[:120]!r}"


def clients_of(round_no: int, burst: Burst) -> list[Client]:
    """Staying clients spread evenly among the leaving ones; leaving ones alternate FIN and
    reset, the k-th leaving ``k/(N-1)`` of the spread after the first."""
    total, clients, k = burst.leaving + burst.staying, [], 0
    for i in range(total):
        tag = f"burst-{round_no:03d}-{i:03d}"
        if (i + 1) * burst.staying // total > i * burst.staying // total:
            clients.append(Client(tag, "stay"))
        else:
            after = burst.leave_after_s + burst.leave_spread_s * k / max(1, burst.leaving - 1)
            clients.append(Client(tag, "fin" if k % 2 == 0 else "rst", leave_after_s=after))
            k += 1
    return clients


def send_burst(url: str, clients: list[Client], burst: Burst) -> None:
    threads = []
    for client in clients:
        thread = threading.Thread(target=_run_client, args=(url, client, burst), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(burst.spacing_s)
    for thread in threads:
        thread.join(SOCKET_TIMEOUT_S + 10)


def _run_client(url: str, client: Client, burst: Burst) -> None:
    try:
        (stay if client.kind == "stay" else leave)(url, client, burst)
    except OSError as exc:
        client.error = f"{type(exc).__name__}: {exc}"


# -- the counters --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample named ``name`` whose labels include ``labels`` (the gateway's own
    modules are not imported: the bench measures whichever gateway ``python -m inferwatch`` runs)."""
    want = set(labels.items())
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and want <= set(s.labels.items()))


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


VLLM_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total")


def settled_vllm(url: str) -> str:
    """vLLM's exposition once nothing runs or waits and its counters stopped moving (it
    counts a moment after it answers)."""
    deadline, previous = time.monotonic() + SETTLE_TIMEOUT_S, None
    while True:
        text = get(f"{url}/metrics")
        current = tuple(metric_sum(text, name) for name in VLLM_COUNTERS)
        idle = metric_sum(text, "vllm:num_requests_running") + metric_sum(text, "vllm:num_requests_waiting") == 0
        if idle and current == previous:
            return text
        if time.monotonic() > deadline:
            raise RuntimeError("vLLM did not settle")
        previous = current
        time.sleep(0.3)


def settled_gateway(url: str) -> str:
    """The gateway's exposition once nothing is in flight (every request recorded)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        text = get(f"{url}/metrics")
        if metric_sum(text, "inferwatch_gateway_requests_in_flight") == 0 or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def delta(before: str, after: str, name: str, **labels: str) -> float:
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


@dataclass
class Row:
    path: str
    round_no: int
    clients: list[Client]
    max_tokens: int
    ran_to_max: float = 0.0  # leaving requests vLLM generated to max_tokens
    leaving_tokens: float = 0.0  # generated for leaving requests
    gateway: dict[str, float] = field(default_factory=dict)
    cut_ms: list[float] = field(default_factory=list)  # a client's close → the gateway closed upstream
    in_flight: int = 0  # left after vLLM's answer reached the gateway, before the client had it
    ran_on: int = 0  # left before vLLM's answer came, yet the gateway read it to its end

    @property
    def leaving(self) -> list[Client]:
        return [c for c in self.clients if c.kind != "stay"]

    @property
    def staying(self) -> list[Client]:
        return [c for c in self.clients if c.kind == "stay"]


def measure(path: str, url: str, vllm_url: str, gateway_url: str | None, tap: Tap | None, round_no: int,
            burst: Burst) -> Row:
    v0 = settled_vllm(vllm_url)
    g0 = settled_gateway(gateway_url) if gateway_url else ""
    row = Row(path, round_no, clients_of(round_no, burst), burst.max_tokens)
    send_burst(url, row.clients, burst)
    g1 = settled_gateway(gateway_url) if gateway_url else ""
    v1 = settled_vllm(vllm_url)
    stayed = row.staying
    row.ran_to_max = delta(v0, v1, "vllm:request_success_total", finished_reason="length") - len(stayed)
    row.leaving_tokens = delta(v0, v1, "vllm:generation_tokens_total") - sum(c.completion_tokens for c in stayed)
    if gateway_url:
        row.gateway = {cls: delta(g0, g1, "inferwatch_gateway_requests_total", status_class=cls)
                       for cls in ("2xx", "4xx", "5xx")}
        row.gateway["in_flight"] = metric_sum(g1, "inferwatch_gateway_requests_in_flight")
    if tap is not None:
        for client in row.leaving:
            record = tap.records.get(client.tag)
            if record is None or client.answered_first:
                continue  # never forwarded (the gateway saw the client gone first), or answered
            if record.cut:
                row.cut_ms.append((record.cut - client.closed) * 1000)
            elif record.answered and record.answered < client.closed:
                row.in_flight += 1
            else:
                row.ran_on += 1
    return row


# -- the table -----------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| path | leaving (fin / rst) | had their answer before leaving | ran to max_tokens in vLLM "
        "| generated tokens per leaving request | staying answered in full | recorded by the gateway "
        "| client's close → upstream closed, ms (median / max) | answer at the gateway as the client left "
        "| read to the end after the client left |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        leaving = row.leaving
        fin = sum(c.kind == "fin" for c in leaving)
        answered = sum(c.answered_first for c in leaving)
        full = sum(c.status == 200 and c.completion_tokens == row.max_tokens and not c.error for c in row.staying)
        recorded = cut = in_flight = ran_on = "–"
        if row.gateway:
            g = row.gateway
            # a leaving client whose answer was written before it left is a success, every other a 499
            recorded = (f"{g['2xx']:.0f} × 2xx (right: {len(row.staying) + answered}), {g['4xx']:.0f} × 4xx, "
                        f"{g['5xx']:.0f} × 5xx; in flight after: {g['in_flight']:.0f}")
            if row.cut_ms:
                cut = f"{statistics.median(row.cut_ms):.1f} / {max(row.cut_ms):.1f} (n={len(row.cut_ms)})"
            in_flight, ran_on = str(row.in_flight), str(row.ran_on)
        lines.append(
            f"| {row.path}, round {row.round_no} | {len(leaving)} ({fin} / {len(leaving) - fin}) | {answered} "
            f"| {row.ran_to_max:.0f} / {len(leaving)} | {row.leaving_tokens / max(1, len(leaving)):.0f} "
            f"| {full} / {len(row.staying)} | {recorded} | {cut} | {in_flight} | {ran_on} |")
    errors = [f"{c.tag} ({c.kind}): {c.error}" for row in rows for c in row.clients if c.error]
    if errors:
        lines += ["", "client errors:", *errors]
    return "\n".join(lines)


def timeline(row: Row, tap: Tap | None) -> str:
    """Per client, ms after its send: its close, vLLM's answer at the tap, the upstream cut."""
    out = [f"{row.path}, round {row.round_no}: ms after sending (close | vLLM's answer at the tap | upstream cut)"]

    def ms(client: Client, t: float) -> str:
        return f"{(t - client.sent) * 1000:7.0f}" if t else "      –"

    for c in row.clients:
        rec = tap.records.get(c.tag) if tap is not None else None
        out.append(f"  {c.tag} {c.kind:4} {ms(c, c.closed)} | {ms(c, rec.answered) if rec else '      –'} | "
                   f"{ms(c, rec.cut) if rec else '      –'}{'  (had its answer)' if c.answered_first else ''}")
    return "\n".join(out)


# -- the processes -------------------------------------------------------------------------


@contextmanager
def vllm(url: str | None) -> Iterator[str]:
    if url:
        yield url.rstrip("/")
        return
    from inferwatch.serving.tiny_model import build_tiny_model
    from inferwatch.serving.vllm_launcher import VLLMConfig, vllm_process

    cfg = VLLMConfig(str(build_tiny_model()), MODEL, port=free_port(), dtype="bfloat16")
    proc = vllm_process(cfg, Path(tempfile.mkdtemp(prefix="inferwatch-bench-")) / "vllm.log",
                        dict(os.environ, OMP_NUM_THREADS="1"))
    proc.start()
    try:
        proc.wait_healthy(cfg.startup_timeout_s)
        yield cfg.base_url
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-url", help="a running vLLM serving the tiny model as 'tiny-llama'")
    parser.add_argument("--leaving", type=int, default=10)
    parser.add_argument("--staying", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--leave-after-s", type=float, default=0.3)
    parser.add_argument("--leave-spread-s", type=float, default=0.0,
                        help="leaving clients hang up one after another over this span")
    parser.add_argument("--spacing-s", type=float, default=0.0, help="between two clients' sends (0: back to back)")
    parser.add_argument("--pad-bytes", type=int, default=0, help="JSON whitespace after each request body")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--path", choices=("both", "gateway", "direct"), default="both",
                        help="which paths each round measures (the comparison needs both)")
    parser.add_argument("--no-tap", action="store_true", help="the gateway talks to vLLM directly")
    parser.add_argument("--timeline", action="store_true", help="print each client's events")
    args = parser.parse_args()
    burst = Burst(args.leaving, args.staying, args.max_tokens, args.leave_after_s, args.leave_spread_s,
                  args.spacing_s, args.pad_bytes)
    if not (1 <= burst.leaving + burst.staying <= MAX_CLIENTS and 1 <= args.rounds <= 10
            and 0 < burst.leave_after_s <= 30 and 0 <= burst.leave_spread_s <= 30 and 0 <= burst.spacing_s <= 5
            and 0 <= burst.pad_bytes <= 900_000):
        parser.error(f"keep it bounded: 1..{MAX_CLIENTS} clients, 1..10 rounds, at most 30 s before leaving, "
                     "5 s between sends, 900,000 bytes of padding (the gateway takes 1 MiB)")
    with ExitStack() as stack:
        vllm_url = stack.enter_context(vllm(args.vllm_url))
        tap = None if args.no_tap else stack.enter_context(Tap(int(vllm_url.rsplit(":", 1)[1])))
        port = free_port()
        upstream = vllm_url if tap is None else f"http://127.0.0.1:{tap.port}"
        stack.enter_context(running("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--port", str(port),
                                                "--upstream-url", upstream], f"http://127.0.0.1:{port}/health"))
        gateway_url = f"http://127.0.0.1:{port}"
        get(f"{gateway_url}/ready")
        rows = []
        for round_no in range(1, args.rounds + 1):
            if args.path in ("both", "gateway"):
                rows.append(measure("through the gateway", gateway_url, vllm_url, gateway_url, tap, round_no, burst))
                if args.timeline:
                    print(timeline(rows[-1], tap), flush=True)
            if args.path in ("both", "direct"):
                rows.append(measure("vLLM directly", vllm_url, vllm_url, None, None, round_no, burst))
                if args.timeline:
                    print(timeline(rows[-1], None), flush=True)
    print(f"\n{burst.leaving} leaving + {burst.staying} staying non-streaming clients, max_tokens "
          f"{burst.max_tokens}, ignore_eos, leaving {burst.leave_after_s:g} s after sending (spread over "
          f"{burst.leave_spread_s:g} s), {burst.spacing_s:g} s between sends, bodies padded by {burst.pad_bytes} "
          "bytes\n")
    print(table(rows))


if __name__ == "__main__":
    main()
