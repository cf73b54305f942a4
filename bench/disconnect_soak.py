"""Clients that leave, under load, for minutes: does the gateway account for every one?

Hundreds of concurrent clients send chat requests through the gateway to the mock upstream
(bench/mock_upstream.py: streams of ``--tokens`` tokens, whole answers held
``--unary-delay-ms``), half of them streamed. A third of the clients leave before their
answer is complete, alternately with a FIN and a reset: a streaming one after a random number
of chunks, a non-streaming one at a random moment while the upstream still works on its
answer (never within ``MARGIN_S`` of the answer being due). Then the accounting: answers
completed = the gateway's 2xx, clients that left = its 4xx (499) = requests the upstream saw
cut, nothing in flight; and how soon after a client's close the upstream connection closed
(the mock's clock and the client's are the same ``time.monotonic()``).

One race no proxy can decide: a client that closes after the upstream finished its answer
(a saturated CPU delays the gateway past ``MARGIN_S``) may find its answer relayed and
counted a 2xx, or cut and counted a 499, by which event the gateway reads first. Such
requests are counted apart ("left as the upstream finished"); the rest must be exact.

    python bench/disconnect_soak.py [--clients 200] [--seconds 120]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import struct
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import running  # noqa: E402
from tests.support.servers import metric_sum  # noqa: E402
from tests.support.sockets import free_port  # noqa: E402

TOKENS, TOKEN_INTERVAL_MS, UNARY_DELAY_MS = 100, 5.0, 400.0
MARGIN_S = 0.15  # a leaving non-streaming client closes at least this long before its answer is due
LEAVE_SHARE = 1 / 3


def body(stream: bool, tag: str) -> bytes:
    return orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
                         "stream": stream, "user": tag})


def request(payload: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))


def hang_up(writer: asyncio.StreamWriter, reset: bool) -> None:
    if reset:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


class Tally:
    def __init__(self) -> None:
        self.completed = {"stream": 0, "unary": 0}
        self.left = {"stream": 0, "unary": 0}
        self.errors = 0
        self.closed_at: dict[str, float] = {}


async def one(port: int, tally: Tally, rng: random.Random, n: int) -> None:
    stream = rng.random() < 0.5
    kind = "stream" if stream else "unary"
    leave = rng.random() < LEAVE_SHARE
    tag = f"c{n}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request(body(stream, tag)))
        if leave and not stream:
            await asyncio.sleep(rng.uniform(0.0, UNARY_DELAY_MS / 1000 - MARGIN_S))
        elif leave:
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:80]
            for _ in range(rng.randint(0, TOKENS - 10)):  # chunks: the role event, then tokens
                await reader.readuntil(b"\n\n")
        if leave:
            tally.closed_at[tag] = time.monotonic()
            hang_up(writer, reset=n % 2 == 0)
            tally.left[kind] += 1
            return
        data = await reader.readuntil(b"0\r\n\r\n") if stream else await _whole(reader)
        if (stream and b"data: [DONE]" not in data) or (not stream and b'"finish_reason":"stop"' not in data):
            tally.errors += 1
        else:
            tally.completed[kind] += 1
        writer.close()
    except (ConnectionError, asyncio.IncompleteReadError, AssertionError):
        tally.errors += 1
        writer.close()


async def _whole(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


async def drive(port: int, clients: int, seconds: float, seed: int) -> Tally:
    tally, rng = Tally(), random.Random(seed)
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.monotonic() < deadline:
            await one(port, tally, rng, next(counter))

    await asyncio.gather(*(worker() for _ in range(clients)))
    return tally


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    import uvloop

    mock_port, gw_port = free_port(), free_port()
    env = {"INFERWATCH_GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{mock_port}",
           "INFERWATCH_GATEWAY_MAX_TOKENS_LIMIT": "32768"}
    with ExitStack() as stack:
        stack.enter_context(running("mock", [sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port",
                                             str(mock_port), "--tokens", str(TOKENS), "--token-interval-ms",
                                             str(TOKEN_INTERVAL_MS), "--unary-delay-ms", str(UNARY_DELAY_MS)],
                                    f"http://127.0.0.1:{mock_port}/health"))
        stack.enter_context(running("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--port", str(gw_port)],
                                    f"http://127.0.0.1:{gw_port}/health", env=env))
        started = time.monotonic()
        tally = uvloop.run(drive(gw_port, args.clients, args.seconds, args.seed))
        elapsed = time.monotonic() - started
        gateway = f"http://127.0.0.1:{gw_port}/metrics"
        in_flight = None
        for _ in range(100):  # the last hang-ups reach the gateway
            text = get(gateway).decode()
            in_flight = metric_sum(text, "inferwatch_gateway_requests_in_flight")
            if in_flight == 0:
                break
            time.sleep(0.1)
        time.sleep(0.5)  # ... and the upstream
        stats = orjson.loads(get(f"http://127.0.0.1:{mock_port}/stats"))
        text = get(gateway).decode()
    ok, gone = metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx"), \
        metric_sum(text, "inferwatch_gateway_requests_total", status_class="4xx")
    other = sum(metric_sum(text, "inferwatch_gateway_requests_total", status_class=c) for c in ("1xx", "3xx", "5xx"))
    cuts = sorted((stats["aborted_at"][tag] - at) * 1e3 for tag, at in tally.closed_at.items()
                  if tag in stats["aborted_at"])
    completed, left = sum(tally.completed.values()), sum(tally.left.values())
    received, done_at = set(stats["received"]), stats["answered_at"]
    racing = {tag for tag, at in tally.closed_at.items() if tag in done_at and done_at[tag] <= at}
    left_upstream = sum(1 for tag in tally.closed_at if tag in received and tag not in racing)
    print(f"## {args.clients} concurrent clients for {elapsed:.0f} s (cores: {os.cpu_count()})\n")
    print("| requests | streamed | not streamed | total |\n|---|---:|---:|---:|")
    print(f"| completed by the client | {tally.completed['stream']:,} | {tally.completed['unary']:,} | {completed:,} |")
    print(f"| left before the end | {tally.left['stream']:,} | {tally.left['unary']:,} | {left:,} |")
    print(f"| cut at the upstream | {stats['aborted']['stream']:,} | {stats['aborted']['unary']:,} | "
          f"{sum(stats['aborted'].values()):,} |")
    print(f"| left as the upstream finished (2xx or 499 both right) | | | {len(racing):,} |")
    print(f"| client errors (must be 0) | | | {tally.errors} |\n")
    print("| the gateway recorded | count | expected | right? |\n|---|---:|---:|---|")
    print(f"| 2xx | {ok:,.0f} | {completed:,} + up to {len(racing):,} | "
          f"{'yes' if completed <= ok <= completed + len(racing) else 'NO'} |")
    print(f"| 4xx (499) | {gone:,.0f} | {left - len(racing):,} + up to {len(racing):,} | "
          f"{'yes' if left - len(racing) <= gone <= left and ok + gone == completed + left else 'NO'} |")
    print(f"| other | {other:,.0f} | 0 | {'yes' if other == 0 else 'NO'} |")
    print(f"| in flight after | {in_flight:,.0f} | 0 | {'yes' if in_flight == 0 else 'NO'} |")
    cut = sum(stats["aborted"].values())
    print(f"| cut at the upstream | {cut:,} | {left_upstream:,} (of those left, the ones sent upstream while it "
          f"worked) | {'yes' if cut == left_upstream else 'NO'} |\n")
    if cuts:
        q = statistics.quantiles(cuts, n=100)
        print("| client's close → upstream connection closed | median | p99 | max |\n|---|---:|---:|---:|")
        print(f"| {len(cuts):,} cuts | {statistics.median(cuts):.2f} ms | {q[98]:.2f} ms | {max(cuts):.2f} ms |")


if __name__ == "__main__":
    main()
