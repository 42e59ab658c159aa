"""``agui`` (egress): AG-UI protocol events (``@ag-ui/core`` 1.x).

One encoder per stream. The sequence it writes passes ``@ag-ui/client``'s
``verifyEvents``: ``RUN_STARTED`` first; every message, reasoning span,
step and subagent that is opened is closed before ``RUN_FINISHED``; nothing
after the run ends. Mapping (see ``docs/protocols.md``):

=====================  ====================================================
canonical              AG-UI
=====================  ====================================================
(first event)          ``RUN_STARTED`` {threadId = runId = run_id}
``reasoning.delta``    ``REASONING_START`` + ``REASONING_MESSAGE_START``
                       on the first delta, then ``REASONING_MESSAGE_CONTENT``
``text.delta``         ``TEXT_MESSAGE_START`` (role assistant) on the first
                       delta, then ``TEXT_MESSAGE_CONTENT``
``tool.start``         ``TOOL_CALL_START`` + ``TOOL_CALL_ARGS`` (input as
                       JSON) + ``TOOL_CALL_END`` (toolCallId = call_id)
``tool.end``           ``TOOL_CALL_RESULT`` (content = output, or the error
                       when ``ok`` is false; ``metadata.runwire.ok``)
``step.boundary``      ``STEP_FINISHED`` of the step opened by the first
                       event after the previous boundary (``STEP_STARTED``,
                       ``stepName = "step-<n>"``); index/kind in metadata
``child.spawn``        ``SUBAGENT_STARTED`` {subagentRunId = child_id}
events with child_id   the same frames with ``subagentRunId = child_id``
                       (a subagent is started on its first event if no
                       spawn was seen); its terminal lifecycle →
                       ``SUBAGENT_FINISHED`` / ``SUBAGENT_ERROR``
``run.lifecycle``      done → ``RUN_FINISHED`` outcome success; aborted →
                       ``RUN_FINISHED`` outcome cancelled; error →
                       ``RUN_ERROR``; other states → ``CUSTOM``
                       ``run.lifecycle``
``plan.proposal``,     ``CUSTOM`` {name = type, value = payload}
``x.*``
=====================  ====================================================

A text or reasoning message ends when the other kind starts, at a tool
call, a step boundary or the end of the run. Ids are derived from the run id
and the seq of the event that opened the message, so an encoder primed with
events 1..N is in the same state as one that streamed them live, and
:meth:`AguiEgress.preamble` re-opens exactly what a client joining at N+1
needs. Events after the run's terminal event are not written (AG-UI allows
nothing after ``RUN_FINISHED``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..core import envelope
from ..core.envelope import Event, known
from .base import Egress

Frame = dict[str, Any]
INCOMPLETE_MESSAGE = "stream ended without a terminal event"


@dataclass
class _Lane:
    """What is open for the parent run (``child_id`` None) or one child run."""

    subagent: str | None
    text_id: str | None = None
    reasoning_id: str | None = None
    step_name: str | None = None
    steps_done: int = 0


@dataclass
class _PendingCall:
    lane: str | None
    frames: list[Frame] = field(default_factory=list)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _content(payload: envelope.ToolEndPayload) -> str:
    output, error = known(payload.output), known(payload.error)
    value = output if payload.ok else (error if error is not None else output)
    if value is None:
        return ""
    return value if isinstance(value, str) else _dumps(value)


class AguiEgress(Egress):
    """Canonical events → AG-UI events for one run's stream."""

    name = "agui"

    def __init__(self) -> None:
        self._run_started: Frame | None = None
        self._thread_id = ""
        self._run_id = ""
        self._ended: list[Frame] | None = None
        self._lanes: dict[str | None, _Lane] = {}
        self._subagents: dict[str, Frame] = {}
        self._subagents_done: set[str] = set()
        self._pending: dict[str, _PendingCall] = {}
        self._ts: int | None = None

    # --- the Egress interface -------------------------------------------

    def convert(self, event: Event) -> list[Any]:
        if self._ended is not None:
            return []
        self._ts = envelope.ts_ms(event.ts)
        out: list[Frame] = []
        if self._run_started is None:
            out.append(self._start_run(event))
        lane = self._lane(event.child_id, out, parent=event.parent_id)
        out.extend(self._dispatch(event, lane))
        return out

    def finish(self) -> list[Any]:
        if self._run_started is None or self._ended is not None:
            return []
        self._ts = None
        out = self._close_everything()
        end = {"type": "RUN_ERROR", "message": INCOMPLETE_MESSAGE, "code": "incomplete"}
        self._ended = [end]
        return [*out, end]

    def preamble(self) -> list[Any]:
        if self._run_started is None:
            return []
        out: list[Frame] = [dict(self._run_started)]
        if self._ended is not None:
            return [*out, *self._ended]
        for frame in self._subagents.values():
            again = dict(frame)
            if again.get("parentSubagentRunId") not in self._subagents:
                again.pop("parentSubagentRunId", None)  # the parent ended before this client came
            out.append(again)
        for lane in self._lanes.values():
            out.extend(self._reopen(lane))
        for call in self._pending.values():
            out.extend(dict(frame) for frame in call.frames)
        return out

    # --- framing helpers ---------------------------------------------------

    def _frame(self, kind: str, lane: _Lane | None = None, **fields: Any) -> Frame:
        frame: Frame = {"type": kind, **{k: v for k, v in fields.items() if v is not None}}
        if lane is not None and lane.subagent is not None:
            frame["subagentRunId"] = lane.subagent
        if self._ts is not None:
            frame["timestamp"] = self._ts
        return frame

    def _start_run(self, event: Event) -> Frame:
        self._run_id = event.run_id
        self._thread_id = event.run_id
        frame = {"type": "RUN_STARTED", "threadId": self._thread_id, "runId": self._run_id}
        self._run_started = frame
        return dict(frame)

    def _lane(self, child_id: str | None, out: list[Frame], *, parent: str | None = None) -> _Lane:
        lane = self._lanes.get(child_id)
        if lane is None:
            lane = self._lanes[child_id] = _Lane(subagent=child_id)
        if child_id is not None and child_id not in self._subagents and child_id not in self._subagents_done:
            out.extend(self._start_subagent(child_id, parent, None))
        return lane

    def _start_subagent(self, child_id: str, parent: str | None, prompt: str | None) -> list[Frame]:
        fields: dict[str, Any] = {"subagentRunId": child_id, "name": child_id}
        if prompt:
            fields["description"] = prompt
        if parent is not None and parent in self._subagents:
            fields["parentSubagentRunId"] = parent
        frame = self._frame("SUBAGENT_STARTED", **fields)
        self._subagents[child_id] = frame
        return [frame]

    # --- dispatch ---------------------------------------------------------

    def _dispatch(self, event: Event, lane: _Lane) -> list[Frame]:
        if isinstance(event, envelope.ReasoningDelta):
            return self._reasoning(event, lane)
        if isinstance(event, envelope.TextDelta):
            return self._text(event, lane)
        if isinstance(event, envelope.ToolStart):
            return self._tool_start(event, lane)
        if isinstance(event, envelope.ToolEnd):
            return self._tool_end(event, lane)
        if isinstance(event, envelope.StepBoundary):
            return self._step_boundary(event, lane)
        if isinstance(event, envelope.ChildSpawn):
            return self._child_spawn(event, lane)
        if isinstance(event, envelope.RunLifecycle):
            return self._lifecycle(event, lane)
        return [self._frame("CUSTOM", lane, name=event.type, value=event.payload_dict())]

    def _reasoning(self, event: envelope.ReasoningDelta, lane: _Lane) -> list[Frame]:
        out = self._close_text(lane)
        out.extend(self._open_step(lane))
        if lane.reasoning_id is None:
            lane.reasoning_id = f"{self._run_id}:r{event.seq}"
            out.extend(self._open_reasoning(lane))
        if event.payload.text:
            out.append(self._frame("REASONING_MESSAGE_CONTENT", lane, messageId=lane.reasoning_id,
                                   delta=event.payload.text))
        return out

    def _text(self, event: envelope.TextDelta, lane: _Lane) -> list[Frame]:
        out = self._close_reasoning(lane)
        out.extend(self._open_step(lane))
        if lane.text_id is None:
            lane.text_id = f"{self._run_id}:m{event.seq}"
            out.extend(self._open_text(lane))
        if event.payload.text:
            out.append(self._frame("TEXT_MESSAGE_CONTENT", lane, messageId=lane.text_id, delta=event.payload.text))
        return out

    def _tool_start(self, event: envelope.ToolStart, lane: _Lane) -> list[Frame]:
        out = self._close_messages(lane)
        out.extend(self._open_step(lane))
        call_id = event.payload.call_id
        frames = [self._frame("TOOL_CALL_START", lane, toolCallId=call_id, toolCallName=event.payload.tool)]
        if (arguments := known(event.payload.input)) is not None:
            frames.append(self._frame("TOOL_CALL_ARGS", lane, toolCallId=call_id, delta=_dumps(arguments)))
        frames.append(self._frame("TOOL_CALL_END", lane, toolCallId=call_id))
        self._pending[call_id] = _PendingCall(lane.subagent, frames)
        return [*out, *frames]

    def _tool_end(self, event: envelope.ToolEnd, lane: _Lane) -> list[Frame]:
        p = event.payload
        self._pending.pop(p.call_id, None)
        meta: dict[str, Any] = {"ok": p.ok}
        if (duration := known(p.duration_ms)) is not None:
            meta["duration_ms"] = duration
        if (blob := known(p.blob_ref)) is not None:
            meta["blob_ref"] = blob
        return [self._frame("TOOL_CALL_RESULT", lane, messageId=f"{p.call_id}:result", toolCallId=p.call_id,
                            content=_content(p), role="tool", metadata={"runwire": meta})]

    def _step_boundary(self, event: envelope.StepBoundary, lane: _Lane) -> list[Frame]:
        out = self._close_messages(lane)
        out.extend(self._open_step(lane))
        meta: dict[str, Any] = {"step_index": event.payload.step_index, "step_kind": event.payload.step_kind}
        if (checkpoint := known(event.payload.checkpoint_id)) is not None:
            meta["checkpoint_id"] = checkpoint
        out.append(self._frame("STEP_FINISHED", lane, stepName=lane.step_name, metadata={"runwire": meta}))
        lane.step_name = None
        lane.steps_done += 1
        return out

    def _child_spawn(self, event: envelope.ChildSpawn, lane: _Lane) -> list[Frame]:
        child = event.payload.child_id
        if child in self._subagents or child in self._subagents_done:
            return [self._frame("CUSTOM", lane, name=event.type, value=event.payload_dict())]
        frames = self._start_subagent(child, lane.subagent, known(event.payload.prompt))
        if (tools := known(event.payload.tools_allowed)) is not None:
            frames[0]["metadata"] = {"runwire": {"tools_allowed": tools}}
        return frames

    def _lifecycle(self, event: envelope.RunLifecycle, lane: _Lane) -> list[Frame]:
        p = event.payload
        if p.state not in envelope.TERMINAL_STATES:
            return [self._frame("CUSTOM", lane, name=event.type, value=event.payload_dict())]
        if lane.subagent is not None:
            self._lanes.pop(lane.subagent, None)  # a finished child keeps no state
            return [*self._close_lane(lane), *self._finish_subagent(lane.subagent, p)]
        out = self._close_everything()
        meta = {"runwire": {"dropped_count": p.dropped_count}} if p.dropped_count else None
        if p.state == "error":
            end = self._frame("RUN_ERROR", message=p.reason or "run failed", code="error", metadata=meta)
        else:
            outcome = {"type": "success" if p.state == "done" else "cancelled"}
            end = self._frame("RUN_FINISHED", threadId=self._thread_id, runId=self._run_id, outcome=outcome,
                              result={"reason": p.reason} if p.reason else None, metadata=meta)
        self._ended = [end]
        return [*out, end]

    def _finish_subagent(self, child: str, p: envelope.RunLifecyclePayload) -> list[Frame]:
        if self._subagents.pop(child, None) is None:
            return []
        self._subagents_done.add(child)
        if p.state == "done":
            return [self._frame("SUBAGENT_FINISHED", subagentRunId=child, outcome={"type": "success"})]
        default = "aborted" if p.state == "aborted" else "run failed"
        return [self._frame("SUBAGENT_ERROR", subagentRunId=child, message=p.reason or default, code=p.state)]

    # --- opening and closing --------------------------------------------

    def _open_step(self, lane: _Lane) -> list[Frame]:
        if lane.step_name is not None:
            return []
        lane.step_name = f"step-{lane.steps_done + 1}"
        return [self._frame("STEP_STARTED", lane, stepName=lane.step_name)]

    def _open_text(self, lane: _Lane) -> list[Frame]:
        return [self._frame("TEXT_MESSAGE_START", lane, messageId=lane.text_id, role="assistant")]

    def _open_reasoning(self, lane: _Lane) -> list[Frame]:
        return [
            self._frame("REASONING_START", lane, messageId=lane.reasoning_id),
            self._frame("REASONING_MESSAGE_START", lane, messageId=lane.reasoning_id, role="reasoning"),
        ]

    def _reopen(self, lane: _Lane) -> list[Frame]:
        saved, self._ts = self._ts, None
        out: list[Frame] = []
        if lane.step_name is not None:
            out.append(self._frame("STEP_STARTED", lane, stepName=lane.step_name))
        if lane.reasoning_id is not None:
            out.extend(self._open_reasoning(lane))
        if lane.text_id is not None:
            out.extend(self._open_text(lane))
        self._ts = saved
        return out

    def _close_text(self, lane: _Lane) -> list[Frame]:
        if lane.text_id is None:
            return []
        frame = self._frame("TEXT_MESSAGE_END", lane, messageId=lane.text_id)
        lane.text_id = None
        return [frame]

    def _close_reasoning(self, lane: _Lane) -> list[Frame]:
        if lane.reasoning_id is None:
            return []
        rid, lane.reasoning_id = lane.reasoning_id, None
        return [
            self._frame("REASONING_MESSAGE_END", lane, messageId=rid),
            self._frame("REASONING_END", lane, messageId=rid),
        ]

    def _close_messages(self, lane: _Lane) -> list[Frame]:
        return [*self._close_reasoning(lane), *self._close_text(lane)]

    def _close_lane(self, lane: _Lane) -> list[Frame]:
        out = self._close_messages(lane)
        if lane.step_name is not None:
            out.append(self._frame("STEP_FINISHED", lane, stepName=lane.step_name))
            lane.step_name = None
            lane.steps_done += 1
        return out

    def _close_everything(self) -> list[Frame]:
        out: list[Frame] = []
        for lane in self._lanes.values():
            out.extend(self._close_lane(lane))
        for child in list(reversed(self._subagents)):
            self._subagents.pop(child)
            self._subagents_done.add(child)
            out.append(self._frame("SUBAGENT_FINISHED", subagentRunId=child))
        self._pending.clear()
        return out
