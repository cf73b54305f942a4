"""A fast fake vLLM for benchmarks: raw asyncio HTTP/1.1, canned OpenAI answers.

It must cost as little CPU as possible, so that what a benchmark measures is the gateway,
not the mock. Streams write one SSE event per token with a pause between tokens, the way
vLLM does, so the gateway really sees one event per read. ``--unary-delay-ms`` holds each
whole answer that long, as generation would; ``GET /stats`` says how many answers were
given and how many requests lost their connection before their answer ended (what vLLM
aborts), with the ``"user"`` tags of the requests received and when (``time.monotonic()``,
the same clock in every process) each tagged one was answered in full or cut.

    python bench/mock_upstream.py --port 8100 --tokens 200 --token-interval-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

import orjson

MODEL = "bench-model"
MODELS = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 32768}]})
COMPLETION = orjson.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "The quick brown fox jumps over the dog."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22},
})


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def token_event(i: int) -> bytes:
    return b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench-model",' \
           b'"choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null}]}\n\n' % i


ROLE_EVENT = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench-model",'
              b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n')


def usage_event(n: int) -> bytes:
    return (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench-model",'
            b'"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}\n\n' % (n, n + 12))


_USER = re.compile(rb'"user":"([^"]{1,64})"')
STATS: dict = {"answered": {"stream": 0, "unary": 0}, "aborted": {"stream": 0, "unary": 0}, "aborted_at": {},
         "answered_at": {}, "received": []}


class MockProtocol(asyncio.Protocol):
    def __init__(self, tokens: int, interval_s: float, unary_delay_s: float = 0.0) -> None:
        self.tokens = tokens
        self.interval_s = interval_s
        self.unary_delay_s = unary_delay_s
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.pending: tuple[str, bytes | None] | None = None  # (kind, user tag) of the answer under way

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pending is not None:
            kind, tag = self.pending
            STATS["aborted"][kind] += 1
            if tag is not None:
                STATS["aborted_at"][tag.decode()] = time.monotonic()

    def _begin(self, kind: str, body: bytes) -> None:
        found = _USER.search(body)
        self.pending = (kind, found.group(1) if found else None)
        if found:
            STATS["received"].append(found.group(1).decode())

    def _end(self, kind: str) -> None:
        if self.pending is not None and self.pending[1] is not None:
            STATS["answered_at"][self.pending[1].decode()] = time.monotonic()
        self.pending = None
        STATS["answered"][kind] += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            total = head_end + 4 + length
            if len(self.buf) < total:
                return
            body = self.buf[head_end + 4:total]
            self.buf = self.buf[total:]
            self.handle(head.split(b" ", 2)[1], body)

    def respond(self, status: bytes, body: bytes) -> None:
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(body), body))

    def handle(self, path: bytes, body: bytes) -> None:
        if path == b"/v1/models":
            self.respond(b"200 OK", MODELS)
        elif path == b"/health":
            self.respond(b"200 OK", b"")
        elif path == b"/stats":
            self.respond(b"200 OK", orjson.dumps(STATS))
        elif b'"stream":true' in body:
            self._begin("stream", body)
            asyncio.get_running_loop().create_task(self.stream())
        elif self.unary_delay_s:
            self._begin("unary", body)
            asyncio.get_running_loop().call_later(self.unary_delay_s, self.answer)
        else:
            self.respond(b"200 OK", COMPLETION)

    def answer(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._end("unary")
            self.respond(b"200 OK", COMPLETION)

    async def stream(self) -> None:
        t = self.transport
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        t.write(_chunk(ROLE_EVENT))
        for i in range(self.tokens):
            if self.interval_s:
                await asyncio.sleep(self.interval_s)
            if t.is_closing():
                return
            t.write(_chunk(token_event(i)))
        self._end("stream")
        t.write(_chunk(usage_event(self.tokens)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(port: int, tokens: int, interval_s: float, unary_delay_s: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MockProtocol(tokens, interval_s, unary_delay_s), "127.0.0.1", port,
                                      backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--tokens", type=int, default=100, help="tokens per streamed answer")
    parser.add_argument("--token-interval-ms", type=float, default=2.0)
    parser.add_argument("--unary-delay-ms", type=float, default=0.0, help="how long a whole answer takes")
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.port, args.tokens, args.token_interval_ms / 1000, args.unary_delay_ms / 1000))


if __name__ == "__main__":
    main()
