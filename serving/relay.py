"""Relaying an SSE stream from vLLM to the client, token by token, while timing it.

The relay is the upstream connection's ``BodySink``: each chunk vLLM sends is accounted for
(serving/sse.py) and written to the client's transport in the same callback, with no task
switch per chunk. Chunks shaped like the stream's earlier token events go out untouched
(``EventProcessor.token_as_is``). When the stream ends, fails, idles out or the client
leaves, the relay settles exactly once and hands the outcome to the proxy's ``on_settled``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import orjson
from opentelemetry import trace

from inferwatch.serving import errors
from inferwatch.serving.errors import CLIENT_CLOSED
from inferwatch.serving.exchange import Exchange
from inferwatch.serving.lazy_timer import SLACK_S, LazyTimer
from inferwatch.serving.relay_client import UpstreamResponse
from inferwatch.serving.request import RequestState
from inferwatch.serving.sse import EventProcessor, SSESplitter, StreamAccount
from inferwatch.serving.tracing import end_response_span, end_span
from inferwatch.serving.validation import ParsedRequest

RELAY_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                 (b"x-accel-buffering", b"no")]
_RESPONSE_ID = re.compile(rb'"id":"([^"\\]{1,256})"')

# (state, status, account, error, reason for the upstream-errors metric or None)
Settled = Callable[[RequestState, int, StreamAccount, "str | None", "str | None"], None]


class StreamRelay:
    """Relays one upstream SSE stream to the client from the upstream connection's callbacks
    (a ``BodySink``): each chunk vLLM sends is accounted for and written to the client's
    transport in the same callback, with no task switch. Settles its accounting exactly once.

    A complete stream is settled before its last bytes go out, so a client that read [DONE]
    finds it counted. That waits for the callbacks already due in the loop's current turn: a
    gateway starved of CPU finds the end of the stream and the client's disconnect in the
    same poll, in either order, and the disconnect wins (a 499). A client that closes after
    reading [DONE] (the ``openai`` client does, before the response's last empty chunk) has
    its answer: that is a success.
    """

    def __init__(self, state: RequestState, req: ParsedRequest, resp: UpstreamResponse, upstream_span: trace.Span,
                 exchange: Exchange, on_settled: Settled, *, capture_logprobs: bool, want_id: bool,
                 idle_s: float) -> None:
        self.state, self.resp, self.upstream_span = state, resp, upstream_span
        self.exchange, self.on_settled = exchange, on_settled
        self.account = StreamAccount(state.started)
        capture = capture_logprobs or req.client_wants_logprobs
        self.processor = EventProcessor(self.account, req.route, strip_usage=not req.client_wants_usage,
                                        read_logprobs=capture,
                                        strip_logprobs=capture and not req.client_wants_logprobs)
        self.splitter = SSESplitter()
        self.status, self.code = 200, ""
        self.error: str | None = None
        self.reason: str | None = None
        self.settled = False
        self.want_id = want_id  # the answer's id is remembered for feedback
        self.as_is = not self.want_id and state.rename is None  # chunks may go out as they came
        self.first_seen = False
        self.idle_s = idle_s
        self.last = time.perf_counter()  # when the last chunk came (or the client caught up): the idle clock
        self.client_slow = False  # reading paused until the client's socket drains: not idle
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle = LazyTimer(self._idle_due)  # per chunk, only ``last`` moves
        self._idle.fire_by(time.monotonic() + self.idle_s)

    def start(self) -> None:
        headers = [b"%s: %s\r\n" % h for h in RELAY_HEADERS]
        variant = self.state.variant_header()
        self.exchange.start_stream(headers + variant if variant is not None else headers)
        self.exchange.on_writable = self._writable
        self.resp.relay_to(self)
        if not self.settled:
            self.exchange.watch(self.client_left)

    # -- BodySink: called by the upstream connection --------------------------------------

    def on_data(self, chunk: bytes) -> None:
        if self.settled or self.account.done:
            return
        self.last = now = time.perf_counter()
        if self.as_is and not self.splitter.pending and self.processor.token_as_is(chunk, now):
            self.exchange.send(chunk)
            return
        events = self.splitter.feed(chunk)
        if not events:
            return
        account, state = self.account, self.state
        out = self.processor.process(events, now)
        if self.want_id and (found := _RESPONSE_ID.search(events[0])) is not None:
            state.response_id, self.want_id = found.group(1).decode(), False
            self.as_is = state.rename is None
        if state.rename is not None:
            out = out.replace(*state.rename)
        if not self.first_seen and account.first_token is not None:
            self.first_seen = True
            state.span.add_event("first_token")
        if account.upstream_error is not None:
            code = error_event_code(account.upstream_error)
            if 400 <= code < 500:  # vLLM refused the request after accepting the stream: the client's error
                self.fail(code, "http_4xx", "upstream rejected the request in the stream")
            else:
                self.fail(502, "http_5xx", "upstream reported an error in the stream")
            self._end(out)
        elif account.done:
            asyncio.get_running_loop().call_soon(self._complete, out)
        elif out:
            self.exchange.send(out)

    def on_end(self) -> None:
        if not self.settled and not self.account.done:
            self.fail(502, "stream_interrupted", "upstream closed the stream before [DONE]")
            self._end(errors.stream_error_event(self.error or "stream failed", self.code))

    def on_error(self, error: ConnectionError) -> None:
        if not self.settled and not self.account.done:
            self.fail(502, "stream_interrupted", f"upstream connection lost mid-stream: {type(error).__name__}")
            self._end(errors.stream_error_event(self.error or "stream failed", self.code))

    def _complete(self, last: bytes) -> None:
        if self.settled:
            return
        if self.exchange.gone:
            self.client_left()
        else:
            self._end(last)

    # -- the client's side --------------------------------------------------------------

    def client_left(self) -> None:
        if not self.settled:
            self.fail(CLIENT_CLOSED, None, "client closed the connection")
            self._end(b"")

    def _writable(self, ok: bool) -> None:
        """The client reads slower than vLLM writes: stop reading from vLLM until it catches up."""
        self.client_slow = not ok
        if ok:
            self.last = time.perf_counter()
            self.resp.resume_reading()
        else:
            self.resp.pause_reading()

    def _idle_due(self) -> float | None:
        if self.settled:
            return None
        if self.client_slow:
            return time.monotonic() + self.idle_s
        remaining = self.last + self.idle_s - time.perf_counter()  # ``last`` is on the tokens' clock
        if remaining > SLACK_S:
            return time.monotonic() + remaining
        self.fail(504, "timeout", f"upstream sent nothing for {self.idle_s}s", code="upstream_timeout")
        self._end(errors.stream_error_event(self.error or "stream failed", self.code))
        return None

    def abort(self, error: str) -> None:
        if not self.settled:
            self.fail(502, None, error)
            self._end(errors.stream_error_event(error, "gateway_stopped"))

    # -- settling ---------------------------------------------------------------------

    def fail(self, status: int, reason: str | None, error: str, code: str | None = None) -> None:
        """``reason`` labels the upstream-errors metric; ``code`` is what the client's error event says."""
        self.status, self.reason, self.error, self.code = status, reason, error, code or reason or ""

    def _end(self, last: bytes) -> None:
        """Settle, then send the stream's last bytes (nothing to a client that left)."""
        self.settled = True
        self._idle.close()
        if self.account.done:
            self.resp.release()
        else:
            self.resp.close()  # drop the connection so vLLM aborts the request
        if self.error is None:
            end_response_span(self.upstream_span, self.account, self.state.response_id, self.state.response_model)
        else:
            end_span(self.upstream_span, self.error)
        self.on_settled(self.state, self.status, self.account, self.error, self.reason)
        self.exchange.end_stream(last)
        if not self.finished.done():
            self.finished.set_result(None)


def error_event_code(payload: bytes) -> int:
    """The HTTP-like code of a stream's error event (vLLM sends its 400s that way too); 500
    when it has none."""
    try:
        code = orjson.loads(payload).get("error", {}).get("code")
    except (orjson.JSONDecodeError, AttributeError):
        return 500
    return code if isinstance(code, int) and not isinstance(code, bool) else 500
