"""OpenAI-style error objects, so clients written for the OpenAI API can read our errors."""

from __future__ import annotations

import orjson

# error.type values, as the OpenAI API and vLLM use them.
INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
INSUFFICIENT_QUOTA = "insufficient_quota"  # a budget is spent (OpenAI's error when a plan's quota is)
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
UPSTREAM = "upstream_error"
SERVER = "server_error"  # the gateway itself cannot take the request now (overloaded)

CLIENT_CLOSED = 499  # nginx's convention for "client went away before the answer was complete"


class GatewayError(Exception):
    """A failure the gateway answers itself, with an HTTP status and an actionable message.

    ``code`` is a short stable identifier (it also labels the rejected-requests metric), so
    it must come from a small fixed set, never from user input.
    """

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 error_type: str = INVALID_REQUEST, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.error_type = error_type
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.code, self.param)


def error_body(message: str, error_type: str, code: str | int | None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


def stream_error_event(message: str, code: str) -> bytes:
    """The terminating SSE event for a stream that cannot complete.

    The ``openai`` client raises ``APIError`` when a chunk carries an ``error`` key, so a
    client learns the stream failed instead of mistaking a truncated answer for a short one.
    """
    return b"data: " + error_body(message, UPSTREAM, code) + b"\n\n"


STATUS_CLASSES = ("2xx", "4xx", "5xx")  # what the gateway answers (499 included); series made at 0


def status_class(status: int) -> str:
    return f"{status // 100}xx"
