"""``loom``: Loom streaming output (the Loom Agent's), ``type`` + payload NDJSON frames.

Frames may carry the envelope fields ``session_id``, ``node_id`` and
``event_id``; a frame without ``type`` but with ``reply`` is the run's final
reply. The mapping onto canonical types (full table in ``docs/protocols.md``):

==================  =====================================================
loom                canonical
==================  =====================================================
run_start           run.lifecycle ``running`` (its ``run_id`` names the run)
message_chunk       text.delta
tool_call           tool.start (``arguments`` → ``input``)
tool_start          tool.start, or ``x.loom.tool_start`` when a tool_call
                    already started that call (one tool.start per call)
tool_end            tool.end (``is_error`` → ``ok``; ``result`` → output/error)
usage               x.usage
custom              the carried event when its value is ``{"runwire": {type,
                    payload}}`` (how loom egress carries foreign events),
                    else ``x.loom.custom``
reply (no type)     x.loom.reply
everything else     ``x.loom.<type>`` with the payload verbatim
==================  =====================================================

Lossless (Koder agent stream §7 T1): what the canonical event cannot hold (``session_id``,
``node_id``, the node name on a chunk, a missing ``event_id`` …) is kept in
``ext["loom"]`` as a :mod:`~runwire.protocols.framediff` diff against
:func:`render`, and :class:`LoomEgress` applies it back.
"""

from __future__ import annotations

from typing import Any

from ..core import envelope
from ..core.envelope import EVENT_CLASSES, Event, is_extension_type, known
from ..core.errors import MalformedFrame, ProtocolError, UnknownEventType
from .base import Egress, Ingest
from .framediff import apply
from .framing import EventStamper, Kind, as_int, check_fields, decode_object, json_text

FORMAT = "loom"
EXT_PREFIX = "x.loom."
ENVELOPE_FIELDS: dict[str, Kind] = {"session_id": "str", "node_id": "str", "event_id": "num"}
DEFAULT_NODE = "agent"

# type -> (payload field kinds, required fields), Loom streaming output §4.2
LOOM_TYPES: dict[str, tuple[dict[str, Kind], tuple[str, ...]]] = {
    "run_start": ({"run_id": "str", "message": "str", "agent": "str"}, ()),
    "node_enter": ({"id": "str"}, ("id",)),
    "node_exit": ({"id": "str"}, ("id", "result")),
    "message_chunk": ({"content": "str", "id": "str"}, ("content",)),
    "usage": (
        {"prompt_tokens": "num", "completion_tokens": "num", "total_tokens": "num"},
        (),
    ),
    "values": ({}, ("state",)),
    "updates": ({"id": "str"}, ("state",)),
    "custom": ({}, ("value",)),
    "checkpoint": ({"checkpoint_id": "str", "thread_id": "str", "checkpoint_ns": "str"}, ()),
    "tot_expand": ({"candidates": "arr"}, ("candidates",)),
    "tot_evaluate": ({"chosen": "num", "scores": "arr"}, ("chosen", "scores")),
    "tot_backtrack": ({"reason": "str", "to_depth": "num"}, ()),
    "got_plan": ({"node_count": "num", "edge_count": "num", "node_ids": "arr"}, ()),
    "got_node_start": ({"id": "str"}, ("id",)),
    "got_node_complete": ({"id": "str", "result_summary": "str"}, ("id",)),
    "got_node_failed": ({"id": "str", "error": "str"}, ("id",)),
    "got_expand": ({"node_id": "str"}, ()),
    "tool_call_chunk": (
        {"call_id": "str", "name": "str", "arguments_delta": "str"},
        ("arguments_delta",),
    ),
    "tool_call": ({"call_id": "str", "name": "str"}, ("name",)),
    "tool_start": ({"call_id": "str", "name": "str"}, ("name",)),
    "tool_output": ({"call_id": "str", "name": "str", "content": "str"}, ("content",)),
    "tool_end": ({"call_id": "str", "name": "str", "result": "any", "is_error": "bool"}, ()),
    "tool_approval": ({"call_id": "str", "name": "str"}, ("name",)),
}
REPLY = "reply"


# ---------------------------------------------------------------- rendering


def render(event: Event) -> dict[str, Any]:
    """The loom frame an event becomes, from the event alone (no stream state).

    Ingest diffs source frames against this function and egress applies the
    diff to it, so it must stay a pure function of the event.
    """
    kind = event.type
    if kind.startswith(EXT_PREFIX):
        name = kind[len(EXT_PREFIX) :]
        body = {k: v for k, v in event.payload_dict().items() if k not in ("type", "event_id")}
        if name == REPLY:
            return {**body, "event_id": event.seq}
        return {"type": name, **body, "event_id": event.seq}
    frame = _render_core(event) if event.child_id is None else carried(event)
    frame["event_id"] = event.seq
    return frame


def _render_core(event: Event) -> dict[str, Any]:
    if isinstance(event, envelope.TextDelta):
        return {"type": "message_chunk", "content": event.payload.text, "id": DEFAULT_NODE}
    if isinstance(event, envelope.ToolStart):
        p = event.payload
        return {"type": "tool_call", "call_id": p.call_id, "name": p.tool, "arguments": known(p.input)}
    if isinstance(event, envelope.ToolEnd):
        e = event.payload
        output, error = known(e.output), known(e.error)
        result = output if e.ok else (error if error is not None else output)
        return {
            "type": "tool_end",
            "call_id": e.call_id,
            "name": "",
            "result": json_text(result),
            "is_error": not e.ok,
        }
    if isinstance(event, envelope.Usage):
        u = event.payload
        return {
            "type": "usage",
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
        }
    if isinstance(event, envelope.RunLifecycle) and event.payload.state == "running":
        return {"type": "run_start", "run_id": event.run_id}
    return carried(event)


def carried(event: Event) -> dict[str, Any]:
    """A ``custom`` frame carrying an event loom has no type for."""
    value: dict[str, Any] = {"type": event.type, "payload": event.payload_dict()}
    if event.child_id is not None:
        value["child_id"] = event.child_id
    return {"type": "custom", "value": {"runwire": value}}


def uncarried(value: Any) -> tuple[str, dict[str, Any], str | None] | None:
    """The (type, payload, child_id) inside a ``custom`` frame written by :func:`carried`."""
    if not isinstance(value, dict) or set(value) != {"runwire"}:
        return None
    inner = value["runwire"]
    if not isinstance(inner, dict) or not set(inner) <= {"type", "payload", "child_id"}:
        return None
    kind, payload, child_id = inner.get("type"), inner.get("payload"), inner.get("child_id")
    if not isinstance(kind, str) or not isinstance(payload, dict):
        return None
    if child_id is not None and not isinstance(child_id, str):
        return None
    if kind not in EVENT_CLASSES and not is_extension_type(kind):
        return None
    try:
        envelope.make(kind, payload, id="probe", ts=envelope.now_ts(), run_id="probe", seq=0)
    except ProtocolError:
        return None
    return kind, payload, child_id


# ---------------------------------------------------------------- ingest


class _ToolCalls:
    """Call ids of one stream: synthesised when loom omits them, one tool.start per call."""

    def __init__(self) -> None:
        self.open: dict[str, list[str]] = {}
        self.started: set[str] = set()

    def resolve(self, frame: dict[str, Any], seq: int, *, closing: bool = False) -> str:
        call_id = frame.get("call_id")
        name = frame.get("name", "")
        pending = self.open.get(name, [])
        if isinstance(call_id, str):
            if closing and call_id in pending:
                pending.remove(call_id)
            return call_id
        if pending:
            return pending.pop(0) if closing else pending[-1]
        return f"call_{seq}"

    def start(self, call_id: str, name: str) -> bool:
        """Record a start; False when this call already had one."""
        if call_id in self.started:
            return False
        self.started.add(call_id)
        pending = self.open.setdefault(name, [])
        if call_id not in pending:
            pending.append(call_id)
        return True


class LoomIngest(Ingest):
    """Loom NDJSON frames → canonical events."""

    name = "loom"

    def __init__(
        self, *, run_id: str | None = None, max_bytes: int = envelope.MAX_FRAME_BYTES
    ) -> None:
        super().__init__(run_id=run_id)
        self.max_bytes = max_bytes
        self.stamper = EventStamper(FORMAT, run_id or "loom-run")
        self.run_id: str | None = None
        self.calls = _ToolCalls()

    def feed(self, data: bytes) -> list[Event]:
        return [self.ingest_frame(decode_object(data, max_bytes=self.max_bytes))]

    def ingest_frame(self, frame: dict[str, Any], *, prefix: str = "$") -> Event:
        """One decoded loom frame → its canonical event (validating it first)."""
        kind = validate(frame, prefix=prefix)
        seq = self.stamper.next_seq(frame.get("event_id"))
        if kind == "run_start" and isinstance(frame.get("run_id"), str) and frame["run_id"]:
            self.run_id = frame["run_id"]
        inner = uncarried(frame["value"]) if kind == "custom" else None
        child_id = None
        if inner is not None:
            canonical, payload, child_id = inner
        else:
            canonical, payload = self._map(kind, frame, seq)
        return self.stamper.build(
            canonical,
            payload,
            run_id=self.run_id or self.stamper.default_run_id,
            seq=seq,
            ts=None,
            source=frame,
            render=render,
            child_id=child_id,
            marked=inner is None,  # loom's own event: LoomEgress renders it back, not as foreign
        )

    def _map(self, kind: str, frame: dict[str, Any], seq: int) -> tuple[str, dict[str, Any]]:
        if kind == "run_start":
            return envelope.RunLifecycle.type_name, {"state": "running"}
        if kind == "message_chunk":
            return envelope.TextDelta.type_name, {"text": frame["content"]}
        if kind == "usage":
            return envelope.Usage.type_name, {
                "input_tokens": as_int(frame.get("prompt_tokens")),
                "output_tokens": as_int(frame.get("completion_tokens")),
                "total_tokens": as_int(frame.get("total_tokens")),
            }
        if kind in ("tool_call", "tool_start"):
            call_id = self.calls.resolve(frame, seq)
            if self.calls.start(call_id, frame["name"]):
                return envelope.ToolStart.type_name, {
                    "call_id": call_id,
                    "tool": frame["name"],
                    "input": frame.get("arguments"),
                }
        if kind == "tool_end":
            return envelope.ToolEnd.type_name, _tool_end(frame, self.calls.resolve(frame, seq, closing=True))
        return EXT_PREFIX + kind, {
            k: v for k, v in frame.items() if k != "type" and k not in ENVELOPE_FIELDS
        }


def _tool_end(frame: dict[str, Any], call_id: str) -> dict[str, Any]:
    ok = frame.get("is_error") is not True
    result = frame.get("result")
    if ok:
        return {"call_id": call_id, "ok": True, "output": result}
    return {"call_id": call_id, "ok": False, "error": result}


def validate(frame: dict[str, Any], *, prefix: str = "$") -> str:
    """The frame's loom type (``reply`` for a reply frame), or a ProtocolError naming the field."""
    check_fields(frame, ENVELOPE_FIELDS, prefix=prefix)
    kind = frame.get("type")
    if kind is None:
        if REPLY not in frame:
            raise MalformedFrame(
                "missing required field `type` (and no `reply`: not a reply frame)",
                field=f"{prefix}.type",
            )
        check_fields(frame, {REPLY: "str"}, prefix=prefix)
        return REPLY
    if not isinstance(kind, str):
        raise MalformedFrame(
            f"`type` must be a string, got {type(kind).__name__}", field=f"{prefix}.type"
        )
    spec = LOOM_TYPES.get(kind)
    if spec is None:
        raise UnknownEventType(
            f"unknown loom event type {kind!r}; Loom streaming output §4.2 lists {', '.join(LOOM_TYPES)}",
            field=f"{prefix}.type",
        )
    kinds, required = spec
    check_fields(frame, kinds, required, prefix=prefix, context=f"{kind}: ")
    return kind


# ---------------------------------------------------------------- egress


class LoomEgress(Egress):
    """Canonical events → loom frames.

    Events that came from loom carry ``ext["loom"]`` and are restored exactly.
    Events from elsewhere are rendered: chunks name the node last entered,
    ``tool_end`` names the tool its ``tool.start`` named, a second ``running``
    becomes ``custom``, a child run's events (``child_id`` set; loom has no
    sub-runs) are carried whole in ``custom`` frames, and the stream ends with a ``reply`` frame holding the
    text the run produced (after its terminal event, or at :meth:`finish`).
    """

    name = "loom"
    media_type = "application/x-ndjson"

    def __init__(self, **_options: Any) -> None:
        self.node = DEFAULT_NODE
        self.tools: dict[str, str] = {}
        self.text: list[str] = []
        self.started = False
        self.replied = False
        self.foreign = False

    def convert(self, event: Event) -> list[Any]:
        change = event.ext.get(FORMAT) if event.ext else None
        if change is not None or event.type.startswith(EXT_PREFIX):
            frame = apply(render(event), change)
            self._observe(frame)
            return [frame]
        self.foreign = True
        return self._foreign(event)

    def finish(self) -> list[Any]:
        return self._reply()

    def _observe(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "node_enter" and isinstance(frame.get("id"), str):
            self.node = frame["id"]
        elif kind == "run_start":
            self.started = True
        elif kind is None and REPLY in frame:
            self.replied = True

    def _foreign(self, event: Event) -> list[Any]:
        frame = render(event)
        if event.child_id is not None:  # carried whole: loom has no sub-runs
            return [frame]
        if isinstance(event, envelope.TextDelta):
            frame["id"] = self.node
            self.text.append(event.payload.text)
        elif isinstance(event, envelope.ToolStart):
            self.tools[event.payload.call_id] = event.payload.tool
        elif isinstance(event, envelope.ToolEnd):
            frame["name"] = self.tools.get(event.payload.call_id, "")
        elif isinstance(event, envelope.RunLifecycle) and event.payload.state == "running":
            if self.started:
                frame = {**carried(event), "event_id": event.seq}
            self.started = True
        if envelope.is_terminal(event):
            return [frame, *self._reply()]
        return [frame]

    def _reply(self) -> list[Any]:
        if self.replied or not self.foreign or not self.text:
            return []
        self.replied = True
        return [{"reply": "".join(self.text)}]
