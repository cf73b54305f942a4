"""Integers as JSON has them, for strict pydantic models of request bodies."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _integral(value: object) -> object:
    """JSON has one kind of number: 2.0 is the integer 2, as JSON Schema's ``integer`` says."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def json_int(**constraints: Any) -> Any:
    """An integer of a strict model, 2.0 included, never ``true``. The constraints go inside,
    before the conversion, or the JSON schema would not show them as minimum and maximum."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]
