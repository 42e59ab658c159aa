"""What ``runwire tail`` shows: a run's state folded from its events, rendered with rich.

``RunView.apply(event)`` folds one canonical event (a decoded JSON object)
into the view; ``render()`` draws it — reasoning dimmed and collapsed to its
last lines, the answer text, a card per tool call (running / ok / failed,
duration, error), child runs with their state, lifecycle, token usage and
dropped count. ``plain_line(event)`` is the one-line-per-event form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

TERMINAL_STATES = frozenset({"done", "aborted", "error"})
REASONING_TAIL_CHARS = 240
"""Reasoning is collapsed to its last this-many characters."""


@dataclass
class ToolCard:
    call_id: str
    tool: str
    child_id: str | None = None
    status: str = "running"
    duration_ms: int | None = None
    error: str | None = None


@dataclass
class ChildRun:
    child_id: str
    prompt: str | None = None
    state: str = "spawned"
    text: str = ""


@dataclass
class RunView:
    """A run as far as its events so far tell."""

    run_id: str
    state: str = "waiting"
    reason: str | None = None
    reasoning: str = ""
    text: str = ""
    tools: dict[str, ToolCard] = field(default_factory=dict)
    children: dict[str, ChildRun] = field(default_factory=dict)
    events: int = 0
    last_seq: int = 0
    dropped: int = 0
    gaps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    plan: list[str] = field(default_factory=list)
    step: str | None = None
    last_type: str = ""
    """Type of the run's own previous event (a delta after other events starts a new block)."""

    @property
    def ended(self) -> bool:
        """Whether the run's own terminal lifecycle event has been seen."""
        return self.state in TERMINAL_STATES

    def apply(self, event: dict[str, Any]) -> None:
        """Fold one event into the view."""
        self.events += 1
        self.last_seq = max(self.last_seq, int(event.get("seq") or 0))
        kind = str(event.get("type", ""))
        payload = event.get("payload") or {}
        child_id = event.get("child_id")
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, payload, child_id)
        if child_id is None:
            self.last_type = kind

    def _child(self, child_id: str) -> ChildRun:
        return self.children.setdefault(child_id, ChildRun(child_id))

    def _on_reasoning(self, payload: dict[str, Any], child_id: str | None) -> None:
        if child_id is None:
            if self.reasoning and self.last_type != "reasoning.delta":
                self.reasoning += "\n"  # a new block of thought after other events
            self.reasoning += str(payload.get("text", ""))

    def _on_text(self, payload: dict[str, Any], child_id: str | None) -> None:
        if child_id is None:
            if self.text and self.last_type != "text.delta":
                self.text += "\n"
            self.text += str(payload.get("text", ""))
        else:
            self._child(child_id).text += str(payload.get("text", ""))

    def _on_tool_start(self, payload: dict[str, Any], child_id: str | None) -> None:
        call_id = str(payload.get("call_id"))
        self.tools[call_id] = ToolCard(call_id, str(payload.get("tool")), child_id)

    def _on_tool_end(self, payload: dict[str, Any], child_id: str | None) -> None:
        call_id = str(payload.get("call_id"))
        card = self.tools.setdefault(call_id, ToolCard(call_id, "?", child_id))
        card.status = "ok" if payload.get("ok") else "failed"
        card.duration_ms = payload.get("duration_ms")
        error = payload.get("error")
        if error is not None:
            card.error = (
                error.get("message", json.dumps(error)) if isinstance(error, dict) else str(error)
            )

    def _on_spawn(self, payload: dict[str, Any], child_id: str | None) -> None:
        if child_id is None:
            self._child(str(payload.get("child_id"))).prompt = payload.get("prompt")

    def _on_lifecycle(self, payload: dict[str, Any], child_id: str | None) -> None:
        state = str(payload.get("state"))
        if child_id is not None:
            self._child(child_id).state = state
            return
        self.state = state
        self.reason = payload.get("reason")
        if payload.get("dropped_count"):
            self.dropped = int(payload["dropped_count"])

    def _on_usage(self, payload: dict[str, Any], child_id: str | None) -> None:
        self.input_tokens += int(payload.get("input_tokens") or 0)
        self.output_tokens += int(payload.get("output_tokens") or 0)

    def _on_plan(self, payload: dict[str, Any], child_id: str | None) -> None:
        if child_id is None:
            steps = (payload.get("plan") or {}).get("steps") or []
            self.plan = [str(step.get("title", "")) for step in steps]

    def _on_step(self, payload: dict[str, Any], child_id: str | None) -> None:
        if child_id is None:
            self.step = f"{payload.get('step_index')} {payload.get('step_kind')}"

    def _on_gap(self, payload: dict[str, Any], child_id: str | None) -> None:
        self.gaps += 1

    # ---- rendering ---------------------------------------------------
    def render(self) -> RenderableType:
        """The whole view as one rich renderable."""
        parts: list[RenderableType] = [self._header()]
        if self.plan:
            parts.append(Text("plan: " + " → ".join(self.plan), style="cyan"))
        if self.reasoning:
            parts.append(
                Panel(
                    Text(_collapsed(self.reasoning), style="dim italic"),
                    title="reasoning",
                    border_style="dim",
                )
            )
        if self.tools:
            parts.append(self._tool_table())
        if self.children:
            parts.append(self._child_table())
        if self.text:
            parts.append(Panel(Text(self.text), title="answer"))
        return Group(*parts)

    def _header(self) -> Text:
        style = {"done": "bold green", "aborted": "bold yellow", "error": "bold red"}.get(
            self.state, "bold blue"
        )
        header = Text.assemble(("run ", "bold"), (self.run_id, "bold"), "  ", (self.state, style))
        if self.reason:
            header.append(f" ({self.reason})", style=style)
        header.append(f"   seq {self.last_seq} · {self.events} events")
        if self.step:
            header.append(f" · step {self.step}")
        header.append(f" · tokens {self.input_tokens}/{self.output_tokens}")
        header.append(f" · dropped {self.dropped}", style="red" if self.dropped else "")
        if self.gaps:
            header.append(f" · gaps {self.gaps}", style="red")
        return header

    def _tool_table(self) -> Table:
        table = Table(title="tools", title_justify="left", expand=True)
        for column in ("tool", "run", "status", "duration", "error"):
            table.add_column(column)
        colors = {"ok": "green", "failed": "red", "running": "yellow"}
        for card in self.tools.values():
            duration = f"{card.duration_ms} ms" if card.duration_ms is not None else ""
            table.add_row(
                card.tool,
                card.child_id or "",
                Text(card.status, style=colors.get(card.status, "")),
                duration,
                Text(card.error or "", style="red"),
            )
        return table

    def _child_table(self) -> Table:
        table = Table(title="child runs", title_justify="left", expand=True)
        for column in ("child", "task", "state", "says"):
            table.add_column(column)
        for child in self.children.values():
            table.add_row(
                child.child_id, child.prompt or "", child.state, _collapsed(child.text, 80)
            )
        return table


_HANDLERS = {
    "reasoning.delta": RunView._on_reasoning,
    "text.delta": RunView._on_text,
    "tool.start": RunView._on_tool_start,
    "tool.end": RunView._on_tool_end,
    "child.spawn": RunView._on_spawn,
    "run.lifecycle": RunView._on_lifecycle,
    "x.usage": RunView._on_usage,
    "plan.proposal": RunView._on_plan,
    "step.boundary": RunView._on_step,
    "x.gap": RunView._on_gap,
}


def _collapsed(text: str, limit: int = REASONING_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "… " + text[-limit:]


def plain_line(event: dict[str, Any]) -> str:
    """One event as one line: ``seq type child summary``."""
    seq = event.get("seq", "")
    kind = str(event.get("type", ""))
    child = event.get("child_id") or "-"
    return f"{seq} {kind} {child} {_summary(kind, event.get('payload') or {})}".rstrip()


def _summary(kind: str, payload: dict[str, Any]) -> str:
    if kind in ("reasoning.delta", "text.delta"):
        return json.dumps(payload.get("text", ""))
    if kind == "tool.start":
        return f"{payload.get('tool')} {payload.get('call_id')}"
    if kind == "tool.end":
        status = "ok" if payload.get("ok") else "failed"
        return f"{payload.get('call_id')} {status} {payload.get('duration_ms', '')}".rstrip()
    if kind == "run.lifecycle":
        extra = f" dropped={payload['dropped_count']}" if payload.get("dropped_count") else ""
        reason = f" {json.dumps(payload['reason'])}" if payload.get("reason") else ""
        return f"{payload.get('state')}{reason}{extra}"
    if kind == "child.spawn":
        return str(payload.get("child_id"))
    return json.dumps(payload, separators=(",", ":"))[:200]
