"""Finished spans written straight to OTLP's protobuf wire format, for the export on the loop.

The SDK's encoder builds a protobuf object per span, per attribute and per value, then
serializes them, and groups spans by hashing their resource (which hashes a JSON dump of
its attributes, each time). With 10 % of traces that was a quarter of the gateway's loop
time for a traced request and most of its p99 over untraced ones (bench/gateway_overhead.py).
Here a span's fields are written as bytes in one pass, and the resource's and scope's
messages, the same for every span of a gateway, are serialized once and kept.

What this writes parses to the message the SDK's ``encode_spans`` builds, field for field
(tests/serving/test_span_wire.py compares them). Anything outside what it knows (an
attribute value of another type, an integer beyond int64, a string that is not valid
UTF-8) raises ``Unencodable``, and the caller encodes those spans with the SDK's encoder,
which drops the attribute it cannot encode and keeps the span.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

# proto wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
# Span.flags: the context's is-remote bit is known (0x100), and set when it is remote (0x200)
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_MAX_CACHED = 64  # resources and scopes kept encoded; a gateway has one of each


class Unencodable(ValueError):
    """A span holds something this encoder does not write; the SDK's encoder should."""


def _tag(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64  # int64 as its two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]
# tags of length-delimited fields 1-16, by field number
_LEN_TAG = [b""] + [_tag(field, _LEN) for field in range(1, 17)]


def _len(field: int, payload: bytes) -> bytes:
    n = len(payload)
    return _LEN_TAG[field] + (_SMALL[n] if n < 0x80 else _varint(n)) + payload


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise Unencodable(f"not UTF-8: {exc}") from exc


def _fixed64(field: int, n: int) -> bytes:
    return _tag(field, _I64) + _U64.pack(n)


_U64, _U32, _F64 = struct.Struct("<Q"), struct.Struct("<I"), struct.Struct("<d")
# AnyValue's fields are a oneof: written even when they hold the default (false, 0, "")
_STRING, _BOOL, _INT, _DOUBLE, _ARRAY, _KVLIST, _BYTES = (_tag(f, w) for f, w in (
    (1, _LEN), (2, _VARINT), (3, _VARINT), (4, _I64), (5, _LEN), (6, _LEN), (7, _LEN)))
_TRUE, _FALSE = _BOOL + b"\x01", _BOOL + b"\x00"
_KIND_FIELD = {kind: _tag(6, _VARINT) + _varint(value) for kind, value in _KIND.items()}
_START, _END = _tag(7, _I64), _tag(8, _I64)
_FLAGS = {remote: _tag(16, _I32) + _U32.pack(_HAS_IS_REMOTE | (_IS_REMOTE if remote else 0))
          for remote in (False, True)}
_LINK_FLAGS = {remote: _tag(6, _I32) + _U32.pack(_HAS_IS_REMOTE | (_IS_REMOTE if remote else 0))
               for remote in (False, True)}


def _any_value(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        raw = _utf8(value)
        n = len(raw)
        return _STRING + (_SMALL[n] if n < 0x80 else _varint(n)) + raw
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise Unencodable(f"integer beyond int64: {value}")
        return _INT + _varint(value)
    if isinstance(value, float):
        return _DOUBLE + _F64.pack(value)
    if isinstance(value, bytes):
        return _BYTES + _varint(len(value)) + value
    if isinstance(value, Sequence):
        items = b"".join([_len(1, _any_value(v)) for v in value])
        return _ARRAY + _varint(len(items)) + items
    if isinstance(value, Mapping):
        items = b"".join([_len(1, _key_value(str(k), v)) for k, v in value.items()])
        return _KVLIST + _varint(len(items)) + items
    raise Unencodable(f"attribute value of type {type(value).__name__}")


_KEYS: dict[str, bytes] = {}  # attribute keys, encoded: a gateway uses a few dozen
_MAX_KEYS = 1024


def _key_value(key: str, value: Any) -> bytes:
    encoded = _KEYS.get(key)
    if encoded is None:
        encoded = _len(1, _utf8(key)) if key else b""
        if len(_KEYS) < _MAX_KEYS:
            _KEYS[key] = encoded
    return encoded + _len(2, _any_value(value))


def _attributes(field: int, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    return b"".join([_len(field, _key_value(key, value)) for key, value in attributes.items()])


def _count(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + _varint(n) if n else b""


def _string(field: int, text: str | None) -> bytes:
    return _len(field, _utf8(text)) if text else b""


def _trace_state(context: SpanContext) -> str:
    state = context.trace_state
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else ""


def span(s: ReadableSpan) -> bytes:
    """One ``Span`` message, without its field tag."""
    context = s.get_span_context()
    if context is None:
        raise Unencodable("a span without a context")
    parent = s.parent
    parts = [_len(1, context.trace_id.to_bytes(16, "big")), _len(2, context.span_id.to_bytes(8, "big")),
             _string(3, _trace_state(context))]
    if parent is not None:
        parts.append(_len(4, parent.span_id.to_bytes(8, "big")))
    parts += [_string(5, s.name), _KIND_FIELD[s.kind]]
    if s.start_time:
        parts.append(_START + _U64.pack(s.start_time))
    if s.end_time:
        parts.append(_END + _U64.pack(s.end_time))
    parts += [_attributes(9, s.attributes), _count(10, s.dropped_attributes)]
    for event in s.events:
        body = ((_fixed64(1, event.timestamp) if event.timestamp else b"") + _string(2, event.name)
                + _attributes(3, event.attributes) + _count(4, event.dropped_attributes))
        parts.append(_len(11, body))
    parts.append(_count(12, s.dropped_events))
    for link in s.links:
        body = (_len(1, link.context.trace_id.to_bytes(16, "big")) + _len(2, link.context.span_id.to_bytes(8, "big"))
                + _attributes(4, link.attributes) + _count(5, link.dropped_attributes)
                + _LINK_FLAGS[link.context.is_remote])
        parts.append(_len(13, body))
    parts.append(_count(14, s.dropped_links))
    status = s.status
    parts.append(_len(15, _string(2, status.description) + _count(3, status.status_code.value)))
    parts.append(_FLAGS[parent is not None and parent.is_remote])
    return b"".join(parts)


def _resource(resource: Resource) -> bytes:
    return _attributes(1, resource.attributes)


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    return _string(1, scope.name) + _string(2, scope.version) + _attributes(3, scope.attributes)


class SpanWriter:
    """Writes ``ExportTraceServiceRequest`` bytes; keeps each resource's and scope's
    messages encoded, by identity (a Resource's hash serializes its attributes); a gateway
    has one of each, so they are written once."""

    def __init__(self) -> None:
        self._encoded: dict[int, tuple[object, bytes]] = {}  # id → (the object, kept alive; its bytes)

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        """Grouped as the SDK groups them: by resource, then by scope (by identity here, by
        equality there: the same for spans of one tracer provider)."""
        resources: dict[int, tuple[Resource, dict[int, tuple[InstrumentationScope | None, list[bytes]]]]] = {}
        for s in spans:
            resource, scope = s.resource, s.instrumentation_scope
            scopes = resources.setdefault(id(resource), (resource, {}))[1]
            scopes.setdefault(id(scope), (scope, []))[1].append(_len(2, span(s)))
        out = []
        for resource, scopes in resources.values():
            scope_spans = b"".join(
                _len(2, _len(1, self._cached(scope, _scope)) + b"".join(encoded)
                     + _string(3, scope.schema_url if scope else None))
                for scope, encoded in scopes.values())
            out.append(_len(1, _len(1, self._cached(resource, _resource)) + scope_spans
                            + _string(3, resource.schema_url)))
        return b"".join(out)

    def _cached(self, obj: Any, encode: Callable[[Any], bytes]) -> bytes:
        hit = self._encoded.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self._encoded) >= _MAX_CACHED:
            self._encoded.clear()
        encoded: bytes = encode(obj)
        self._encoded[id(obj)] = (obj, encoded)
        return encoded
