"""Re-assemble a stored run's chat messages (Cogency streaming protocol, "Storage → Messages Transformation").

Input is a run's canonical events in seq order (raw or shaped view: deltas
are concatenated either way). Two output styles:

``chat`` (default) — the common chat-completions shape::

    {"role": "user", "content": "debug app.py"}
    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "read", "arguments": "{\\"file\\": \\"app.py\\"}"}}]}
    {"role": "tool", "tool_call_id": "c1", "content": "..."}
    {"role": "assistant", "content": "fixed the bug"}

``cogency`` — the Cogency streaming protocol's own wire shape: reasoning as ``<think>…</think>``,
a turn's calls batched as ``<execute>[…]</execute>``, tool results as a
*user* message ``<results>[…]</results>`` (Cogency streaming protocol: "Tool results become
user messages"), the answer as plain assistant text.

Mapping: ``x.<ns>.user`` events with a string ``content`` (cogency's ``user``
becomes ``x.cogency.user``) → user messages; ``text.delta`` → assistant
text; ``reasoning.delta`` → left out in ``chat`` unless ``reasoning=True``
(then ``reasoning_content``), ``<think>`` in ``cogency``; ``tool.start`` →
a tool call of the open assistant turn; ``tool.end`` (or a result stored in
the Cogency streaming protocol's text form, ``x.<ns>.result``, answering the oldest open call) →
a tool result, which closes the turn. Events of child runs (``child_id`` set) are left out unless
``children=True``; then each run's text (and reasoning) in a turn stays whole — the run's own
first, then each child's in the order it first spoke — joined by ``SEPARATOR`` (a blank line),
however the runs' deltas interleaved. Other events (steps, lifecycle, usage …) carry no message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from ..core.envelope import Event, Extension, ReasoningDelta, TextDelta, ToolEnd, ToolStart, known

Message = dict[str, Any]
Style = Literal["chat", "cogency"]
SEPARATOR = "\n\n"
"""Between the texts of two runs (the run's own, a child's) in one message (``children=True``)."""


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def stored_result(event: Event) -> tuple[bool, Any] | None:
    """``(ok, content)`` of a result stored in its text form (``x.<ns>.result``), else None.

    The Cogency streaming protocol stores ``{"type": "result", "content": "{\"outcome\": …, \"content\": …}"}``;
    it answers the oldest unanswered call.
    """
    if not isinstance(event, Extension) or not event.type.endswith(".result"):
        return None
    raw = event.payload.get("content", event.payload.get("payload"))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return True, raw
    if isinstance(raw, dict):
        ok = not raw.get("error")
        return ok, raw.get("content") if ok else raw.get("outcome")
    return True, raw


def user_content(event: Event) -> str | None:
    """The text of a user-message extension event (``x.<ns>.user``), else None."""
    if not isinstance(event, Extension) or not event.type.endswith(".user"):
        return None
    content = event.payload.get("content")
    return content if isinstance(content, str) else None


class _Text:
    """Deltas of one turn, kept whole per run that spoke (the run itself: ``None``)."""

    def __init__(self) -> None:
        self.by_run: dict[str | None, list[str]] = {}

    def add(self, event: TextDelta | ReasoningDelta) -> None:
        self.by_run.setdefault(event.child_id, []).append(event.payload.text)

    def __bool__(self) -> bool:
        return bool(self.by_run)

    def joined(self) -> str:
        own = self.by_run.get(None, [])
        children = [parts for run, parts in self.by_run.items() if run is not None]
        return SEPARATOR.join("".join(parts) for parts in ([own] if own else []) + children)


class _Turn:
    """One assistant turn being collected: reasoning, text, tool calls."""

    def __init__(self) -> None:
        self.reasoning = _Text()
        self.text = _Text()
        self.calls: list[ToolStart] = []

    def empty(self) -> bool:
        return not (self.reasoning or self.text or self.calls)


class MessageAssembler:
    """Folds a run's events into messages, one event at a time (bounded by the messages)."""

    def __init__(
        self, *, style: Style = "chat", reasoning: bool = False, children: bool = False
    ) -> None:
        self.style = style
        self.reasoning = reasoning
        self.children = children
        self.messages: list[Message] = []
        self._turn = _Turn()
        self._results: list[dict[str, Any]] = []
        self._tools: dict[str, str] = {}
        self._unanswered: list[str] = []

    def add(self, event: Event) -> None:
        if event.child_id is not None and not self.children:
            return
        user = user_content(event)
        if user is not None:
            self._close()
            self.messages.append({"role": "user", "content": user})
        elif isinstance(event, TextDelta):
            self._open_turn().text.add(event)
        elif isinstance(event, ReasoningDelta):
            self._open_turn().reasoning.add(event)
        elif isinstance(event, ToolStart):
            self._open_turn().calls.append(event)
            self._tools[event.payload.call_id] = event.payload.tool
            self._unanswered.append(event.payload.call_id)
        elif isinstance(event, ToolEnd):
            self._flush_turn()
            payload = event.payload
            if payload.call_id in self._unanswered:
                self._unanswered.remove(payload.call_id)
            output = known(payload.output)
            content = output if payload.ok else (known(payload.error) or output)
            self._add_result(payload.call_id, payload.ok, content)
        else:
            result = stored_result(event)
            if result is not None:
                self._flush_turn()
                call_id = self._unanswered.pop(0) if self._unanswered else ""
                self._add_result(call_id, *result)

    def finish(self) -> list[Message]:
        """The messages, with the last open turn closed."""
        self._close()
        return self.messages

    # ---- turns -----------------------------------------------------------
    def _open_turn(self) -> _Turn:
        if self._results:  # text after tool results starts the next turn
            self._flush_results()
        return self._turn

    def _close(self) -> None:
        self._flush_turn()
        self._flush_results()

    def _flush_turn(self) -> None:
        turn, self._turn = self._turn, _Turn()
        if turn.empty():
            return
        if self.style == "cogency":
            self.messages.append({"role": "assistant", "content": _cogency_turn(turn)})
            return
        if not (turn.text or turn.calls) and not self.reasoning:
            return
        message: Message = {"role": "assistant", "content": turn.text.joined() or None}
        if self.reasoning and turn.reasoning:
            message["reasoning_content"] = turn.reasoning.joined()
        if turn.calls:
            message["tool_calls"] = [_chat_call(call) for call in turn.calls]
        self.messages.append(message)

    def _add_result(self, call_id: str, ok: bool, content: Any) -> None:
        if self.style == "chat":
            self.messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _as_text(content)}
            )
            return
        self._results.append({
            "tool": self._tools.get(call_id, ""),
            "status": "success" if ok else "failure",
            "content": content,
        })

    def _flush_results(self) -> None:
        if not self._results:
            return
        body = json.dumps(self._results, ensure_ascii=False)
        self.messages.append({"role": "user", "content": f"<results>\n{body}\n</results>"})
        self._results = []


def _chat_call(call: ToolStart) -> dict[str, Any]:
    arguments = known(call.payload.input)
    return {
        "id": call.payload.call_id,
        "type": "function",
        "function": {
            "name": call.payload.tool,
            "arguments": _as_text({} if arguments is None else arguments),
        },
    }


def _cogency_turn(turn: _Turn) -> str:
    parts: list[str] = []
    if turn.reasoning:
        parts.append(f"<think>{turn.reasoning.joined()}</think>")
    if turn.calls:
        calls = [{"name": c.payload.tool, "args": known(c.payload.input)} for c in turn.calls]
        parts.append(f"<execute>\n{json.dumps(calls, ensure_ascii=False)}\n</execute>")
    if turn.text:
        parts.append(turn.text.joined())
    return "\n\n".join(parts)


def to_messages(
    events: Iterable[Event],
    *,
    style: Style = "chat",
    reasoning: bool = False,
    children: bool = False,
) -> list[Message]:
    """A run's chat messages from its events (see the module docstring)."""
    assembler = MessageAssembler(style=style, reasoning=reasoning, children=children)
    for event in events:
        assembler.add(event)
    return assembler.finish()
