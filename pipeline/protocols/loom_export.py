"""``loom-export``: the same Loom events in Loom streaming output §6's single-key form.

A frame is one JSON object with exactly one key, the EXPORT_SPEC name of the
event (``RunStart``, ``TaskStart``, ``Messages`` … per §6), whose value is an
object holding the event's payload fields and, when present, its envelope
fields (``session_id``, ``node_id``, ``event_id``)::

    {"RunStart": {"run_id": "run-1", "agent": "react"}}
    {"Messages": {"content": "Hello", "id": "think", "event_id": 2}}

§6 gives no key for the ``reply`` frame; runwire writes it as
``{"Reply": {"reply": "..."}}``. Semantics are loom's, so this codec unwraps
the frame and uses :mod:`runwire.protocols.loom` for the mapping; the
round-trip diff is kept under ``ext["loom"]`` and is shared by both forms, so
loom → canonical → loom-export is faithful too.
"""

from __future__ import annotations

from typing import Any

from ..core.envelope import Event
from ..core.errors import MalformedFrame, UnknownEventType
from .framing import decode_object
from .loom import REPLY, LoomEgress, LoomIngest

EXPORT_KEYS: dict[str, str] = {
    "run_start": "RunStart",
    "node_enter": "TaskStart",
    "node_exit": "TaskEnd",
    "message_chunk": "Messages",
    "usage": "Usage",
    "values": "Values",
    "updates": "Updates",
    "custom": "Custom",
    "checkpoint": "Checkpoint",
    "tot_expand": "TotExpand",
    "tot_evaluate": "TotEvaluate",
    "tot_backtrack": "TotBacktrack",
    "got_plan": "GotPlan",
    "got_node_start": "GotNodeStart",
    "got_node_complete": "GotNodeComplete",
    "got_node_failed": "GotNodeFailed",
    "got_expand": "GotExpand",
    "tool_call_chunk": "ToolCallChunk",
    "tool_call": "ToolCall",
    "tool_start": "ToolStart",
    "tool_output": "ToolOutput",
    "tool_end": "ToolEnd",
    "tool_approval": "ToolApproval",
    REPLY: "Reply",
}
LOOM_TYPES_BY_KEY: dict[str, str] = {key: kind for kind, key in EXPORT_KEYS.items()}


def unwrap(frame: dict[str, Any]) -> dict[str, Any]:
    """A single-key frame → the equivalent ``type`` + payload loom frame."""
    if len(frame) != 1:
        keys = ", ".join(sorted(frame)) or "none"
        raise MalformedFrame(
            f"a loom-export frame has exactly one key, got {len(frame)} ({keys})", field="$"
        )
    ((key, body),) = frame.items()
    kind = LOOM_TYPES_BY_KEY.get(key)
    if kind is None:
        raise UnknownEventType(
            f"unknown loom-export event {key!r}; Loom streaming output §6 lists {', '.join(LOOM_TYPES_BY_KEY)}",
            field=f"$.{key}",
        )
    if not isinstance(body, dict):
        raise MalformedFrame(
            f"`{key}` must be an object, got {type(body).__name__}", field=f"$.{key}"
        )
    if "type" in body:
        raise MalformedFrame(
            f"`{key}` must not contain `type`: the key is the type", field=f"$.{key}.type"
        )
    if kind == REPLY:
        if REPLY not in body:
            raise MalformedFrame("missing required field `reply`", field="$.Reply.reply")
        return dict(body)
    return {"type": kind, **body}


def wrap(frame: dict[str, Any]) -> dict[str, Any]:
    """A ``type`` + payload loom frame → its single-key form."""
    body = dict(frame)
    kind = body.pop("type", REPLY)
    return {EXPORT_KEYS[kind]: body}


class LoomExportIngest(LoomIngest):
    """Single-key Loom frames → canonical events."""

    name = "loom-export"

    def feed(self, data: bytes) -> list[Event]:
        frame = decode_object(data, max_bytes=self.max_bytes)
        loom_frame = unwrap(frame)
        (key,) = frame
        return [self.ingest_frame(loom_frame, prefix=f"$.{key}")]


class LoomExportEgress(LoomEgress):
    """Canonical events → single-key Loom frames."""

    name = "loom-export"

    def convert(self, event: Event) -> list[Any]:
        return [wrap(frame) for frame in super().convert(event)]

    def finish(self) -> list[Any]:
        return [wrap(frame) for frame in super().finish()]


__all__ = ["EXPORT_KEYS", "LoomExportEgress", "LoomExportIngest", "unwrap", "wrap"]
