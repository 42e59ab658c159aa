"""``streamweave`` (egress): the StreamWeave RPC's ``WeaveProgress`` view of a run.

Frames are ``{stage, progress, message, tool_name?, timestamp,
partial_result?}`` as the HTTP/SSE transport writes them
(``"stage": "EXECUTION_STAGE_…"``, ``timestamp`` in unix seconds). The view
is computed from the run's own events (the parent run's; a child run's
events, which carry ``child_id``, do not move the parent's progress) with
the StreamWeave RPC's stage/progress table:

====================  =====================================  ==================
stage                 emitted on                             progress
====================  =====================================  ==================
PATTERN_SELECTION     ``run.lifecycle`` planning,            10
                      ``plan.proposal``, awaiting_approval
LLM_GENERATION        the first delta of each turn (a turn   20 + 10 × (turn − 1),
                      starts at the run's first delta and    at most 40
                      after a tool call or step boundary)
TOOL_EXECUTION        every ``tool.start`` (``tool_name``)   50 + 5 × n, at most 80
SELF_CORRECTION       a ``tool.end`` with ``ok`` false       90
COMPLETED             ``run.lifecycle`` done                 100, with
                                                             ``partial_result``
FAILED                ``run.lifecycle`` error / aborted,     0
                      or :meth:`finish` with no terminal
====================  =====================================  ==================

``partial_result`` is ``{"type": "text", "data_json": <the final answer>}``
— the text of the run's last turn that produced text, written as the
StreamWeave RPC's curl example writes it (HTTP/SSE Implementation:
``"data_json":"The sum is 4"``); a run without text
reports its last tool output as ``{"type": "structured", "data_json":
<JSON>}``. GUARDRAIL_CHECK and SCHEMA_DISCOVERY have no canonical source
and are not emitted. Deltas inside a turn produce no frames: this is a
progress view, not a transcript.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import envelope
from ..core.envelope import Event, known
from .base import Egress

Frame = dict[str, Any]
PREFIX = "EXECUTION_STAGE_"
INCOMPLETE_MESSAGE = "Execution failed: stream ended without a terminal event"


def _stage(name: str) -> str:
    return PREFIX + name


class StreamWeaveEgress(Egress):
    """Canonical events → StreamWeave RPC ``WeaveProgress`` frames for one run."""

    name = "streamweave"

    def __init__(self) -> None:
        self._turn = 0
        self._in_turn = False
        self._tools = 0
        self._turn_text: list[str] = []
        self._final_text = ""
        self._last_output: Any = None
        self._tool_names: dict[str, str] = {}
        self._last: Frame | None = None
        self._ended = False
        self._ts = 0

    def convert(self, event: Event) -> list[Any]:
        if self._ended or event.child_id is not None:
            return []
        self._ts = envelope.ts_ms(event.ts) // 1000
        frame = self._frame_for(event)
        if frame is None:
            return []
        self._last = frame
        return [frame]

    def finish(self) -> list[Any]:
        if self._ended or self._last is None:
            return []
        return [self._end(self._progress("FAILED", 0, INCOMPLETE_MESSAGE))]

    def preamble(self) -> list[Any]:
        return [] if self._last is None else [dict(self._last)]

    # --- the view -------------------------------------------------------

    def _frame_for(self, event: Event) -> Frame | None:
        if isinstance(event, envelope.TextDelta | envelope.ReasoningDelta):
            return self._delta(event)
        if isinstance(event, envelope.ToolStart | envelope.ToolEnd | envelope.StepBoundary | envelope.RunLifecycle):
            self._end_turn()
        if isinstance(event, envelope.ToolStart):
            self._tools += 1
            self._tool_names[event.payload.call_id] = event.payload.tool
            return self._progress("TOOL_EXECUTION", min(50 + 5 * self._tools, 80),
                                  f"Executing tool: {event.payload.tool}", tool_name=event.payload.tool)
        if isinstance(event, envelope.ToolEnd):
            return self._tool_end(event.payload)
        if isinstance(event, envelope.PlanProposal):
            steps = len(event.payload.plan.steps)
            return self._progress("PATTERN_SELECTION", 10, f"Selected a plan of {steps} steps")
        if isinstance(event, envelope.RunLifecycle):
            return self._lifecycle(event.payload)
        return None

    def _delta(self, event: envelope.TextDelta | envelope.ReasoningDelta) -> Frame | None:
        if isinstance(event, envelope.TextDelta):
            self._turn_text.append(event.payload.text)
        if self._in_turn:
            return None
        self._in_turn = True
        self._turn += 1
        return self._progress("LLM_GENERATION", min(20 + 10 * (self._turn - 1), 40),
                              f"Generating response (turn {self._turn})")

    def _end_turn(self) -> None:
        if not self._in_turn:
            return
        self._in_turn = False
        text = "".join(self._turn_text)
        self._turn_text = []
        if text:
            self._final_text = text

    def _tool_end(self, payload: envelope.ToolEndPayload) -> Frame | None:
        tool = self._tool_names.pop(payload.call_id, "tool")
        if payload.ok:
            self._last_output = known(payload.output)
            return None
        error = payload.error if isinstance(payload.error, str) else json.dumps(known(payload.error))
        return self._progress("SELF_CORRECTION", 90, f"Tool execution failed: {tool}: {error}", tool_name=tool)

    def _lifecycle(self, payload: envelope.RunLifecyclePayload) -> Frame | None:
        state = payload.state
        if state == "planning":
            return self._progress("PATTERN_SELECTION", 10, "Analyzing query and selecting patterns")
        if state == "awaiting_approval":
            return self._progress("PATTERN_SELECTION", 10, payload.reason or "Waiting for plan approval")
        if state == "done":
            frame = self._progress("COMPLETED", 100, payload.reason or "Execution completed")
            frame["partial_result"] = self._result()
            return self._end(frame)
        if state == "aborted":
            return self._end(self._progress("FAILED", 0, f"Execution cancelled: {payload.reason or 'aborted'}"))
        if state == "error":
            return self._end(self._progress("FAILED", 0, payload.reason or "Execution failed"))
        return None

    def _result(self) -> dict[str, str]:
        if self._final_text or self._last_output is None:
            return {"type": "text", "data_json": self._final_text}
        return {"type": "structured", "data_json": json.dumps(self._last_output, ensure_ascii=False)}

    def _end(self, frame: Frame) -> Frame:
        self._ended = True
        self._last = frame
        return frame

    def _progress(self, stage: str, progress: int, message: str, *, tool_name: str | None = None) -> Frame:
        frame: Frame = {"stage": _stage(stage), "progress": progress, "message": message}
        if tool_name is not None:
            frame["tool_name"] = tool_name
        frame["timestamp"] = self._ts
        return frame
