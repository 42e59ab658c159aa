"""Spans on the OTLP/HTTP wire: an ``ExportTraceServiceRequest`` (protobuf) built from derived
spans. The environment that says where to send them is read by :mod:`runwire.jobs.otlp_env`.

The bytes are written here directly, field by field (the message shapes of
``opentelemetry/proto/trace/v1/trace.proto`` and ``common/v1/common.proto``, 1.x; field numbers
in the names below), not by filling ``opentelemetry-proto`` message objects and serializing them:
measured on the same spans, filling messages (upb) costs ~2.6 µs a span where this writer costs
~1 µs, and the exporter's budget is a few µs a span (docs/benchmarks.md § Span export). The
wire is checked by the tests, which decode each request with ``opentelemetry-proto``
(``tests/jobs/test_export.py``) and read the spans back from a real Phoenix. No protobuf import
here: a process that exports loads none.

What is written: one ``ResourceSpans`` (the resource's attributes, the schema URL) holding one
``ScopeSpans`` (scope ``runwire`` with its version) holding the spans. Per span: trace, span and
parent ids, name, kind (``CLIENT`` for ``chat``, else ``INTERNAL``), start and end, attributes,
events, status. An attribute's value is a string, bool, int (int64), float (double) or a list
of those (an ``ArrayValue``); anything else is written as its ``str``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..core.envelope import Event
from ..core.native import load
from .otlp_env import OtlpSettings, parse_pairs, resource_of
from .spans import Span, SpanEvent, SpanTree

__all__ = ["NATIVE", "SCHEMA_URL", "Fold", "OtlpSettings", "encode_request", "encode_request_python",
           "parse_pairs", "resource_of", "span_fold"]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
"""The semantic conventions version the spans follow (GenAI attributes of 1.37: still
"Development", so pinned here and in the docs)."""
SCOPE = "runwire"

# tags: field number << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited)
_SPAN_TRACE_ID, _SPAN_SPAN_ID, _SPAN_PARENT = b"\x0a\x10", b"\x12\x08", b"\x22\x08"  # 1, 2, 4 (bytes)
_SPAN_NAME, _SPAN_KIND, _SPAN_TIMES = 0x2A, 0x30, struct.Struct("<BQBQ")  # 5; 6; 7 and 8 (fixed64)
_SPAN_ATTRIBUTE, _SPAN_EVENT, _SPAN_STATUS = 0x4A, 0x5A, 0x7A  # 9, 11, 15
_EVENT_TIME, _EVENT_NAME, _EVENT_ATTRIBUTE = struct.Struct("<BQ"), 0x12, 0x1A  # Span.Event 1, 2, 3
_STATUS_MESSAGE, _STATUS_CODE = 0x12, 0x18  # Status 2, 3
_KV_KEY, _KV_VALUE = 0x0A, 0x12  # KeyValue 1, 2
_ANY_STRING, _ANY_BOOL, _ANY_INT, _ANY_DOUBLE, _ANY_ARRAY = 0x0A, 0x10, 0x18, 0x21, 0x2A  # AnyValue 1–5
_ARRAY_VALUE = 0x0A  # ArrayValue 1
_REQUEST_RESOURCE_SPANS = 0x0A  # ExportTraceServiceRequest 1
_RESOURCE_SPANS_RESOURCE, _RESOURCE_SPANS_SCOPE_SPANS, _RESOURCE_SPANS_SCHEMA = 0x0A, 0x12, 0x1A  # 1, 2, 3
_RESOURCE_ATTRIBUTE = 0x0A  # Resource 1
_SCOPE_SPANS_SCOPE, _SCOPE_SPANS_SPAN, _SCOPE_SPANS_SCHEMA = 0x0A, 0x12, 0x1A  # 1, 2, 3
_SCOPE_NAME, _SCOPE_VERSION = 0x0A, 0x12  # InstrumentationScope 1, 2

_KINDS = {"invoke_agent": b"\x30\x01", "execute_tool": b"\x30\x01", "chat": b"\x30\x03"}  # INTERNAL, CLIENT
_STATUS_CODES = {"ok": 1, "error": 2}
_DOUBLE = struct.Struct("<Bd")
_SMALL = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    """A non-negative int as a protobuf varint (a negative one: its 64-bit two's complement)."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _head(tag: int, size: int) -> bytes:
    """A length-delimited field's tag (one byte) and length, without a call for a length below
    16 KiB (a span's bytes are mostly 128 B – 16 KiB: a two-byte varint)."""
    if size < 0x80:
        return bytes((tag, size))
    if size < 0x4000:
        return bytes((tag, size & 0x7F | 0x80, size >> 7))
    return bytes((tag,)) + _varint(size)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (``tag``: its field number and wire type 2, one byte)."""
    return _head(tag, len(data)) + data


def _string(tag: int, text: str) -> bytes:
    return _field(tag, text.encode())


def _value(value: Any) -> bytes:
    """An ``AnyValue``'s bytes."""
    if isinstance(value, str):
        return _field(_ANY_STRING, value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return bytes((_ANY_INT,)) + _varint(value)
    if isinstance(value, float):
        return _DOUBLE.pack(_ANY_DOUBLE, value)
    if isinstance(value, list | tuple):
        return _field(_ANY_ARRAY, b"".join([_field(_ARRAY_VALUE, _value(item)) for item in value]))
    return _field(_ANY_STRING, str(value).encode())


_KEYS: dict[str, bytes] = {}
"""Each attribute key's field, written once (keys are the code's names: a few dozen)."""
_MAX_KEYS = 1024
_SPAN_ATTRIBUTES: dict[tuple[str, Any], bytes] = {}
"""A span attribute's field by its key and value, for values written often (a run's id, a tool's
name, an operation: most of a span's attributes): a few thousand short ones (≤ ~2.5 MB), the
whole table cleared when full. Content (long strings) and lists are never kept."""
_MAX_SPAN_ATTRIBUTES = 4096
_KEPT_CHARS = 256


def _key(key: str) -> bytes:
    head = _KEYS.get(key)
    if head is None:
        head = _string(_KV_KEY, key)
        if len(_KEYS) < _MAX_KEYS and len(key) <= _KEPT_CHARS:
            _KEYS[key] = head
    return head


_SHORT_STRING = [bytes((_KV_VALUE, n + 2, _ANY_STRING, n)) for n in range(0x7E)]
"""The value's head of a string attribute of ``n`` < 126 bytes (``AnyValue`` in ``KeyValue.value``)."""
_SMALL_INT = [bytes((_KV_VALUE, 2, _ANY_INT, n)) for n in range(0x80)]
"""A whole ``KeyValue.value`` holding an int below 128."""


def _pair(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message's bytes (short strings and small ints without a call more)."""
    kind = type(value)
    if kind is str:
        data: bytes = value.encode()
        if len(data) < 0x7E:
            return _key(key) + _SHORT_STRING[len(data)] + data
        return _key(key) + _field(_KV_VALUE, _field(_ANY_STRING, data))
    if kind is int and 0 <= value < 0x80:
        small: bytes = _SMALL_INT[value]
        return _key(key) + small
    return _key(key) + _field(_KV_VALUE, _value(value))


def _attribute(tag: int, key: str, value: Any) -> bytes:
    """One attribute: a ``KeyValue`` in field ``tag`` of the message holding it."""
    pair = _pair(key, value)
    return _head(tag, len(pair)) + pair


def _event(event: SpanEvent) -> bytes:
    return _field(_SPAN_EVENT, _EVENT_TIME.pack(0x09, event.time_ns) + _string(_EVENT_NAME, event.name)
                  + b"".join([_attribute(_EVENT_ATTRIBUTE, k, v) for k, v in event.attributes.items()]))


_HEADS: dict[tuple[str, str | None, str, str], bytes] = {}
"""A span's trace id, parent id, name and kind fields by those four (a run's spans share its
trace and parent; names are a bounded few: ``execute_tool {tool}``, ``chat {model}``), cleared
when full."""
_MAX_HEADS = 4096


def _span_head(trace: str, parent: str | None, name: str, operation: str) -> bytes:
    return (_SPAN_TRACE_ID + bytes.fromhex(trace) + (_SPAN_PARENT + bytes.fromhex(parent) if parent else b"")
            + _string(_SPAN_NAME, name) + _KINDS[operation])


def encode_request_python(spans: Sequence[Span], resource: Mapping[str, str], version: str = "") -> bytes:
    """One ``ExportTraceServiceRequest`` carrying ``spans`` (all ended), serialized: the pure-Python
    twin of ``runwire.jobs._otlp.encode_request`` (:data:`encode_request` is whichever of the two runs).

    One loop, no call per span or attribute when what it writes was written before: a span's
    trace, parent, name and kind fields in one piece by those four (:data:`_HEADS`), and each
    short string or int attribute's whole field (through :data:`_SPAN_ATTRIBUTES`; not bools:
    ``True == 1``); a span's bytes are joined once, its length's head beside them."""
    body = []
    heads, kept, times, fromhex = _HEADS, _SPAN_ATTRIBUTES, _SPAN_TIMES.pack, bytes.fromhex
    for span in spans:
        if span.end_ns is None:
            raise ValueError("only ended spans are exported")
        key = (span.trace_id, span.parent_span_id, span.name, span.operation)
        head = heads.get(key)
        if head is None:
            head = _span_head(*key)
            if len(heads) >= _MAX_HEADS:
                heads.clear()
            if len(span.name) <= _KEPT_CHARS:
                heads[key] = head
        parts = [head, _SPAN_SPAN_ID, fromhex(span.span_id), times(0x39, span.start_ns, 0x41, span.end_ns)]
        for item in span.attributes.items():
            value = item[1]
            kind = type(value)
            if kind is str and len(value) <= _KEPT_CHARS or kind is int:
                found = kept.get(item)
                if found is None:
                    found = _attribute(_SPAN_ATTRIBUTE, *item)
                    if len(kept) >= _MAX_SPAN_ATTRIBUTES:
                        kept.clear()
                    kept[item] = found
                parts.append(found)
            else:
                parts.append(_attribute(_SPAN_ATTRIBUTE, *item))
        if span.events:
            parts += [_event(event) for event in span.events]
        if span.status != "unset":
            status = _string(_STATUS_MESSAGE, span.status_message) if span.status_message else b""
            parts.append(_field(_SPAN_STATUS, status + bytes((_STATUS_CODE, _STATUS_CODES[span.status]))))
        data = b"".join(parts)
        size = len(data)  # most spans: 128 B – 16 KiB, a two-byte length
        body.append(bytes((_SCOPE_SPANS_SPAN, size & 0x7F | 0x80, size >> 7)) if 0x80 <= size < 0x4000
                    else _head(_SCOPE_SPANS_SPAN, size))
        body.append(data)
    scope = _string(_SCOPE_NAME, SCOPE) + (_string(_SCOPE_VERSION, version) if version else b"")
    scope_spans = _field(_SCOPE_SPANS_SCOPE, scope) + b"".join(body) + _string(_SCOPE_SPANS_SCHEMA, SCHEMA_URL)
    attributes = b"".join([_attribute(_RESOURCE_ATTRIBUTE, key, value) for key, value in resource.items()])
    resource_spans = (_field(_RESOURCE_SPANS_RESOURCE, attributes) + _field(_RESOURCE_SPANS_SCOPE_SPANS, scope_spans)
                      + _string(_RESOURCE_SPANS_SCHEMA, SCHEMA_URL))
    return _field(_REQUEST_RESOURCE_SPANS, resource_spans)


_compiled = load("jobs._otlp", "span export")
NATIVE = _compiled is not None
"""Whether the compiled twins run: :data:`encode_request` and, content off, :func:`span_fold`'s
fold (``runwire.jobs._otlp``: the same bytes as the Python twins)."""
encode_request = encode_request_python
if _compiled is not None:
    encode_request = _compiled.encode_request


class Fold(Protocol):
    """What the exporter folds a root run's stream with: :class:`SpanTree` or its compiled twin."""

    @property
    def last_seq(self) -> int: ...

    @property
    def is_open(self) -> bool: ...

    def apply_many(self, events: Sequence[Event], past: int = 0) -> list[Any]:
        """The spans the events ended past ``past``: what :data:`encode_request` takes (a
        :class:`Span`, or the compiled fold's bytes of one)."""
        ...


def span_fold(root_id: str, content: bool) -> Fold:
    """The exporter's fold of a root run: the compiled twin of ``SpanTree(root_id, keep=False)``
    where it was built and content is off, else that SpanTree itself."""
    if _compiled is not None and not content:
        fold: Fold = _compiled.SpanFold(root_id)
        return fold
    return SpanTree(root_id, content=content, keep=False)
