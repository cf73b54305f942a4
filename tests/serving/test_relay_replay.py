"""The relay against a real vLLM stream cut every way the network can cut it.

tests/serving/data/vllm-0.32-chat-stream.sse is what vLLM 0.32 (CPU build, tiny model) sent
for a chat stream with usage: role chunk, token chunks (some with empty text: a token that is
part of a UTF-8 character), the finishing chunk, the usage chunk, [DONE]. A replaying
upstream sends exactly those bytes, in pieces cut at chosen places, and the client must get
exactly vLLM's events, none merged, split or lost, whatever the cuts (the usage chunk only if
it asked for it). Live vLLM cannot be made to cut its stream on demand, and under load it
merges deltas itself when its reader lags, so its chunk count is no fixed truth there."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import GatewayServer
from tests.support.sockets import free_port

SSE = (Path(__file__).parent / "data" / "vllm-0.32-chat-stream.sse").read_bytes()
EVENTS = [e for e in SSE.split(b"\n\n") if e]
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "object": "model", "max_model_len": 512}]})


class _Replay(asyncio.Protocol):
    """Answers /v1/models, and any POST with SSE, written in the pieces ``cuts`` makes."""

    cuts: ClassVar[list[int]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        lowered = head.lower()
        length = int(lowered.split(b"content-length: ")[1].split(b"\r\n")[0]) if b"content-length: " in lowered else 0
        if not sep or len(body) < length:
            return
        self.buf = b""
        if head.startswith(b"GET"):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(MODELS), MODELS.encode()))
        else:
            asyncio.get_running_loop().create_task(self._stream(list(self.cuts)))

    async def _stream(self, cuts: list[int]) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        start = 0
        for end in [*cuts, len(SSE)]:
            piece = SSE[start:end]
            start = end
            self.transport.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await asyncio.sleep(0.002)  # each piece its own read at the gateway
        self.transport.write(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def gateway():
    loop = asyncio.new_event_loop()
    port = free_port()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(loop.create_server(_Replay, "127.0.0.1", port), loop).result()
    with GatewayServer(GatewaySettings(upstream_url=f"http://127.0.0.1:{port}")) as gw:
        yield gw
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


def _cut_patterns() -> list[list[int]]:
    rnd = random.Random(7)
    single = [[c] for c in range(1, len(SSE), 5)]  # every place, one cut
    several = [sorted(rnd.sample(range(1, len(SSE)), k)) for k in (2, 5, 13, 40) for _ in range(20)]
    return [[], *single, *several]


@pytest.mark.parametrize("include_usage", [False, True])
def test_every_cut_of_a_vllm_stream_reaches_the_client_as_vllm_sent_it(gateway, include_usage):
    want = EVENTS if include_usage else [e for e in EVENTS if b'"choices":[],' not in e]
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 16, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    wrong = []
    for cuts in _cut_patterns():
        _Replay.cuts = cuts
        answer = requests.post(gateway.url + "/v1/chat/completions", json=body, timeout=10)
        got = [e for e in answer.content.split(b"\n\n") if e]
        if answer.status_code != 200 or got != want:
            wrong.append(cuts)
    assert not wrong, f"{len(wrong)} cut patterns changed the events, e.g. cuts at {wrong[0]}"
