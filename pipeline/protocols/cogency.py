"""``cogency``: the Cogency streaming protocol's event stream, in and out.

Frames are NDJSON objects ``{"type": ..., ...}`` of ten types. Mapping (see
``docs/protocols.md``):

=============  ==========================================================
cogency        canonical
=============  ==========================================================
``think``      ``reasoning.delta`` ``{text: content}``
``respond``    ``text.delta`` ``{text: content}``
``call``       ``tool.start`` ``{call_id, tool: name, input: args}``; the
               content is JSON ``{"name", "args"}``. Cogency calls carry no
               id, so ``call_id`` is derived from the run and the call's
               seq (``<run_id>.call.<seq>``); a ``result`` answers the
               oldest unanswered call (calls and results come in order).
               Content that is not such JSON becomes ``x.cogency.call``.
``result``     ``tool.end`` ``{call_id, ok: not payload.error, output:
               payload.content, error: payload.outcome when failed}``
``metric``     ``x.usage`` from ``step`` (input/output tokens); ``total``
               and ``duration`` ride in ``ext``
``end``        ``run.lifecycle`` ``done`` (the task-completion signal)
``interrupt``  ``run.lifecycle`` ``aborted`` (Ctrl+C, timeout)
``user``,      ``x.cogency.user`` / ``x.cogency.execute`` /
``execute``,   ``x.cogency.error``: payload = the frame without ``type``
``error``      and ``timestamp`` (an ``error`` is a failure the run may
               survive, so it is not terminal)
=============  ==========================================================

``timestamp`` (float seconds) becomes ``ts``. Lossless (Koder agent stream §7 T1): ingest renders
each event back with the egress rendering and keeps the difference in
``ext["cogency"]`` (:mod:`.framediff`), so cogency → canonical → cogency
returns every frame field for field.

Only conversation events are persisted in cogency (``PERSISTED_TYPES``);
:func:`is_persisted` tells which canonical events those are.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..core import envelope
from ..core.envelope import Event, Extension, known
from ..core.errors import MalformedFrame
from ..core.ulid import MonotonicULID
from . import framediff
from .base import Egress, Ingest

FORMAT = "cogency"
PERSISTED_TYPES: frozenset[str] = frozenset({"user", "think", "call", "result", "respond"})
"""Cogency types stored as conversation; the rest are runtime-only."""
RUNTIME_TYPES: frozenset[str] = frozenset({"execute", "end", "metric", "error", "interrupt"})
COGENCY_TYPES: frozenset[str] = PERSISTED_TYPES | RUNTIME_TYPES
EXT_PREFIX = "x.cogency."

_frame_decoder = msgspec.json.Decoder(dict[str, Any])

Frame = dict[str, Any]


def _seconds(ts: str) -> float:
    return envelope.ts_ms(ts) / 1000


def _ts_of(seconds: float) -> str:
    return envelope.format_ts(datetime.fromtimestamp(seconds, UTC))


def call_content(tool: str, args: Any) -> str:
    """The ``content`` of a cogency ``call`` frame (``json.dumps`` default spacing, as in the Cogency streaming protocol)."""
    return json.dumps({"name": tool, "args": args}, ensure_ascii=False)


# --- egress rendering: canonical event -> cogency frame (stateless) ---------


def _render_tool_end(payload: envelope.ToolEndPayload) -> Frame:
    output, error = known(payload.output), known(payload.error)
    outcome = "success" if payload.ok else _text(error)
    content = output if payload.ok or output is not None else error
    return {"outcome": outcome, "content": content, "error": not payload.ok}


def _text(value: Any) -> str:
    if value is None:
        return "error"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _render_lifecycle(event: envelope.RunLifecycle) -> Frame | None:
    state = event.payload.state
    if state == "done":
        return {"type": "end"}
    if state == "aborted":
        return {"type": "interrupt"}
    if state == "error":
        return {"type": "error", "payload": {"error": event.payload.reason or "run failed"}}
    return None


def _render_usage(event: envelope.Usage) -> Frame:
    p = event.payload
    return {"type": "metric", "step": {"input": p.input_tokens, "output": p.output_tokens}}


def _render_body(event: Event) -> Frame | None:
    if isinstance(event, envelope.ReasoningDelta):
        return {"type": "think", "content": event.payload.text}
    if isinstance(event, envelope.TextDelta):
        return {"type": "respond", "content": event.payload.text}
    if isinstance(event, envelope.ToolStart):
        return {"type": "call", "content": call_content(event.payload.tool, known(event.payload.input))}
    if isinstance(event, envelope.ToolEnd):
        return {"type": "result", "payload": _render_tool_end(event.payload)}
    if isinstance(event, envelope.RunLifecycle):
        return _render_lifecycle(event)
    if isinstance(event, envelope.Usage):
        return _render_usage(event)
    if isinstance(event, Extension) and event.type.startswith(EXT_PREFIX):
        kind = event.type[len(EXT_PREFIX) :]
        if kind in COGENCY_TYPES:
            return {"type": kind, **event.payload}
    return None


def render(event: Event) -> Frame | None:
    """The cogency frame for ``event`` before ``ext`` is applied; ``None`` if cogency has none."""
    body = _render_body(event)
    if body is None:
        return None
    body["timestamp"] = _seconds(event.ts)
    return body


def cogency_type(event: Event) -> str | None:
    """The cogency event type ``event`` is written as, or ``None`` if it has none."""
    body = _render_body(event)
    return None if body is None else str(body["type"])


def is_persisted(event: Event) -> bool:
    """True for conversation events (cogency persists user, think, call, result, respond).

    Everything else — control flow, observability and events cogency has no
    type for — is runtime-only.
    """
    return cogency_type(event) in PERSISTED_TYPES


# --- ingest ----------------------------------------------------------------


class CogencyIngest(Ingest):
    """Cogency event frames → canonical events (one stream = one run)."""

    name = "cogency"

    def __init__(self, *, run_id: str | None = None, clock: Callable[[], str] | None = None) -> None:
        super().__init__(run_id=run_id)
        self.run_id = run_id or "cogency"
        self._seq = 0
        self._ids = MonotonicULID("evt_")
        self._clock = clock or envelope.now_ts
        self._open_calls: deque[str] = deque()

    def feed(self, data: bytes) -> list[Event]:
        frame = self._decode(data)
        self._seq += 1
        ts = self._timestamp(frame)
        kind, payload = self._map(frame)
        event = envelope.make(
            kind, payload, id=self._ids.new(envelope.ts_ms(ts)), ts=ts,
            run_id=self.run_id, seq=self._seq,
        )
        rendered = render(event)
        change = framediff.diff(frame, rendered or {})
        if change is not None:
            event = envelope.replace(event, ext={FORMAT: change})
        return [event]

    def _decode(self, data: bytes) -> Frame:
        if len(data) > envelope.MAX_FRAME_BYTES:
            raise MalformedFrame(f"frame is {len(data)} bytes, over the limit")
        try:
            frame = _frame_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise MalformedFrame(f"not a JSON object: {exc}") from None
        kind = frame.get("type")
        if not isinstance(kind, str) or kind not in COGENCY_TYPES:
            raise MalformedFrame(
                f"unknown cogency type {kind!r}; expected one of {', '.join(sorted(COGENCY_TYPES))}",
                field="$.type",
            )
        return frame

    def _timestamp(self, frame: Frame) -> str:
        value = frame.get("timestamp")
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return _ts_of(float(value))
            except (OverflowError, OSError, ValueError):
                raise MalformedFrame("timestamp out of range", field="$.timestamp") from None
        return self._clock()

    def _map(self, frame: Frame) -> tuple[str, dict[str, Any]]:
        kind = frame["type"]
        content = frame.get("content")
        if kind == "think" and isinstance(content, str):
            return envelope.ReasoningDelta.type_name, {"text": content}
        if kind == "respond" and isinstance(content, str):
            return envelope.TextDelta.type_name, {"text": content}
        if kind == "call":
            mapped = self._map_call(content)
            if mapped is not None:
                return mapped
        if kind == "result" and isinstance(frame.get("payload"), dict):
            return envelope.ToolEnd.type_name, self._map_result(frame["payload"])
        if kind == "metric" and isinstance(frame.get("step"), dict):
            return envelope.Usage.type_name, _usage(frame["step"])
        if kind == "end":
            return envelope.RunLifecycle.type_name, {"state": "done"}
        if kind == "interrupt":
            return envelope.RunLifecycle.type_name, {"state": "aborted"}
        rest = {k: v for k, v in frame.items() if k not in ("type", "timestamp")}
        return EXT_PREFIX + kind, rest

    def _map_call(self, content: Any) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(content, str):
            return None
        try:
            call = json.loads(content)
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        call_id = f"{self.run_id}.call.{self._seq}"
        self._open_calls.append(call_id)
        return envelope.ToolStart.type_name, {"call_id": call_id, "tool": call["name"], "input": call.get("args")}

    def _map_result(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self._open_calls:
            call_id = self._open_calls.popleft()
        else:
            call_id = f"{self.run_id}.result.{self._seq}"
        ok = not payload.get("error")
        out: dict[str, Any] = {"call_id": call_id, "ok": ok, "output": payload.get("content")}
        if not ok:
            out["error"] = payload.get("outcome")
        return out


def _usage(step: dict[str, Any]) -> dict[str, Any]:
    def count(key: str) -> int:
        value = step.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    tokens_in, tokens_out = count("input"), count("output")
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}


# --- egress ----------------------------------------------------------------


class CogencyEgress(Egress):
    """Canonical events → cogency event frames.

    Events cogency has no type for (steps, child spawns, plans, non-terminal
    lifecycle states, foreign extensions) are not written.
    """

    name = "cogency"

    def convert(self, event: Event) -> list[Any]:
        frame = render(event)
        if frame is None:
            return []
        change = (event.ext or {}).get(FORMAT)
        return [framediff.apply(frame, change) if isinstance(change, dict) else frame]
