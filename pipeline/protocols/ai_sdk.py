"""``ai-sdk`` (egress): the Vercel AI SDK UI message stream (npm ``ai`` ≥ 5).

One run is one assistant message. Every chunk validates against ``ai``'s
``uiMessageChunkSchema`` and the stream is accepted by
``readUIMessageStream``: each text/reasoning part is started before its
deltas and ended before the step that holds it finishes; a tool result
follows its tool input. Mapping (see ``docs/protocols.md``):

=====================  ====================================================
canonical              UI message chunks
=====================  ====================================================
(first event)          ``start`` {messageId = run_id}
(first content event)  ``start-step``; ``step.boundary`` → ``finish-step``
``reasoning.delta``    ``reasoning-start`` on the first delta, then
                       ``reasoning-delta``; ``reasoning-end`` when it ends
``text.delta``         ``text-start`` / ``text-delta`` / ``text-end``
``tool.start``         ``tool-input-start`` + ``tool-input-available``
                       (``dynamic: true`` — tool names are not known to the
                       client's type system)
``tool.end``           ``tool-output-available``, or ``tool-output-error``
                       with ``errorText`` when ``ok`` is false
events with child_id   the same parts, with distinct ids and
                       ``providerMetadata.runwire.child_id``; a child's
                       ``step.boundary`` and other events become data parts
``run.lifecycle``      done → ``finish`` (stop); aborted → ``abort``;
                       error → ``error`` + ``finish`` (error); other
                       states → ``data-run.lifecycle``
anything else          ``data-<type>`` {id = event id, data = payload;
                       for a child's event ``{child_id, payload}``}
=====================  ====================================================

A text or reasoning part ends when the other kind starts in the same run,
at a tool call, at a step boundary (``finish-step`` ends every open part,
as the SDK's reader does) and at the end. Ids derive from the run id and
the opening event's seq; :meth:`AiSdkEgress.preamble` lets a client that
joins mid-stream continue (``start``, ``start-step``, the open parts, the
tool calls still waiting for a result).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..core import envelope
from ..core.envelope import Event, known
from .base import Egress

Frame = dict[str, Any]
INCOMPLETE_MESSAGE = "stream ended without a terminal event"


@dataclass
class _Lane:
    child: str | None
    text_id: str | None = None
    reasoning_id: str | None = None


class AiSdkEgress(Egress):
    """Canonical events → AI SDK UI message stream chunks for one run."""

    name = "ai-sdk"
    headers = {"x-vercel-ai-ui-message-stream": "v1"}

    def __init__(self) -> None:
        self._start: Frame | None = None
        self._run_id = ""
        self._ended: list[Frame] | None = None
        self._step_open = False
        self._lanes: dict[str | None, _Lane] = {}
        self._pending: dict[str, list[Frame]] = {}

    # --- the Egress interface -------------------------------------------

    def convert(self, event: Event) -> list[Any]:
        if self._ended is not None:
            return []
        out: list[Frame] = []
        if self._start is None:
            self._run_id = event.run_id
            self._start = {"type": "start", "messageId": event.run_id}
            out.append(dict(self._start))
        lane = self._lanes.get(event.child_id)
        if lane is None:
            lane = self._lanes[event.child_id] = _Lane(event.child_id)
        out.extend(self._dispatch(event, lane))
        return out

    def finish(self) -> list[Any]:
        if self._start is None or self._ended is not None:
            return []
        end = [{"type": "error", "errorText": INCOMPLETE_MESSAGE}, {"type": "finish", "finishReason": "error"}]
        self._ended = end
        return [*self._close_all(), *end]

    def preamble(self) -> list[Any]:
        if self._start is None:
            return []
        out: list[Frame] = [dict(self._start)]
        if self._ended is not None:
            return [*out, *self._ended]
        if self._step_open:
            out.append({"type": "start-step"})
        for lane in self._lanes.values():
            if lane.reasoning_id is not None:
                out.append(self._part_start("reasoning-start", lane.reasoning_id, lane))
            if lane.text_id is not None:
                out.append(self._part_start("text-start", lane.text_id, lane))
        for frames in self._pending.values():
            out.extend(dict(frame) for frame in frames)
        return out

    # --- dispatch ---------------------------------------------------------

    def _dispatch(self, event: Event, lane: _Lane) -> list[Frame]:
        if isinstance(event, envelope.ReasoningDelta | envelope.TextDelta):
            return self._delta(event, lane)
        if isinstance(event, envelope.ToolStart):
            return self._tool_start(event, lane)
        if isinstance(event, envelope.ToolEnd):
            return self._tool_end(event, lane)
        if isinstance(event, envelope.StepBoundary) and lane.child is None:
            return self._step_boundary()
        if isinstance(event, envelope.RunLifecycle) and event.payload.state in envelope.TERMINAL_STATES:
            return self._terminal(event, lane)
        return [self._data(event, lane)]

    def _delta(self, event: envelope.ReasoningDelta | envelope.TextDelta, lane: _Lane) -> list[Frame]:
        reasoning = isinstance(event, envelope.ReasoningDelta)
        out = self._close_text(lane) if reasoning else self._close_reasoning(lane)
        out.extend(self._open_step())
        if reasoning:
            if lane.reasoning_id is None:
                lane.reasoning_id = f"{self._run_id}:r{event.seq}"
                out.append(self._part_start("reasoning-start", lane.reasoning_id, lane))
            part_id, kind = lane.reasoning_id, "reasoning-delta"
        else:
            if lane.text_id is None:
                lane.text_id = f"{self._run_id}:t{event.seq}"
                out.append(self._part_start("text-start", lane.text_id, lane))
            part_id, kind = lane.text_id, "text-delta"
        if event.payload.text:
            out.append({"type": kind, "id": part_id, "delta": event.payload.text})
        return out

    def _tool_start(self, event: envelope.ToolStart, lane: _Lane) -> list[Frame]:
        out = [*self._close_reasoning(lane), *self._close_text(lane), *self._open_step()]
        frames = self._tool_input(event.payload.call_id, event.payload.tool, known(event.payload.input), lane)
        self._pending[event.payload.call_id] = frames
        return [*out, *frames]

    def _tool_input(self, call_id: str, tool: str, args: Any, lane: _Lane) -> list[Frame]:
        start: Frame = {"type": "tool-input-start", "toolCallId": call_id, "toolName": tool, "dynamic": True}
        ready: Frame = {"type": "tool-input-available", "toolCallId": call_id, "toolName": tool,
                        "input": args, "dynamic": True}
        meta = self._meta(lane)
        if meta is not None:
            start["providerMetadata"] = ready["providerMetadata"] = meta
        return [start, ready]

    def _tool_end(self, event: envelope.ToolEnd, lane: _Lane) -> list[Frame]:
        p = event.payload
        out: list[Frame] = []
        if self._pending.pop(p.call_id, None) is None:  # a result whose call this stream never saw
            out.extend([*self._open_step(), *self._tool_input(p.call_id, "unknown", None, lane)])
        if p.ok:
            out.append({"type": "tool-output-available", "toolCallId": p.call_id, "output": known(p.output),
                        "dynamic": True})
        else:
            error = p.error if isinstance(p.error, str) else json.dumps(known(p.error), ensure_ascii=False)
            out.append({"type": "tool-output-error", "toolCallId": p.call_id, "errorText": error,
                        "dynamic": True})
        return out

    def _step_boundary(self) -> list[Frame]:
        out = self._close_all()
        if not out or out[-1]["type"] != "finish-step":
            out.extend([{"type": "start-step"}, {"type": "finish-step"}])
        return out

    def _terminal(self, event: envelope.RunLifecycle, lane: _Lane) -> list[Frame]:
        p = event.payload
        if lane.child is not None:
            self._lanes.pop(lane.child, None)  # a finished child keeps no state
            return [*self._close_reasoning(lane), *self._close_text(lane), self._data(event, lane)]
        out = self._close_all()
        end: list[Frame] = []
        if p.dropped_count:
            end.append({"type": "message-metadata", "messageMetadata": {"runwire": {"dropped_count": p.dropped_count}}})
        if p.state == "done":
            end.append({"type": "finish", "finishReason": "stop"})
        elif p.state == "aborted":
            end.append({"type": "abort", "reason": p.reason} if p.reason else {"type": "abort"})
        else:
            end.append({"type": "error", "errorText": p.reason or "run failed"})
            end.append({"type": "finish", "finishReason": "error"})
        self._ended = end
        return [*out, *end]

    def _data(self, event: Event, lane: _Lane) -> Frame:
        payload = event.payload_dict()
        data = payload if lane.child is None else {"child_id": lane.child, "payload": payload}
        return {"type": f"data-{event.type}", "id": event.id, "data": data}

    # --- opening and closing --------------------------------------------

    def _meta(self, lane: _Lane) -> dict[str, Any] | None:
        return None if lane.child is None else {"runwire": {"child_id": lane.child}}

    def _part_start(self, kind: str, part_id: str, lane: _Lane) -> Frame:
        frame: Frame = {"type": kind, "id": part_id}
        meta = self._meta(lane)
        if meta is not None:
            frame["providerMetadata"] = meta
        return frame

    def _open_step(self) -> list[Frame]:
        if self._step_open:
            return []
        self._step_open = True
        return [{"type": "start-step"}]

    def _close_text(self, lane: _Lane) -> list[Frame]:
        if lane.text_id is None:
            return []
        part_id, lane.text_id = lane.text_id, None
        return [{"type": "text-end", "id": part_id}]

    def _close_reasoning(self, lane: _Lane) -> list[Frame]:
        if lane.reasoning_id is None:
            return []
        part_id, lane.reasoning_id = lane.reasoning_id, None
        return [{"type": "reasoning-end", "id": part_id}]

    def _close_all(self) -> list[Frame]:
        out: list[Frame] = []
        for lane in self._lanes.values():
            out.extend([*self._close_reasoning(lane), *self._close_text(lane)])
        if self._step_open:
            self._step_open = False
            out.append({"type": "finish-step"})
        return out
