"""Reading and writing the canonical envelope: bounded decoding, encoding, building events.

The Structs themselves (Koder agent stream §2–3: the eight core types, runwire's
typed extensions, :class:`Extension`) are in :mod:`.events` and re-exported
here, so ``runwire.core.envelope`` stays the one import for events. This module
decodes with the limits every entrance shares (nesting depth, frame size,
real timestamps — the same at ingest and in the worker), reports a bad frame
as ``KAI-STREAM-PROTO-0001`` naming the field, and encodes each event once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import msgspec
from msgspec import UNSET

from .errors import MalformedFrame, ProtocolError, UnknownEventType
from .events import (
    _TS_RE,
    CORE_TYPES,
    DELTA_TYPES,
    EVENT_CLASSES,
    INT64_MAX,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MAX_ID_CHARS,
    PAYLOAD_CLASSES,
    TERMINAL_STATES,
    TYPED,
    ChildSpawn,
    ChildSpawnPayload,
    Count,
    Envelope,
    Event,
    EventId,
    Extension,
    Gap,
    GapPayload,
    LifecycleState,
    Plan,
    PlanProposal,
    PlanProposalPayload,
    PlanStep,
    ReasoningDelta,
    RunId,
    RunLifecycle,
    RunLifecyclePayload,
    RunRef,
    Seq,
    StepBoundary,
    StepBoundaryPayload,
    StepIntent,
    StepKind,
    TextDelta,
    TextPayload,
    Timestamp,
    ToolEnd,
    ToolEndPayload,
    ToolStart,
    ToolStartPayload,
    Usage,
    UsagePayload,
    _TypedEvent,
    all_ts_match,
    format_ts,
    is_extension_type,
    is_terminal,
    known,
    now_ts,
    parse_ts,
    replace,
    to_builtins,
    ts_ms,
)
from .joined import deep_candidates, deep_lines, may_be_deep

__all__ = [
    "CORE_TYPES", "ChildSpawn", "ChildSpawnPayload", "Count", "DELTA_TYPES", "EVENT_CLASSES",
    "Envelope", "Event", "EventId", "Extension", "Gap", "GapPayload", "INT64_MAX",
    "LifecycleState", "MAX_DEPTH", "MAX_FRAME_BYTES", "MAX_ID_CHARS", "Plan", "PlanProposal",
    "PlanProposalPayload", "PlanStep", "ReasoningDelta", "RunId", "RunLifecycle",
    "RunLifecyclePayload", "RunRef", "Seq", "StepBoundary", "StepBoundaryPayload", "StepIntent",
    "StepKind", "TERMINAL_STATES", "TYPED", "TextDelta", "TextPayload", "Timestamp", "ToolEnd",
    "ToolEndPayload", "ToolStart", "ToolStartPayload", "Usage", "UsagePayload", "check",
    "check_encoded", "decode", "decode_lines", "decode_many", "encode", "format_ts",
    "from_builtins", "is_extension_type", "is_terminal", "is_timestamp", "is_too_deep", "known",
    "make", "now_ts", "parse_ts", "replace", "to_builtins", "ts_ms",
]

_FREE_FORM_TYPES = (ToolStart, ToolEnd, Extension)
_FREE_FORM: frozenset[type] = frozenset(_FREE_FORM_TYPES)
"""Event types with free-form JSON in their payload (besides ``ext``, which any event may have)."""
FREE_FORM = _FREE_FORM
"""The same, for the publisher: without ``ext``, no other event can be too deep, so
:func:`check_encoded` of any other is only its size check."""

_decoder = msgspec.json.Decoder(_TypedEvent)
_ext_decoder = msgspec.json.Decoder(Extension)
_many_decoder = msgspec.json.Decoder(list[_TypedEvent])
_encoder = msgspec.json.Encoder()
_type_probe = msgspec.json.Decoder(dict[str, Any])
_NAMED_FIELD_RE = re.compile(r"^Object (?:missing required|contains unknown) field `([^`]*)`")


def _field_of(message: str) -> tuple[str, str | None]:
    """msgspec's message and the JSON path of the field it is about.

    "Object missing required field `x` - at `$.payload`" names ``$.payload.x``;
    an unknown or missing top-level field (no "at") names ``$.<field>``, and
    any other message without "at" is about the whole frame, ``$``.
    """
    text, path = message, "$"
    if " - at `" in message:
        text, _, raw_path = message.rpartition(" - at `")
        path = raw_path.rstrip("`")
    named = _NAMED_FIELD_RE.match(text)
    if named:
        path = f"{path}.{named.group(1)}"
    return text, path


def decode(
    frame: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES, max_depth: int | None = MAX_DEPTH
) -> Event:
    """Decode and validate one canonical JSON frame.

    Raises ``MalformedFrame`` (KAI-STREAM-PROTO-0001) for bad JSON, a missing
    or mistyped field, a number out of its range, a frame over ``max_bytes``
    or nested deeper than :data:`MAX_DEPTH`; ``UnknownEventType``
    (KAI-STREAM-PROTO-0002) for a type that is neither core nor ``x.*``.
    ``max_depth=None`` skips the nesting limit: for events runwire stored
    itself, which an older release may have accepted deeper.
    """
    if len(frame) > max_bytes:
        raise MalformedFrame(f"frame is {len(frame)} bytes, over the {max_bytes}-byte limit")
    try:
        event: Event = _decoder.decode(frame)
    except msgspec.ValidationError as exc:
        text, path = _field_of(str(exc))
        if path == "$.type" or text.startswith("Object missing required field `type`"):
            return _check_depth(_check_ts(_decode_extension(frame, text, path)), frame, max_depth)
        raise MalformedFrame(text, field=path) from None
    except msgspec.DecodeError as exc:
        raise MalformedFrame(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep() from None
    if _TS_RE.match(event.ts) is None:
        _check_ts(event)
    if max_depth is not None and (type(event) in _FREE_FORM or event.ext is not None):
        _check_depth(event, frame, max_depth)
    return event


_E = TypeVar("_E", bound=Envelope | Extension)


def _check_ts(event: _E) -> _E:
    if not _TS_RE.match(event.ts):
        raise MalformedFrame(f"`ts` is not an RFC 3339 timestamp: {event.ts!r}", field="$.ts")
    return event


def _too_deep(limit: int = MAX_DEPTH) -> MalformedFrame:
    return MalformedFrame(f"frame is nested deeper than {limit} levels", field="$.payload")


def _may_be_deep(frame: bytes | str, limit: int = MAX_DEPTH) -> bool:
    return may_be_deep(frame, limit)


def _check_depth(event: _E, frame: bytes | str, limit: int | None) -> _E:
    if limit is not None and _may_be_deep(frame, limit) and is_too_deep(event, limit):
        raise _too_deep(limit)
    return event


def _deep_candidates(events: list[Any]) -> list[int]:
    """Indexes of events with free-form JSON fields (the only ones that can nest deeply)."""
    return deep_candidates(events, _FREE_FORM_TYPES)


def _deeper_than(value: Any, depth: int, limit: int) -> bool:
    """Whether JSON data at nesting level ``depth`` reaches below level ``limit`` (no recursion)."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if type(item) is dict:
            children: Any = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        if level > limit:
            return True
        stack.extend((child, level + 1) for child in children if type(child) in (dict, list))
    return False


def is_too_deep(event: Envelope | Extension, limit: int = MAX_DEPTH) -> bool:
    """Whether the event's canonical JSON nests deeper than ``limit`` (:data:`MAX_DEPTH`).

    Only fields of free-form JSON can nest: ``ext``, an extension's payload,
    a tool's ``input``, ``output`` and ``error`` (levels as in the frame: the
    envelope is 1, ``payload`` and ``ext`` are 2).
    """
    if event.ext is not None and _deeper_than(event.ext, 2, limit):
        return True
    if type(event) is Extension:
        return _deeper_than(event.payload, 2, limit)
    if type(event) is ToolStart:
        return _deeper_than(event.payload.input, 3, limit)
    if type(event) is ToolEnd:
        payload = event.payload
        return _deeper_than(payload.output, 3, limit) or _deeper_than(payload.error, 3, limit)
    return False


def is_timestamp(value: object) -> bool:
    """True for a string the envelope accepts as ``ts``."""
    return isinstance(value, str) and len(value) <= 40 and _TS_RE.match(value) is not None


def check(event: Event, *, max_bytes: int = MAX_FRAME_BYTES) -> Event:
    """``event`` as a worker will read it, or the error a worker would dead-letter it with.

    Events built in code (ingest codecs, the SDK) skip the decoder's bounds;
    this encodes and decodes them with the very limits the worker applies, so
    ingest refuses what a worker could not carry.
    """
    try:
        frame = _encoder.encode(event)
    except (OverflowError, RecursionError, TypeError) as exc:
        raise MalformedFrame(f"event cannot be encoded: {exc}") from None
    checked = decode(frame, max_bytes=max_bytes)
    ts_ms(checked.ts)  # the pattern admits month 13; a worker needs a real instant
    return checked


def check_encoded(event: Event, frame: bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> None:
    """The decoder's size and nesting limits for an event built and encoded in code (no decode).

    For the publisher SDK, which encodes every event anyway: an event a
    worker would dead-letter is refused at ``emit`` instead.
    """
    if len(frame) > max_bytes:
        raise MalformedFrame(f"event is {len(frame)} bytes encoded, over the {max_bytes}-byte limit")
    if (type(event) in _FREE_FORM or event.ext is not None) and _may_be_deep(frame) and is_too_deep(event):
        raise _too_deep()


def decode_lines(frames: bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> list[Event | ProtocolError]:
    """Decode a batch of newline-delimited canonical frames (the bus reads batches).

    A batch whose lines are all within ``max_bytes`` goes through msgspec's
    ``decode_lines`` in one call; when that fails (an extension type, a bad
    frame) or a line is too big, its lines are decoded one by one. Each result is the event or the
    :class:`ProtocolError` for that line, in input order; blank lines are
    skipped.
    """
    if len(frames) <= max_bytes or max(map(len, frames.split(b"\n"))) <= max_bytes:
        try:
            events = cast("list[Event | ProtocolError]", _decoder.decode_lines(frames))  # as decoded: no copy
            stamps = {event.ts for event in events}  # type: ignore[union-attr]
            if all(map(_TS_RE.match, stamps)) and not any(
                is_too_deep(events[i]) for i in _deep_candidates(events)  # type: ignore[arg-type]
            ):
                return events
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            pass
    out: list[Event | ProtocolError] = []
    for line in frames.splitlines():
        if not line.strip():
            continue
        try:
            out.append(decode(line, max_bytes=max_bytes))
        except ProtocolError as exc:
            out.append(exc)
    return out


def decode_many(
    frames: Sequence[bytes], *, max_bytes: int = MAX_FRAME_BYTES, max_depth: int | None = MAX_DEPTH
) -> list[Event | ProtocolError]:
    """Decode separate frames: exactly one result per frame, the event or its error, in order.

    When every frame is a one-line canonical frame (what publishers write),
    the batch goes through one msgspec call (:func:`decode_joined`); otherwise, or when any frame
    fails, each frame is decoded alone, so a bad frame affects only its own
    result. (Unlike :func:`decode_lines`, nothing is skipped.) The limits are
    those of :func:`decode`; the depth limit costs a bracket count per frame.
    """
    if frames and max(map(len, frames)) <= max_bytes:
        events = decode_joined(b"\n".join(frames), len(frames), max_depth=max_depth, frames=frames)
        if events is not None:
            return events
    out: list[Event | ProtocolError] = []
    for frame in frames:
        try:
            out.append(decode(frame, max_bytes=max_bytes, max_depth=max_depth))
        except ProtocolError as exc:
            out.append(exc)
    return out


def decode_joined(
    joined: bytes, count: int, *, max_depth: int | None = MAX_DEPTH,
    frames: Sequence[bytes] | None = None,
) -> list[Event | ProtocolError] | None:
    """The ``count`` events of canonical frames joined by newlines (each frame within the size
    limit: the caller checks; ``frames``, when the caller has them apart), in one msgspec call;
    a too-deep event's result is its error. None when the frames need decoding one by one
    (not ``count`` lines, or one fails)."""
    try:
        events = cast("list[Event | ProtocolError]", _decoder.decode_lines(joined))
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if len(events) != count or not all_ts_match(events):
        return None
    candidates = [] if max_depth is None else _deep_candidates(events)
    if frames is None:  # (one pass over the lines: as many as the events, and which may be deep)
        deep = deep_lines(joined, count, candidates, max_depth or 0)
        if deep is None:
            return None
    elif len(frames) != count or joined.count(b"\n") != count - 1:
        return None
    else:
        deep = [index for index in candidates if _may_be_deep(frames[index], max_depth or 0)]
    for index in deep:
        if is_too_deep(events[index], max_depth):  # type: ignore[arg-type]
            events[index] = _too_deep(max_depth)  # type: ignore[arg-type]
    return events


def _decode_extension(frame: bytes | str, text: str, path: str | None) -> Extension:
    try:
        raw = _type_probe.decode(frame)
    except msgspec.DecodeError as exc:
        raise MalformedFrame(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep() from None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise MalformedFrame("missing or non-string `type`", field="$.type")
    if not is_extension_type(kind):
        raise UnknownEventType(
            f"unknown event type {kind!r}; core types are {', '.join(EVENT_CLASSES)}"
            " and extensions are named x.<namespace>.<name>",
            field="$.type",
        )
    try:
        return _ext_decoder.decode(frame)
    except RecursionError:
        raise _too_deep() from None
    except msgspec.ValidationError as exc:
        text, path = _field_of(str(exc))
        raise MalformedFrame(text, field=path) from None


def encode(event: Event) -> bytes:
    """Encode one event as canonical JSON bytes."""
    return _encoder.encode(event)


def from_builtins(data: Mapping[str, Any]) -> Event:
    """Validate a plain dict (as decoded JSON) into an event."""
    return decode(_encoder.encode(data))


def make(
    type: str,
    payload: Mapping[str, Any] | msgspec.Struct,
    *,
    id: str,
    ts: str,
    run_id: str,
    seq: int,
    **envelope: Any,
) -> Event:
    """Build an event from a type name and payload, validating the payload.

    Raises the same errors as :func:`decode` for an unknown type or bad payload.
    ``child_id=None`` leaves the field absent, as in :func:`replace`.
    """
    if "child_id" in envelope:
        child = envelope.pop("child_id")
        envelope["child_ref"] = UNSET if child is None else child
    cls = EVENT_CLASSES.get(type)
    if cls is None:
        if not is_extension_type(type):
            raise UnknownEventType(f"unknown event type {type!r}", field="$.type")
        data = payload if isinstance(payload, Mapping) else msgspec.to_builtins(payload)
        return Extension(
            id=id, ts=ts, type=type, run_id=run_id, seq=seq, payload=dict(data), **envelope
        )
    payload_cls = PAYLOAD_CLASSES[type]
    if not isinstance(payload, payload_cls):
        try:
            payload = msgspec.convert(payload, payload_cls)
        except msgspec.ValidationError as exc:
            text, path = _field_of(str(exc))
            raise MalformedFrame(
                f"{type}: {text}", field=(path or "$").replace("$", "$.payload", 1)
            ) from None
    event: Event = cls(id=id, ts=ts, run_id=run_id, seq=seq, payload=payload, **envelope)  # type: ignore[call-arg, assignment]
    return event

