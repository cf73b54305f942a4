"""The floor for an HTTP proxy written in Python on uvloop: each request parsed with httptools
(the parser the gateway's server uses) and forwarded as it came to a kept-alive upstream
connection of its own, each answer parsed to find where it ends and relayed as it came. No
routing, no header rewriting, no JSON, no metrics: what any HTTP-aware Python proxy pays
before its first feature. bench/gateway_overhead.py puts it beside nginx and the gateway;
bench/byte_relay.py is the floor below it, with no HTTP at all.

    python bench/http_relay.py --port 8001 --upstream-port 8000
"""

from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop


class _Upstream(asyncio.Protocol):
    """One client's upstream connection: answers are parsed only to know where each ends."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class _Client(asyncio.Protocol):
    """A client connection: requests parsed, one at a time upstream (HTTP/1.1 keep-alive)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: _Upstream | None = None
        self.request = bytearray()
        self.waiting: list[bytes] = []  # whole requests behind the one upstream (pipelined)
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.request += data
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        request, self.request = bytes(self.request), bytearray()
        if self.busy or self.upstream is None:
            self.waiting.append(request)
            if self.upstream is None and not self.busy:
                self.busy = True
                asyncio.get_running_loop().create_task(self._connect())
            return
        self.busy = True
        self.upstream.transport.write(request)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.upstream = await loop.create_connection(lambda: _Upstream(self), "127.0.0.1", self.upstream_port)
        self.busy = False
        self.answered()

    def answered(self) -> None:
        self.busy = False
        if self.waiting and self.upstream is not None:
            self.busy = True
            self.upstream.transport.write(self.waiting.pop(0))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.transport.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port), "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
