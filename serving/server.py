"""How the gateway is served: uvicorn with httptools, plus what that server lacks in front
of untrusted clients.

- Requests the HTTP parser refuses before the app sees them (a non-numeric
  Content-Length, a malformed request line) get an OpenAI error object, like every other
  error of the gateway.
- A request's head (request line and headers) is bounded in size and in time: httptools
  accepts headers without limit (a client could stream gigabytes of them into memory) and
  uvicorn times out only idle keep-alive connections, not one that sends half a request
  (slowloris). The body's own time bound is the gateway's (``_read_body``).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.errors import error_body

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; nginx's large_client_header_buffers default is 32 KiB
FIRST_READ_BYTES = 256 * 1024  # the first reads may carry the start of the body along with the head
HEAD_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers
STATUS_LINES = {400: b"400 Bad Request", 408: b"408 Request Timeout", 431: b"431 Request Header Fields Too Large"}


class GatewayHttpProtocol(HttpToolsProtocol):
    _in_head = False
    _head_bytes = 0  # received while the head is incomplete
    _header_bytes = 0  # of parsed header names and values
    _head_timer: asyncio.TimerHandle | None = None
    _refusal: tuple[int, str, str] | None = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)  # counted before parsing: one endless header line is bounded too
            if self._head_bytes > MAX_HEAD_BYTES + FIRST_READ_BYTES:
                self._refuse(431, "header_too_large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes.")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._header_bytes = True, 0, 0
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEAD_BYTES:
            self._refusal = (431, "header_too_large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes.")
            raise ValueError("headers too large")  # httptools turns it into a parser error: answered below
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def _end_head(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(408, "request_timeout", f"The request's headers did not arrive within {HEAD_TIMEOUT_S:g}s.")

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._end_head()
        self._answer(status, code, message)

    def send_400_response(self, msg: str) -> None:
        refusal, self._refusal = self._refusal, None
        self._end_head()
        if refusal is not None:
            self._answer(*refusal)
        else:
            self._answer(400, "invalid_http_request",
                         f"{msg} Check the request line, headers and Content-Length.")

    def _answer(self, status: int, code: str, message: str) -> None:
        if self.transport.is_closing():
            return
        body = error_body(message, "invalid_request_error", code)
        head = [b"HTTP/1.1 %s\r\n" % STATUS_LINES[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


# uvicorn.Config/run keywords for the gateway, shared by the CLI and the tests' servers.
UVICORN_OPTIONS = {"loop": "uvloop", "http": GatewayHttpProtocol, "access_log": False, "proxy_headers": False}
