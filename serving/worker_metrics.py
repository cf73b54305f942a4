"""One ``/metrics`` per pod when several worker processes serve the gateway's port.

Why one view and not one port per worker: every scrape config this project ships (the
compose and local Prometheus, the kustomize PodMonitor/ServiceMonitor) names one port per
pod, and a worker count that changes would have to change each of them. prometheus_client's
multiprocess mode was the other candidate, but it keeps values in mmap files through its own
value class, which the gateway's exposition (serving/exposition.py) does not read, and it has
no Info or custom collectors.

So each worker also answers on a loopback port of its own with its own exposition; the
worker a scrape lands on asks its siblings for theirs, in the format the scraper asked for,
and joins them family by family, each sample with a ``worker`` label (series of different
processes must stay apart: counters restart with their process). The join works on text
blocks and anchored regex substitutions, not per parsed sample, so a scrape's work stays
near one render's. A sibling that does not answer in time (restarting) is left out of that
scrape and shows as ``inferwatch_gateway_worker_up{worker=...} 0``.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable, Sequence

WORKER_LABEL = "worker"
FETCH_TIMEOUT_S = 2.0
_MAX_HEAD = 8192
_FAMILY = re.compile(r"^(?=# HELP )", re.M)
_LABELLED = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", re.M)
_BARE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*) ", re.M)
_EOF = "# EOF\n"
UP_FAMILY = "inferwatch_gateway_worker_up"

# (body, content type) of this worker's own exposition for an Accept header.
Render = Callable[[str], tuple[bytes, str]]


def labelled(block: str, worker: int) -> str:
    """The block with ``worker="<worker>"`` first in every sample's labels."""
    block = _LABELLED.sub(rf'\1{{{WORKER_LABEL}="{worker}",', block)
    return _BARE.sub(rf'\1{{{WORKER_LABEL}="{worker}"}} ', block)


def merge(expositions: Sequence[tuple[int, str | None]]) -> str:
    """One exposition of the workers' (index, text or None when it did not answer), in the
    format they share: families in order of first appearance, each with its HELP/TYPE/UNIT
    lines once and every worker's samples, labelled, after them."""
    openmetrics = False
    families: dict[str, list[str]] = {}
    for worker, text in expositions:
        if text is None:
            continue
        if text.endswith(_EOF):
            openmetrics = True
            text = text[:-len(_EOF)]
        for block in _FAMILY.split(text):
            if not block:
                continue
            name = block.split(" ", 3)[2]
            head, samples = _split_head(block)
            entry = families.setdefault(name, [head])
            if samples:
                entry.append(labelled(samples, worker))
    up = [f"# HELP {UP_FAMILY} 1 if the worker process answered this scrape; its series are missing while 0 "
          "(restarting).\n", f"# TYPE {UP_FAMILY} gauge\n"]
    up += [f'{UP_FAMILY}{{{WORKER_LABEL}="{worker}"}} {0 if text is None else 1}\n' for worker, text in expositions]
    out = "".join("".join(parts) for parts in families.values()) + "".join(up)
    return out + _EOF if openmetrics else out


def _split_head(block: str) -> tuple[str, str]:
    """(the family's comment lines, its samples): the comment lines come first in a block."""
    end = 0
    while block.startswith("#", end):
        newline = block.find("\n", end)
        end = len(block) if newline < 0 else newline + 1
    return block[:end], block[end:]


async def serve_own(sock: socket.socket, render: Render) -> asyncio.Server:
    """Answer every HTTP request on ``sock`` (a loopback port the parent bound) with this
    worker's own exposition, for the siblings that join it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), FETCH_TIMEOUT_S)
            accept = _header(head[:_MAX_HEAD].decode("latin-1"), "accept")
            body, content_type = await asyncio.to_thread(render, accept)
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
                         "connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, sock=sock)


async def fetch(port: int, accept: str) -> str | None:
    """A sibling's exposition from its loopback port, or None if it does not answer in time."""
    try:
        return await asyncio.wait_for(_get(port, accept), FETCH_TIMEOUT_S)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
        return None


async def _get(port: int, accept: str) -> str | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: {accept}\r\n"
                     "connection: close\r\n\r\n".encode("latin-1"))
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        if not head.startswith("HTTP/1.1 200 "):
            return None
        return (await reader.readexactly(int(_header(head, "content-length")))).decode()
    finally:
        writer.close()


def _header(head: str, name: str) -> str:
    for line in head.split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return ""


class WorkerView:
    """The pod's ``/metrics`` as one worker answers it: its own exposition and its siblings'."""

    def __init__(self, index: int, ports: Sequence[int], render: Render) -> None:
        self.index = index
        self.ports = list(ports)
        self.render = render

    async def scrape(self, accept: str) -> tuple[bytes, str]:
        own = asyncio.ensure_future(asyncio.to_thread(self.render, accept))
        texts = await asyncio.gather(*(fetch(port, accept) for i, port in enumerate(self.ports) if i != self.index))
        body, content_type = await own
        answers = iter(texts)
        expositions = [(i, body.decode() if i == self.index else next(answers)) for i in range(len(self.ports))]
        merged = await asyncio.to_thread(merge, expositions)
        return merged.encode(), content_type
