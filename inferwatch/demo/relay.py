"""The demo's slow canary: a TCP relay in front of vLLM that holds every byte a client sends
back by a fixed delay. The model behind it is the same, so only the time to the first token
(and the end-to-end latency) of the canary grows, the way a slower build would show; its
answers, lengths and errors are vLLM's own.

Each chunk is held until its arrival time plus the delay, not one delay after the previous
chunk: a request that comes in several reads waits the delay once, not once per read.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)
CHUNK = 65_536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy until EOF; with a delay, a reader task queues each chunk with its due time while
    this one writes them when due, so reading never waits on the delay."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while data := await reader.read(CHUNK):
            await queue.put((time.monotonic() + delay_s, data))
        await queue.put((time.monotonic() + delay_s, b""))

    reading = asyncio.create_task(read()) if delay_s else None
    try:
        while True:
            if reading is None:
                data = await reader.read(CHUNK)
            else:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        writer.close()
    finally:
        if reading is not None:
            reading.cancel()


async def _serve_client(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                        upstream: tuple[str, int], delay_s: float) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(*upstream)
    except OSError as exc:  # vLLM down: the client sees a refused connection's equivalent, a close
        log.warning("cannot reach %s:%d: %s", *upstream, exc)
        client_w.close()
        return
    try:
        await asyncio.gather(_pipe(client_r, up_w, delay_s), _pipe(up_r, client_w, 0.0))
    finally:
        for w in (client_w, up_w):
            w.close()


async def serve(host: str, port: int, upstream: tuple[str, int], delay_s: float,
                started: asyncio.Event | None = None) -> None:
    """Relay connections to ``upstream`` until cancelled."""
    server = await asyncio.start_server(lambda r, w: _serve_client(r, w, upstream, delay_s), host, port)
    async with server:
        if started is not None:
            started.set()
        await server.serve_forever()
