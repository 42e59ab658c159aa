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
* ``span`` (envelope, optional): on a shaped delta, ``[first, last]``, the
  stretch of the seq space it accounts for: the previous shaped event's seq
  + 1 to its own seq, so a shaped view's spans tile (§4 R1, §7 T2).
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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from . import limits
from .errors import MalformedFrame
from .native import load

MAX_FRAME_BYTES = limits.FRAME_BYTES
"""Default size limit of one encoded frame (1 MiB)."""
MAX_DEPTH = limits.DEPTH
"""Deepest JSON nesting of a frame (the envelope object is level 1, its ``payload`` level 2).

Checked wherever a frame is decoded (HTTP ingest, workers, the edge, imports):
deeper values are what make recursive code downstream (egress encoders,
``copy.deepcopy``) raise ``RecursionError``."""
INT64_MAX = (1 << 63) - 1
"""Largest integer any numeric envelope or payload field may hold (checkpoints and
the replay log store them as signed 64-bit)."""
MAX_ID_CHARS = limits.ID_CHARS
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
    """The event type: the concrete class's tag, the one place a type's name is written
    (copied here when the classes are defined, below, for a fast ``type``)."""

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
    payload: TextPayload


class TextDelta(Envelope, tag="text.delta"):
    payload: TextPayload


class ToolStart(Envelope, tag="tool.start"):
    payload: ToolStartPayload


class ToolEnd(Envelope, tag="tool.end"):
    payload: ToolEndPayload


class StepBoundary(Envelope, tag="step.boundary"):
    payload: StepBoundaryPayload


class ChildSpawn(Envelope, tag="child.spawn"):
    payload: ChildSpawnPayload


class PlanProposal(Envelope, tag="plan.proposal"):
    payload: PlanProposalPayload


class RunLifecycle(Envelope, tag="run.lifecycle"):
    payload: RunLifecyclePayload


class Usage(Envelope, tag="x.usage"):
    payload: UsagePayload


class Gap(Envelope, tag="x.gap"):
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
    ReasoningDelta, TextDelta, ToolStart, ToolEnd, StepBoundary, ChildSpawn, PlanProposal, RunLifecycle
)
TYPED: tuple[type[Envelope], ...] = (*CORE_TYPES, Usage, Gap)
for _cls in TYPED:
    _cls.type_name = str(_cls.__struct_config__.tag)
EVENT_CLASSES: dict[str, type[Envelope]] = {cls.type_name: cls for cls in TYPED}
PAYLOAD_CLASSES: dict[str, type[msgspec.Struct]] = {
    cls.type_name: next(f.type for f in msgspec.structs.fields(cls) if f.name == "payload") for cls in TYPED
}
"""Each event type's payload Struct, read from its class."""
DELTA_TYPES: frozenset[str] = frozenset({"reasoning.delta", "text.delta"})

Event = (
    ReasoningDelta | TextDelta | ToolStart | ToolEnd | StepBoundary | ChildSpawn | PlanProposal
    | RunLifecycle | Usage | Gap | Extension
)
"""Any event runwire carries."""

_TypedEvent = (
    ReasoningDelta | TextDelta | ToolStart | ToolEnd | StepBoundary | ChildSpawn | PlanProposal
    | RunLifecycle | Usage | Gap
)


def is_extension_type(name: str) -> bool:
    return name not in EVENT_CLASSES and bool(_EXT_TYPE_RE.match(name))


def to_builtins(event: Event) -> dict[str, Any]:
    """The event as a plain dict (``type`` included)."""
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


def now_ts() -> str:
    """The current time as RFC 3339 with milliseconds and ``Z``."""
    return format_ts(datetime.now(UTC))


def format_ts(moment: datetime) -> str:
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_TS_CACHE: dict[str, int] = {}
_TS_CACHE_SIZE = 4096
"""Distinct ``ts`` strings remembered by :func:`ts_ms` (cleared when full): a batch's
events mostly share a few millisecond stamps, so nearly every call is one dict lookup."""


def ts_ms(ts: str) -> int:
    """Milliseconds since the epoch of an envelope ``ts``: **the** reading of that field.

    Ingest's check, the worker's validation, shaping's windows, stats and the
    egress codecs all call this, so what ingest accepts a worker can order and
    shape. RFC 3339 §5.6: ``T`` and ``Z`` may be lowercase, the fraction may
    have up to nine digits (read to the millisecond, rounded down). Raises
    ``MalformedFrame`` (``$.ts``) for a string that is not RFC 3339 or not a
    real instant (month 13). Each distinct string is parsed once.
    """
    millis = _TS_CACHE.get(ts)
    if millis is None:
        millis = _parse_ms(ts)
        if len(_TS_CACHE) >= _TS_CACHE_SIZE:
            _TS_CACHE.clear()
        _TS_CACHE[ts] = millis
    return millis


def _parse_ms(ts: str) -> int:
    if not _TS_RE.match(ts):
        raise MalformedFrame(f"not an RFC 3339 timestamp: {ts!r}", field="$.ts")
    try:
        moment = datetime.fromisoformat(ts.upper())
    except ValueError as error:  # the pattern admits month 13
        raise MalformedFrame(f"ts {ts!r} is not a valid instant: {error}", field="$.ts") from None
    return (moment - _EPOCH) // _MS


def _all_ts_match(events: list[Any]) -> bool:
    return all(map(_TS_RE.match, {event.ts for event in events}))


_NATIVE = load("core._native", "batch's timestamp check")
if _NATIVE is not None:
    _NATIVE.setup_ts(Envelope)
all_ts_match: Callable[[list[Any]], bool] = _all_ts_match if _NATIVE is None else _NATIVE.ts_all_match
"""Whether every decoded event's ``ts`` matches the RFC 3339 pattern (a batch's check after
msgspec's pass; compiled where built: ``runwire.core._native.ts_all_match``)."""


def new_timestamps(events: list[Any], cache: dict[str, int] = _TS_CACHE) -> list[str]:
    """The events' distinct ``ts`` that :func:`ts_ms` has not read yet (not in its ``cache``), in
    order: what is left to check of a batch's ``ts`` (compiled where built:
    ``runwire.core._native.ts_new``)."""
    if _NATIVE is not None:
        found: list[str] = _NATIVE.ts_new(events, cache)
        return found
    return _new_timestamps(events, cache)


def _new_timestamps(events: list[Any], cache: dict[str, int]) -> list[str]:
    return [ts for ts in dict.fromkeys(event.ts for event in events) if ts not in cache]


def parse_ts(ts: str) -> datetime:
    """An envelope ``ts`` as an aware UTC datetime (millisecond precision, see :func:`ts_ms`)."""
    return _EPOCH + ts_ms(ts) * _MS


def is_terminal(event: Event) -> bool:
    """True for a ``run.lifecycle`` event whose state ends the run."""
    return isinstance(event, RunLifecycle) and event.payload.state in TERMINAL_STATES


def is_sub_runs_own(events: Sequence[Event]) -> bool:
    """Whether a run's stream is a sub-run's own, by its first event: the run's own (not fanned
    in from a sub-run of its own) and naming a parent. Only a root run's stream holds a whole
    tree of runs; a sub-run's events are also fanned into every ancestor's."""
    return bool(events) and events[0].child_ref in (UNSET, None) and events[0].parent_id is not None


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
