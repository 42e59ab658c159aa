"""The canonical envelope (Koder agent stream §2–3) as msgspec Structs.

Every event is one JSON object ``{id, ts, type, run_id, child_id, seq, payload}``.
Each of the eight core types is a tagged Struct with a typed payload, so one
decoder reads the tag and validates the matching shape in a single pass.

Extensions (documented in ``docs/protocols.md``):

* ``x.<namespace>.<name>`` types carry events of the other protocol documents
  that have no core type (``x.loom.node_enter``, ``x.cogency.execute``,
  ``x.mcp.await_questions`` …). Their payload is a JSON object kept verbatim.
  ``x.usage`` (token usage) and ``x.gap`` (a publisher seq gap, §7 T2) are
  runwire's own and typed.
* ``ext`` (envelope, optional): fields of a source format that have no
  canonical home, keyed by format name, so that F → koder → F is lossless.
* ``span`` (envelope, optional): on a shaped event, the raw seq range
  ``[first, last]`` it covers (§4 R1).
* ``parent_id`` / ``root_id`` (envelope, optional): set by the publisher SDK on
  a child run's events so workers can fan them in.
* ``tenant`` (envelope, optional): the tenant a run belongs to (auth, listing,
  retention overrides).
* ``thread_id`` (envelope, optional): the chat/thread a run answers (AI SDK
  ``chatId``); a run's own events carry it, so a thread's runs can be found.

Unknown fields are rejected, not dropped: a frame either round-trips exactly
or fails with ``KAI-STREAM-PROTO-0001`` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import compress
from operator import attrgetter
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from .errors import MalformedFrame, ProtocolError, UnknownEventType

MAX_FRAME_BYTES = 1 << 20
"""Default size limit of one encoded frame (1 MiB)."""
MAX_DEPTH = 64
"""Deepest JSON nesting of a frame (the envelope object is level 1, its ``payload`` level 2).

Checked wherever a frame is decoded (HTTP ingest, workers, the edge, imports):
deeper values are what make recursive code downstream (egress encoders,
``copy.deepcopy``) raise ``RecursionError``."""
INT64_MAX = (1 << 63) - 1
"""Largest integer any numeric envelope or payload field may hold (checkpoints and
the replay log store them as signed 64-bit)."""
MAX_ID_CHARS = 256
"""Longest run id, parent/root/child id or tenant."""

_TS_PATTERN = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z"
_TS_RE = re.compile(_TS_PATTERN, re.ASCII)  # ASCII digits only; \Z: no trailing newline
_EXT_TYPE_RE = re.compile(r"^x\.[a-z0-9_-]+(\.[A-Za-z0-9_.-]+)*$")

Timestamp = Annotated[str, msgspec.Meta(min_length=10, max_length=40)]
"""An RFC 3339 timestamp. The pattern is checked by :func:`decode` /
:func:`decode_lines` after msgspec's pass rather than as a ``Meta(pattern=)``
constraint: msgspec calls back into Python's ``re`` for every value, which
cost more than the rest of decoding together; checked afterwards, the same
regex runs once per *distinct* timestamp of a batch."""
EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
RunId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
RunRef = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
"""A run named by another field (``child_id``, ``parent_id``, ``root_id``), a tenant or a thread."""
Seq = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
"""A non-negative integer field (indexes, durations, token counts): the same bounds as ``seq``."""

LifecycleState = Literal[
    "planning", "awaiting_approval", "running", "paused", "redirecting", "done", "aborted", "error"
]
TERMINAL_STATES: frozenset[str] = frozenset({"done", "aborted", "error"})
StepKind = Literal["plan", "tool-roundtrip", "text-only", "fan-out", "fan-in", "done"]
StepIntent = Literal["research", "write", "edit", "execute", "verify", "report", "other"]


class _Payload(
    msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False
):
    """Base of the typed payloads.

    ``gc=False`` (msgspec's perf tip): events hold JSON data only, which cannot
    form reference cycles, so the cycle collector need not track them; decoding
    a batch of events no longer triggers collections, which doubles batch
    decode throughput.
    """


class TextPayload(_Payload):
    text: str


class ToolStartPayload(_Payload):
    call_id: str
    tool: str
    input: Any | UnsetType = UNSET
    skill_id: str | None | UnsetType = UNSET


class ToolEndPayload(_Payload):
    call_id: str
    ok: bool
    output: Any | UnsetType = UNSET
    error: Any | UnsetType = UNSET
    duration_ms: Count | None | UnsetType = UNSET
    blob_ref: str | None | UnsetType = UNSET


class StepBoundaryPayload(_Payload):
    step_index: Count
    step_kind: StepKind
    checkpoint_id: str | None | UnsetType = UNSET


class ChildSpawnPayload(_Payload):
    child_id: str
    prompt: str | None | UnsetType = UNSET
    tools_allowed: list[str] | None | UnsetType = UNSET


class PlanStep(_Payload):
    id: str
    title: str
    intent: StepIntent = "other"
    est_tools: list[str] | None | UnsetType = UNSET
    est_cost_usd: float | None | UnsetType = UNSET


class Plan(_Payload):
    id: str
    steps: list[PlanStep]
    run_id: str | None | UnsetType = UNSET
    est_total_cost_usd: float | None | UnsetType = UNSET


class PlanProposalPayload(_Payload):
    plan: Plan


class RunLifecyclePayload(_Payload):
    state: LifecycleState
    reason: str | None | UnsetType = UNSET
    dropped_count: Count | None | UnsetType = UNSET


class UsagePayload(_Payload):
    input_tokens: Count = 0
    output_tokens: Count = 0
    total_tokens: Count = 0
    model: str | None | UnsetType = UNSET


class GapPayload(_Payload):
    """A publisher's seq jumped: events ``first``..``last`` of ``run_id`` never arrived."""

    run_id: str
    first: Seq
    last: Seq


class Envelope(
    msgspec.Struct,
    tag_field="type",
    forbid_unknown_fields=True,
    omit_defaults=True,
    kw_only=True,
    gc=False,
):
    """Fields every event shares. Concrete classes below fix ``type`` and ``payload``."""

    id: EventId
    ts: Timestamp
    run_id: RunId
    seq: Seq
    child_ref: RunRef | None | UnsetType = msgspec.field(default=UNSET, name="child_id")
    ext: dict[str, Any] | None = None
    span: tuple[Seq, Seq] | None = None
    parent_id: RunRef | None = None
    root_id: RunRef | None = None
    tenant: RunRef | None = None
    thread_id: RunRef | None = None

    type_name: ClassVar[str] = ""

    @property
    def type(self) -> str:
        return self.type_name

    @property
    def child_id(self) -> str | None:
        """The child run this event came from, ``None`` when it is the run's own (absent or null)."""
        return None if self.child_ref is UNSET else self.child_ref

    def payload_dict(self) -> dict[str, Any]:
        """The payload as plain JSON-ready data."""
        return msgspec.to_builtins(self.payload)  # type: ignore[attr-defined, no-any-return]


class ReasoningDelta(Envelope, tag="reasoning.delta"):
    type_name: ClassVar[str] = "reasoning.delta"
    payload: TextPayload


class TextDelta(Envelope, tag="text.delta"):
    type_name: ClassVar[str] = "text.delta"
    payload: TextPayload


class ToolStart(Envelope, tag="tool.start"):
    type_name: ClassVar[str] = "tool.start"
    payload: ToolStartPayload


class ToolEnd(Envelope, tag="tool.end"):
    type_name: ClassVar[str] = "tool.end"
    payload: ToolEndPayload


class StepBoundary(Envelope, tag="step.boundary"):
    type_name: ClassVar[str] = "step.boundary"
    payload: StepBoundaryPayload


class ChildSpawn(Envelope, tag="child.spawn"):
    type_name: ClassVar[str] = "child.spawn"
    payload: ChildSpawnPayload


class PlanProposal(Envelope, tag="plan.proposal"):
    type_name: ClassVar[str] = "plan.proposal"
    payload: PlanProposalPayload


class RunLifecycle(Envelope, tag="run.lifecycle"):
    type_name: ClassVar[str] = "run.lifecycle"
    payload: RunLifecyclePayload


class Usage(Envelope, tag="x.usage"):
    type_name: ClassVar[str] = "x.usage"
    payload: UsagePayload


class Gap(Envelope, tag="x.gap"):
    type_name: ClassVar[str] = "x.gap"
    payload: GapPayload


class Extension(
    msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False
):
    """An ``x.<namespace>.<name>`` event whose payload is kept verbatim."""

    id: EventId
    ts: Timestamp
    type: str
    run_id: RunId
    seq: Seq
    payload: dict[str, Any]
    child_ref: RunRef | None | UnsetType = msgspec.field(default=UNSET, name="child_id")
    ext: dict[str, Any] | None = None
    span: tuple[Seq, Seq] | None = None
    parent_id: RunRef | None = None
    root_id: RunRef | None = None
    tenant: RunRef | None = None
    thread_id: RunRef | None = None

    @property
    def child_id(self) -> str | None:
        """The child run this event came from, ``None`` when it is the run's own (absent or null)."""
        return None if self.child_ref is UNSET else self.child_ref

    def payload_dict(self) -> dict[str, Any]:
        return self.payload


CORE_TYPES: tuple[type[Envelope], ...] = (
    ReasoningDelta,
    TextDelta,
    ToolStart,
    ToolEnd,
    StepBoundary,
    ChildSpawn,
    PlanProposal,
    RunLifecycle,
)
TYPED: tuple[type[Envelope], ...] = (*CORE_TYPES, Usage, Gap)
EVENT_CLASSES: dict[str, type[Envelope]] = {cls.type_name: cls for cls in TYPED}
DELTA_TYPES: frozenset[str] = frozenset({"reasoning.delta", "text.delta"})

Event = (
    ReasoningDelta
    | TextDelta
    | ToolStart
    | ToolEnd
    | StepBoundary
    | ChildSpawn
    | PlanProposal
    | RunLifecycle
    | Usage
    | Gap
    | Extension
)
"""Any event runwire carries."""

_TypedEvent = (
    ReasoningDelta
    | TextDelta
    | ToolStart
    | ToolEnd
    | StepBoundary
    | ChildSpawn
    | PlanProposal
    | RunLifecycle
    | Usage
    | Gap
)

_FREE_FORM: frozenset[type] = frozenset({ToolStart, ToolEnd, Extension})
"""Event types with free-form JSON in their payload (besides ``ext``, which any event may have)."""
_ext_of = attrgetter("ext")

_decoder = msgspec.json.Decoder(_TypedEvent)
_ext_decoder = msgspec.json.Decoder(Extension)
_many_decoder = msgspec.json.Decoder(list[_TypedEvent])
_encoder = msgspec.json.Encoder()
_type_probe = msgspec.json.Decoder(dict[str, Any])


def is_extension_type(name: str) -> bool:
    return name not in EVENT_CLASSES and bool(_EXT_TYPE_RE.match(name))


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
    """False when a frame has too few brackets to nest deeper than ``limit`` (C speed)."""
    if isinstance(frame, str):
        return frame.count("{") + frame.count("[") > limit
    return frame.count(b"{") + frame.count(b"[") > limit


def _check_depth(event: _E, frame: bytes | str, limit: int | None) -> _E:
    if limit is not None and _may_be_deep(frame, limit) and is_too_deep(event, limit):
        raise _too_deep(limit)
    return event


def _deep_candidates(events: list[Any]) -> list[int]:
    """Indexes of events with free-form JSON fields (the only ones that can nest deeply).

    Two C-level passes over the batch: most batches are deltas and need no more.
    """
    indexes = range(len(events))
    found = list(compress(indexes, map(_FREE_FORM.__contains__, map(type, events))))
    if any(map(_ext_of, events)):  # rare: an ingest codec's leftovers
        found = sorted({*found, *compress(indexes, map(_ext_of, events))})
    return found


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
    try:
        parse_ts(checked.ts)
    except ValueError as error:  # the pattern admits month 13; a worker needs a real instant
        raise MalformedFrame(f"ts {checked.ts!r} is not a valid instant: {error}", field="$.ts") from None
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
            events: list[Event | ProtocolError] = _decoder.decode_lines(frames)
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
    the batch goes through one msgspec call; otherwise, or when any frame
    fails, each frame is decoded alone, so a bad frame affects only its own
    result. (Unlike :func:`decode_lines`, nothing is skipped.) The limits are
    those of :func:`decode`; the depth limit costs a bracket count per frame.
    """
    if frames and max(map(len, frames)) <= max_bytes:
        joined = b"\n".join(frames)
        if joined.count(b"\n") == len(frames) - 1:
            try:
                events: list[Event | ProtocolError] = _decoder.decode_lines(joined)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                events = []
            if len(events) == len(frames) and all(
                map(_TS_RE.match, {event.ts for event in events})  # type: ignore[union-attr]
            ):
                if max_depth is not None:
                    for index in _deep_candidates(events):
                        if _may_be_deep(frames[index], max_depth) and is_too_deep(
                            events[index], max_depth  # type: ignore[arg-type]
                        ):
                            events[index] = _too_deep(max_depth)
                return events
    out: list[Event | ProtocolError] = []
    for frame in frames:
        try:
            out.append(decode(frame, max_bytes=max_bytes, max_depth=max_depth))
        except ProtocolError as exc:
            out.append(exc)
    return out


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


def to_builtins(event: Event) -> dict[str, Any]:
    """The event as a plain dict (``type`` included)."""
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


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
    payload_cls = _PAYLOAD_CLASSES[type]
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


_PAYLOAD_CLASSES: dict[str, type[msgspec.Struct]] = {
    "reasoning.delta": TextPayload,
    "text.delta": TextPayload,
    "tool.start": ToolStartPayload,
    "tool.end": ToolEndPayload,
    "step.boundary": StepBoundaryPayload,
    "child.spawn": ChildSpawnPayload,
    "plan.proposal": PlanProposalPayload,
    "run.lifecycle": RunLifecyclePayload,
    "x.usage": UsagePayload,
    "x.gap": GapPayload,
}


def now_ts() -> str:
    """The current time as RFC 3339 with milliseconds and ``Z``."""
    return format_ts(datetime.now(UTC))


def format_ts(moment: datetime) -> str:
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def parse_ts(ts: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware datetime."""
    if not _TS_RE.match(ts):
        raise MalformedFrame(f"not an RFC 3339 timestamp: {ts!r}", field="$.ts")
    return datetime.fromisoformat(ts.replace("z", "Z").replace("t", "T"))


def ts_ms(ts: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 timestamp."""
    return int(parse_ts(ts).timestamp() * 1000)


def is_terminal(event: Event) -> bool:
    """True for a ``run.lifecycle`` event whose state ends the run."""
    return isinstance(event, RunLifecycle) and event.payload.state in TERMINAL_STATES


def replace(event: Event, **changes: Any) -> Event:
    """A copy of ``event`` with envelope fields changed.

    ``child_id=`` sets the field behind :attr:`Envelope.child_id`; ``None``
    makes it absent (an event of the run itself), not an explicit null.
    """
    if "child_id" in changes:
        child = changes.pop("child_id")
        changes["child_ref"] = UNSET if child is None else child
    return msgspec.structs.replace(event, **changes)


_T = TypeVar("_T")


def known(value: _T | UnsetType) -> _T | None:
    """An optional field's value with "absent" (``UNSET``) read as ``None``."""
    return None if value is UNSET else value
