"""A misbehaving OpenAI server for fault injection: the failures real vLLM cannot be made
to produce on demand (stalls, garbage, a stream cut without [DONE], an error event).

Behaviour is chosen by the requested model name. Everything that real vLLM can do is
tested against real vLLM instead (tests/integration).
"""

from __future__ import annotations

import asyncio
import threading

import orjson
from aiohttp import web

SEEN = web.AppKey("seen", list)
HEADERS = web.AppKey("headers", list)
SERVER = web.AppKey("server", str)
MODELS = ("ok", "stall_headers", "stall_stream", "garbage", "cut", "error_event", "bad_request_event", "http500",
          "long_stream", "named_tool",
          *(QUALITY := {"looping": [" the"] * 40, "blank": ["\n", " ", "\t"], "unicode_blank": ["\u3000", "\n", "\u00a0"]}))
# vLLM's answer to a function named in tool_choice: the call's arguments, finish_reason "stop"
# (vLLM says "tool_calls" only for tool_choice auto or required), content "" when read whole
TOOL_ARGUMENTS = ['{"city": ', '"Paris"', "}"]
LONG_STREAM_CHUNKS = 6000  # of ~1 KB each: more than loopback sockets buffer


def _chunk(text: str, rid: str = "s", model: str = "ok") -> bytes:
    return b"data: " + orjson.dumps({"id": rid, "object": "chat.completion.chunk", "model": model,
                                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + b"\n\n"


async def _answer(request: web.Request, body: dict, rid: str, model: str, tokens: list[str]) -> web.StreamResponse:
    finish = "length" if model == "looping" else "stop"
    usage = {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}
    if not body.get("stream"):
        return web.json_response({"id": rid, "object": "chat.completion", "model": model, "usage": usage,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
                                               "finish_reason": finish}]})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for text in tokens:
        await resp.write(_chunk(text, rid, model))
    await resp.write(b"data: " + orjson.dumps({"id": rid, "model": model, "choices": [
        {"index": 0, "delta": {"content": ""}, "finish_reason": finish}]}) + b"\n\n")
    await resp.write(b"data: " + orjson.dumps({"id": rid, "choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _tool_delta(rid: str, model: str, i: int, arguments: str) -> bytes:
    call = {"index": 0, "function": {"arguments": arguments}}
    if i == 0:
        call = {**call, "id": "chatcmpl-tool-1", "type": "function", "function": {"name": "weather", **call["function"]}}
    return b"data: " + orjson.dumps({"id": rid, "object": "chat.completion.chunk", "model": model, "choices": [
        {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}) + b"\n\n"


async def _named_tool(request: web.Request, body: dict, rid: str, model: str) -> web.StreamResponse:
    usage = {"prompt_tokens": 3, "completion_tokens": len(TOOL_ARGUMENTS), "total_tokens": 3 + len(TOOL_ARGUMENTS)}
    if not body.get("stream"):
        call = {"id": "chatcmpl-tool-1", "type": "function",
                "function": {"name": "weather", "arguments": "".join(TOOL_ARGUMENTS)}}
        return web.json_response({"id": rid, "object": "chat.completion", "model": model, "usage": usage,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                                                                       "tool_calls": [call]},
                                               "finish_reason": "stop"}]})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"data: " + orjson.dumps({"id": rid, "model": model, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}) + b"\n\n")
    for i, arguments in enumerate(TOOL_ARGUMENTS):
        await resp.write(_tool_delta(rid, model, i, arguments))
    await resp.write(b"data: " + orjson.dumps({"id": rid, "model": model, "choices": [
        {"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}) + b"\n\n")
    await resp.write(b"data: " + orjson.dumps({"id": rid, "choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": m, "object": "model", "max_model_len": 4096}
                                                          for m in MODELS]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    model = body["model"]
    request.app[SEEN].append(body)
    request.app[HEADERS].append(dict(request.headers))
    rid = f"s-{request.app[SERVER]}-{len(request.app[SEEN])}"  # unique, as vLLM's ids are
    if model == "stall_headers":
        await asyncio.sleep(30)
    if model == "http500":
        return web.json_response({"error": {"message": "engine dead", "code": 500}}, status=500)
    if model == "garbage":
        return web.Response(text="<html>proxy error</html>", content_type="application/json")
    if model == "named_tool":
        return await _named_tool(request, body, rid, model)
    if model in QUALITY:  # answers with something wrong in them, that end (a finish reason)
        return await _answer(request, body, rid, model, QUALITY[model])
    if not body.get("stream"):
        return web.json_response({"id": rid, "object": "chat.completion", "model": model,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("a", rid, model))
    if model == "stall_stream":
        await asyncio.sleep(30)
    if model == "cut":
        request.transport.close()  # the process "dies": no [DONE], connection gone
        return resp
    if model == "error_event":
        await resp.write(b'data: {"error": {"message": "engine failed", "code": 500}}\n\n')
        return resp
    if model == "bad_request_event":  # as vLLM refuses a token id out of vocabulary once streaming
        await resp.write(b'data: {"error": {"message": "token id 4996 out of vocabulary", "code": 400}}\n\n')
        return resp
    completion = 2
    if model == "long_stream":
        for i in range(LONG_STREAM_CHUNKS - 2):
            await resp.write(_chunk(f"{i:06d}" + "x" * 1000, rid, model))
        completion = LONG_STREAM_CHUNKS
    await resp.write(_chunk("b", rid, model))
    await resp.write(b'data: {"id":"s","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
                     % completion)
    await resp.write(b"data: [DONE]\n\n")
    return resp


class StubUpstream:
    def __init__(self) -> None:
        self.app = web.Application()
        self.app[SEEN] = []
        self.app[HEADERS] = []
        self.app[SERVER] = f"{id(self):x}"
        self.app.router.add_get("/v1/models", _models)
        self.app.router.add_get("/health", _health)
        self.app.router.add_post("/v1/chat/completions", _chat)
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=1)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def seen(self) -> list[dict]:
        return self.app[SEEN]

    @property
    def headers_seen(self) -> list[dict]:
        return self.app[HEADERS]

    def __enter__(self) -> StubUpstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._runner.setup(), self._loop).result()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self._loop).result()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
