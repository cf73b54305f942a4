"""A constant-rate (open-loop) HTTP load generator: request i is due at ``start + i / rate``
whether or not earlier ones have answered, on a connection of its own if every open one
is busy.

wrk is closed-loop: a stalled server holds back wrk's next request too, so a 5 ms pause
shows up as one slow request instead of the five that should have arrived during it
(coordinated omission). Here a pause delays every request due during it, as real clients
arriving at a steady rate would see. Latency counts from the moment the request is written:
the event loop's timers tick in whole milliseconds, so requests go out up to ~1 ms after
they were due, and that lag (reported as ``send_lag_p99``) is the generator's, not the
server's. Keep-alive connections are opened as needed and reused; compare targets from the
same run (bench/gateway_overhead.py prints the difference to nginx).

    python bench/open_loop.py --url http://127.0.0.1:8080/v1/chat/completions --rate 1000 --seconds 5 \\
        --body '{"model": ...}' [--header 'Authorization: Bearer k']

Prints one JSON object: requests, errors, and latency percentiles in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from urllib.parse import urlsplit

import uvloop


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reusable = True  # false once the server said "connection: close" (nginx does every 1,000)

    async def exchange(self, request: bytes) -> int:
        """One request on this keep-alive connection; the answer's status (read whole)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.reusable = False
        if length:
            await self.reader.readexactly(length)
        return status


async def load(url: str, body: bytes, headers: list[str], rate: float, seconds: float) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + body
    idle: list[Connection] = []
    latencies: list[float] = []
    errors = 0

    lags: list[float] = []

    async def one(due: float) -> None:
        nonlocal errors
        reused = bool(idle)
        conn = idle.pop() if idle else Connection(*await asyncio.open_connection(host, port))
        sent = time.perf_counter()
        lags.append(sent - due)
        try:
            status = await conn.exchange(request)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            conn.writer.close()
            if not reused:
                errors += 1
                return
            # a kept-alive connection the server closed as it went idle: once more on a new one
            conn = Connection(*await asyncio.open_connection(host, port))
            try:
                status = await conn.exchange(request)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn.writer.close()
                errors += 1
                return
        latencies.append(time.perf_counter() - sent)
        if status >= 400:
            errors += 1
        if conn.reusable:
            idle.append(conn)
        else:
            conn.writer.close()

    total = int(rate * seconds)
    start = time.perf_counter() + 0.05
    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.writer.close()
    latencies.sort()
    lags.sort()

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"requests": len(latencies), "errors": errors, "connections": len(idle),
            "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99), "p999": pct(latencies, 0.999),
            "max": latencies[-1], "send_lag_p99": pct(lags, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True)
    parser.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    print(json.dumps(uvloop.run(load(args.url, args.body.encode(), args.header, args.rate, args.seconds))))


if __name__ == "__main__":
    main()
