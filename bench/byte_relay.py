"""The floor for any proxy written in Python on uvloop: bytes from each client connection
copied to its own upstream connection and back, in protocol callbacks, with no HTTP
parsing at all. The gateway's per-chunk cost is compared with it in
bench/gateway_overhead.py: what the gateway spends above it is its own work, what it
spends below nginx is the interpreter's and the event loop's.

    python bench/byte_relay.py --port 8001 --upstream-port 8000
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(lambda: _Upstream(self.transport), self.host, self.port)
        for data in self.early:
            self.upstream.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client("127.0.0.1", upstream_port), "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
