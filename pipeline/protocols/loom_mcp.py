"""``loom-mcp``: loom-mcp ``stream`` events as its Pulse sink writes them (loom-mcp stream package).

One frame is the sink's envelope ``{type, event_key, run_id, session_id,
timestamp, payload, server_data}`` (``event_key``, ``session_id``,
``payload`` and ``server_data`` optional). The mapping onto canonical types
(full table in ``docs/protocols.md``):

=======================  ==================================================
loom-mcp                 canonical
=======================  ==================================================
assistant_reply          text.delta
planner_thought          reasoning.delta (``text``, else legacy ``note``);
                         ``x.mcp.planner_thought`` when it has neither
tool_start               tool.start (``payload`` → ``input``)
tool_end                 tool.end (``error`` → ``ok``; ``duration`` ns → ms)
usage                    x.usage
workflow                 run.lifecycle (phase completed → done, failed →
                         error, canceled → aborted, …); other phases
                         ``x.mcp.workflow``
child_run_linked         child.spawn (``child_run_id`` → ``child_id``)
a canonical type name    that event (how loom-mcp egress carries events
                         loom-mcp has no type for)
everything else          ``x.mcp.<type>`` with the payload verbatim
                         (awaits, tool_update, *_delta, prompt_rendered,
                         tool_authorization, session/run stream markers)
=======================  ==================================================

Lossless (Koder agent stream §7 T1): ``event_key``, ``session_id``, ``server_data`` and payload
fields with no canonical home are kept in ``ext["loom-mcp"]`` as a diff against
:func:`render`. ``timestamp`` becomes ``ts``; a frame without one gets the
ingest time and the diff records that the source had none.
"""

from __future__ import annotations

from typing import Any

from ..core import envelope
from ..core.envelope import EVENT_CLASSES, Event, is_extension_type, known
from ..core.errors import MalformedFrame, UnknownEventType
from .base import Egress, Ingest
from .framediff import apply
from .framing import EventStamper, Kind, as_int, check_fields, decode_object, source_ts

FORMAT = "loom-mcp"
EXT_PREFIX = "x.mcp."
ENVELOPE_FIELDS: dict[str, Kind] = {
    "type": "str",
    "event_key": "str",
    "run_id": "str",
    "session_id": "str",
    "timestamp": "str",
}

# type -> (payload field kinds, required payload fields), loom-mcp stream package
MCP_TYPES: dict[str, tuple[dict[str, Kind], tuple[str, ...]]] = {
    "assistant_reply": ({"text": "str"}, ("text",)),
    "planner_thought": (
        {"note": "str", "text": "str", "signature": "str", "content_index": "int", "final": "bool"},
        (),
    ),
    "prompt_rendered": ({"prompt_id": "str", "version": "str"}, ()),
    "tool_start": (
        {
            "tool_call_id": "str",
            "tool_name": "str",
            "display_hint": "str",
            "queue": "str",
            "parent_tool_call_id": "str",
            "expected_children_total": "int",
            "extra": "obj",
        },
        ("tool_call_id", "tool_name"),
    ),
    "tool_end": (
        {
            "tool_call_id": "str",
            "tool_name": "str",
            "result_preview": "str",
            "parent_tool_call_id": "str",
            "duration": "int",
            "extra": "obj",
        },
        ("tool_call_id",),
    ),
    "tool_update": ({"tool_call_id": "str", "expected_children_total": "int"}, ("tool_call_id",)),
    "tool_call_args_delta": (
        {"tool_call_id": "str", "tool_name": "str", "delta": "str"},
        ("tool_call_id", "delta"),
    ),
    "tool_output_delta": (
        {"tool_call_id": "str", "tool_name": "str", "stream": "str", "delta": "str"},
        ("tool_call_id", "delta"),
    ),
    "await_clarification": ({"id": "str", "question": "str", "missing_fields": "arr"}, ("id",)),
    "await_confirmation": (
        {"id": "str", "title": "str", "prompt": "str", "tool_name": "str", "tool_call_id": "str"},
        ("id",),
    ),
    "await_questions": (
        {"id": "str", "tool_name": "str", "tool_call_id": "str", "questions": "arr"},
        ("id",),
    ),
    "await_external_tools": ({"id": "str", "items": "arr"}, ("id",)),
    "tool_authorization": (
        {
            "tool_name": "str",
            "tool_call_id": "str",
            "approved": "bool",
            "summary": "str",
            "approved_by": "str",
        },
        ("tool_call_id",),
    ),
    "usage": ({}, ()),
    "workflow": ({"name": "str", "phase": "str", "status": "str", "error": "str"}, ("phase",)),
    "child_run_linked": (
        {"tool_name": "str", "tool_call_id": "str", "child_run_id": "str"},
        ("child_run_id",),
    ),
    "session_stream_started": ({}, ()),
    "session_stream_end": ({}, ()),
    "run_stream_end": ({}, ()),
}

PHASE_TO_STATE: dict[str, str] = {
    "completed": "done",
    "failed": "error",
    "canceled": "aborted",
    "cancelled": "aborted",
    "running": "running",
    "started": "running",
    "planning": "planning",
    "awaiting_approval": "awaiting_approval",
    "paused": "paused",
    "redirecting": "redirecting",
}
STATE_TO_WORKFLOW: dict[str, dict[str, Any]] = {
    "done": {"phase": "completed", "status": "success"},
    "error": {"phase": "failed", "status": "failed"},
    "aborted": {"phase": "canceled", "status": "canceled"},
}
_USAGE_KEYS = {
    "input_tokens": ("input_tokens", "InputTokens"),
    "output_tokens": ("output_tokens", "OutputTokens"),
    "total_tokens": ("total_tokens", "TotalTokens"),
}
_NS_PER_MS = 1_000_000


# ---------------------------------------------------------------- rendering


def render(event: Event) -> dict[str, Any]:
    """The Pulse envelope an event becomes, from the event alone (no stream state)."""
    kind, payload = _render_payload(event)
    frame: dict[str, Any] = {
        "type": kind,
        "event_key": event.id,
        "run_id": event.child_id or event.run_id,
        "timestamp": event.ts,
    }
    if payload is not None:
        frame["payload"] = payload
    return frame


def _render_payload(event: Event) -> tuple[str, Any]:
    if event.type.startswith(EXT_PREFIX):
        return event.type[len(EXT_PREFIX) :], event.payload_dict()
    if isinstance(event, envelope.TextDelta):
        return "assistant_reply", {"text": event.payload.text}
    if isinstance(event, envelope.ReasoningDelta):
        return "planner_thought", {"text": event.payload.text}
    if isinstance(event, envelope.ToolStart):
        start: dict[str, Any] = {
            "tool_call_id": event.payload.call_id,
            "tool_name": event.payload.tool,
        }
        if (arguments := known(event.payload.input)) is not None:
            start["payload"] = arguments
        return "tool_start", start
    if isinstance(event, envelope.ToolEnd):
        return "tool_end", _render_tool_end(event.payload)
    if isinstance(event, envelope.Usage):
        u = event.payload
        usage: dict[str, Any] = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
        }
        if (model := known(u.model)) is not None:
            usage["model"] = model
        return "usage", usage
    if isinstance(event, envelope.RunLifecycle):
        return "workflow", _render_workflow(event.payload)
    if isinstance(event, envelope.ChildSpawn):
        return "child_run_linked", {
            "tool_name": "",
            "tool_call_id": "",
            "child_run_id": event.payload.child_id,
            "child_agent_id": "",
        }
    return event.type, event.payload_dict()


def _render_tool_end(p: envelope.ToolEndPayload) -> dict[str, Any]:
    out: dict[str, Any] = {"tool_call_id": p.call_id, "tool_name": ""}
    if (output := known(p.output)) is not None:
        out["result"] = output
    out["duration"] = (p.duration_ms or 0) * _NS_PER_MS
    if not p.ok:
        error = known(p.error)
        error = error if error is not None else "tool failed"
        out["error"] = {"message": error} if isinstance(error, str) else error
    return out


def _render_workflow(p: envelope.RunLifecyclePayload) -> dict[str, Any]:
    out: dict[str, Any] = dict(STATE_TO_WORKFLOW.get(p.state, {"phase": p.state}))
    if p.state == "error" and (reason := known(p.reason)) is not None:
        out["error"] = reason
    out["retryable"] = False
    return out


# ---------------------------------------------------------------- ingest


class LoomMcpIngest(Ingest):
    """loom-mcp Pulse envelopes (NDJSON) → canonical events."""

    name = "loom-mcp"

    def __init__(
        self, *, run_id: str | None = None, max_bytes: int = envelope.MAX_FRAME_BYTES
    ) -> None:
        super().__init__(run_id=run_id)
        self.max_bytes = max_bytes
        self.stamper = EventStamper(FORMAT, run_id or "loom-mcp-run")
        self.run_id: str | None = None

    def feed(self, data: bytes) -> list[Event]:
        frame = decode_object(data, max_bytes=self.max_bytes)
        kind, payload = validate(frame)
        source_run = frame.get("run_id")
        if isinstance(source_run, str) and source_run:
            self.run_id = source_run
        canonical, mapped = _map(kind, payload)
        event = self.stamper.build(
            canonical,
            mapped,
            run_id=self.run_id or self.stamper.default_run_id,
            seq=self.stamper.next_seq(None),
            ts=source_ts(frame.get("timestamp")),
            source=frame,
            render=render,
        )
        return [event]


def validate(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The frame's type and payload object, or a ProtocolError naming the field."""
    check_fields(frame, ENVELOPE_FIELDS, ("type",))
    kind: str = frame["type"]
    payload = frame.get("payload", {})
    spec = MCP_TYPES.get(kind)
    if spec is None:
        if kind not in EVENT_CLASSES and not is_extension_type(kind):
            raise UnknownEventType(
                f"unknown loom-mcp event type {kind!r}; the loom-mcp stream package lists {', '.join(MCP_TYPES)}",
                field="$.type",
            )
        spec = ({}, ())
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise MalformedFrame(
            f"{kind}: `payload` must be an object, got {type(payload).__name__}", field="$.payload"
        )
    kinds, required = spec
    check_fields(payload, kinds, required, prefix="$.payload", context=f"{kind}: ")
    return kind, payload


def _map(kind: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if kind == "assistant_reply":
        return envelope.TextDelta.type_name, {"text": payload["text"]}
    if kind == "planner_thought":
        text = payload.get("text", payload.get("note"))
        if isinstance(text, str):
            return envelope.ReasoningDelta.type_name, {"text": text}
    elif kind == "tool_start":
        return envelope.ToolStart.type_name, {
            "call_id": payload["tool_call_id"],
            "tool": payload["tool_name"],
            "input": payload.get("payload"),
        }
    elif kind == "tool_end":
        return envelope.ToolEnd.type_name, _tool_end(payload)
    elif kind == "usage":
        return envelope.Usage.type_name, _usage(payload)
    elif kind == "workflow":
        state = PHASE_TO_STATE.get(payload["phase"])
        if state is not None:
            reason = payload.get("error")
            return envelope.RunLifecycle.type_name, {"state": state, "reason": reason} if reason else {
                "state": state
            }
    elif kind == "child_run_linked":
        return envelope.ChildSpawn.type_name, {"child_id": payload["child_run_id"]}
    elif kind not in MCP_TYPES:
        return kind, payload
    return EXT_PREFIX + kind, payload


def _tool_end(payload: dict[str, Any]) -> dict[str, Any]:
    error = payload.get("error")
    out: dict[str, Any] = {"call_id": payload["tool_call_id"], "ok": error is None}
    if payload.get("result") is not None:
        out["output"] = payload["result"]
    if error is not None:
        out["error"] = error
    if "duration" in payload:
        out["duration_ms"] = as_int(payload["duration"]) // _NS_PER_MS
    return out


def _usage(payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, names in _USAGE_KEYS.items():
        for name in names:
            if name in payload:
                out[field] = as_int(payload[name])
                break
    model = payload.get("model", payload.get("Model"))
    if isinstance(model, str) and model:
        out["model"] = model
    return out


# ---------------------------------------------------------------- egress


class LoomMcpEgress(Egress):
    """Canonical events → loom-mcp Pulse envelopes.

    Events that came from loom-mcp carry ``ext["loom-mcp"]`` and are restored
    exactly. Events from elsewhere are rendered (``event_key`` = the event id,
    ``run_id`` = the child run for fanned-in events); ``tool_end`` names the
    tool its ``tool.start`` named; events loom-mcp has no type for keep their
    canonical type name and payload (loom-mcp consumers skip types they do not
    know); a terminal ``run.lifecycle`` is followed by ``run_stream_end``, the
    explicit end-of-run marker, which :meth:`finish` also writes for a stream
    that ends without one.
    """

    name = "loom-mcp"
    media_type = "application/x-ndjson"

    def __init__(self, **_options: Any) -> None:
        self.tools: dict[str, str] = {}
        self.last: Event | None = None
        self.ended = False
        self.foreign = False

    def convert(self, event: Event) -> list[Any]:
        self.last = event
        change = event.ext.get(FORMAT) if event.ext else None
        if change is not None or event.type.startswith(EXT_PREFIX):
            frame = apply(render(event), change)
            if frame.get("type") == "run_stream_end":
                self.ended = True
            return [frame]
        self.foreign = True
        frame = render(event)
        if isinstance(event, envelope.ToolStart):
            self.tools[event.payload.call_id] = event.payload.tool
        elif isinstance(event, envelope.ToolEnd):
            frame["payload"]["tool_name"] = self.tools.get(event.payload.call_id, "")
        if envelope.is_terminal(event):
            return [frame, *self._end(event)]
        return [frame]

    def finish(self) -> list[Any]:
        if self.last is None or not self.foreign:
            return []
        return self._end(self.last)

    def _end(self, event: Event) -> list[Any]:
        if self.ended:
            return []
        self.ended = True
        return [
            {
                "type": "run_stream_end",
                "event_key": f"{event.id}:end",
                "run_id": event.run_id,
                "timestamp": event.ts,
                "payload": {},
            }
        ]
