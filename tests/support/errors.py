"""What every 4xx of inferwatch's services must carry, as a schemathesis check."""

from __future__ import annotations


def error_names_what_was_wrong(ctx, response, case) -> None:
    """A 4xx is a JSON error object (the services' and OpenAI's shape) whose message is a
    sentence a person can act on, and names the field when it blames one."""
    if not 400 <= response.status_code < 500:
        return
    error = response.json().get("error")
    assert isinstance(error, dict), f"{response.status_code} without an error object: {response.text[:200]}"
    message = error.get("message")
    assert isinstance(message, str) and len(message) >= 15, f"{response.status_code} with message {message!r}"
    assert error.get("code"), f"{response.status_code} without an error code: {error}"
    field = error.get("field") or error.get("param")
    if field:
        assert str(field).split(".")[-1] in message, f"message does not name the field {field!r}: {message!r}"
