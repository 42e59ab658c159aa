"""A run's events as an OpenTelemetry GenAI span tree: the one derivation the page's timeline
and the OTLP exporter both read (docs/observability.md has the mapping table).

From a root run's stored stream (its sub-runs' events fanned in with ``child_id``):

* ``invoke_agent [{name}]`` per run and sub-run, from its first event (or its ``child.spawn``,
  if earlier) to its terminal ``run.lifecycle``; a sub-run's span is the child of its parent's.
  Status error when the run ended in ``error``. Approvals are its span events
  (``runwire.approval.requested`` at ``awaiting_approval``, ``runwire.approval.resolved`` at the
  next state).
* ``execute_tool {tool}`` per ``tool.start`` … ``tool.end`` (by ``call_id``), status error when
  ``ok`` is false.
* ``chat [{model}]`` per model step: a ``step.boundary`` of kind ``text-only`` or
  ``tool-roundtrip``, or any step in which the run reported ``x.usage`` (both say a model
  answered). It starts where the step's model call can have started — the run's previous
  boundary, start, or the last tool call or sub-run that ended since — and ends at the boundary;
  that step's usage is on it. Usage outside any model step is on the run's own span.

Every time is an event's ``ts``, never when a process saw it, so the tree is the same whoever
derives it and whenever. Ids are derived too: the trace id from the root run id, a span id from
what the span is (run, call, step), so spans written by several workers, or derived again after a
crash, are the same spans. Each span records the stream seq of the event that ended it
(``end_seq``), which is how the exporter knows what it already sent.

Message content (tool arguments and results, a model step's text) is kept only with
``content=True`` (the exporter's documented opt-in).

The exporter folds with this tree's compiled twin where it was built (``runwire.jobs._otlp``'s
``SpanFold``, content off: ``runwire.jobs.otlp.span_fold``), which calls the rarer rules below
(the agent's name, the errors' messages, the approval events) rather than having its own.

Longer than ~400 lines: one fold of one stream, where each event type's rules (which span it
opens, ends or adds to) read beside the others'; split by span kind, one event's effects would
be spread over several files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from msgspec import UNSET

from ..core.envelope import (
    ChildSpawn,
    Event,
    Extension,
    ReasoningDelta,
    RunLifecycle,
    StepBoundary,
    TextDelta,
    ToolEnd,
    ToolStart,
    Usage,
    known,
    ts_ms,
)
from ..core.events import TERMINAL_STATES

__all__ = ["MODEL_STEP_KINDS", "Span", "SpanEvent", "SpanTree", "derive_spans", "span_id", "trace_id"]

Operation = Literal["invoke_agent", "execute_tool", "chat"]
Status = Literal["unset", "ok", "error"]
MODEL_STEP_KINDS = frozenset({"text-only", "tool-roundtrip"})
"""Step kinds that say a model answered (the integrations publish one per model response)."""
CONTENT_CHARS = 16_384
"""The most characters of one content attribute (tool arguments, result, a step's text)."""
MESSAGE_CHARS = 512
"""The most characters of a status description (a tool's error, a run's reason)."""


class SpanEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A moment within a span (an approval asked for or given)."""

    name: str
    ts: str
    time_ns: int
    attributes: dict[str, Any] = {}


class Span(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One span of a run's tree; ``end_ts`` is None while it is open."""

    trace_id: str
    """32 hex digits, from the root run id."""
    span_id: str
    """16 hex digits, from what the span is."""
    parent_span_id: str | None
    name: str
    operation: Operation
    run_id: str
    """The run the span belongs to (the run itself for ``invoke_agent``)."""
    start_ts: str
    start_ns: int
    end_ts: str | None = None
    end_ns: int | None = None
    end_seq: int | None = None
    """The stream seq of the event that ended the span."""
    status: Status = "unset"
    status_message: str | None = None
    attributes: dict[str, Any] = {}
    events: list[SpanEvent] = []


def trace_id(root_id: str) -> str:
    """The trace id of a root run's tree."""
    return hashlib.sha256(b"runwire trace\0" + root_id.encode()).hexdigest()[:32]


def span_id(root_id: str, *what: str) -> str:
    """The span id of ``what`` (``("agent", run)``, ``("tool", run, call)``, ``("chat", run, n)``)."""
    return hashlib.sha256("\0".join(("runwire span", root_id, *what)).encode()).hexdigest()[:16]


def _span_ids(root_id: str) -> Any:
    """A SHA-256 fed the part of :func:`span_id`'s input that a root's spans share: a copy of it
    updated with the rest gives the same id at about two thirds of the cost."""
    return hashlib.sha256(f"runwire span\0{root_id}\0".encode())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(value: Any) -> str:
    return _clip(msgspec.json.encode(value).decode(), CONTENT_CHARS)


def _describe(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("message") or value.get("error") or value
    return _clip(value if isinstance(value, str) else msgspec.json.encode(value).decode(), MESSAGE_CHARS)


def _error_type(value: Any) -> str:
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return _clip(value["type"], 128)
    return "_OTHER"


# ---- the rarer rules, shared with the compiled fold (runwire.jobs._otlp.SpanFold calls these) ----


def agent_name(ext: dict[str, Any] | None) -> str | None:
    """The agent's name an event's ``ext`` gives (``{"agent": {"name": …}}``), clipped; else None."""
    if ext and isinstance(ext.get("agent"), dict) and isinstance(ext["agent"].get("name"), str):
        return _clip(ext["agent"]["name"], 256)
    return None


def tool_error(error: Any) -> tuple[str, str]:
    """A failed tool call's status message and ``error.type``, from its ``tool.end``'s ``error``."""
    error = known(error)
    return _describe(error) or "the tool call failed", _error_type(error)


def run_error(reason: Any) -> str:
    """The status message of a run that ended in ``error``, from its ``reason``."""
    return _describe(known(reason)) or "the run ended in error"


def approval_requested(event: RunLifecycle, at: int) -> SpanEvent:
    """The span event of a run that began to wait for an approval (its calls from ``ext``)."""
    ext = event.ext or {}
    calls = ext.get("approval", {}).get("calls") if isinstance(ext.get("approval"), dict) else None
    attributes: dict[str, Any] = {}
    if isinstance(calls, list):
        attributes["runwire.approval.calls"] = len(calls)
        attributes["runwire.approval.tools"] = [str(c.get("tool")) for c in calls if isinstance(c, dict)]
    if known(event.payload.reason):
        attributes["runwire.reason"] = _clip(str(event.payload.reason), MESSAGE_CHARS)
    return SpanEvent(name="runwire.approval.requested", ts=event.ts, time_ns=at, attributes=attributes)


def approval_resolved(event: RunLifecycle, at: int, awaiting: SpanEvent) -> SpanEvent:
    """The span event of a run whose wait for an approval ended (the state it went on in)."""
    return SpanEvent(name="runwire.approval.resolved", ts=event.ts, time_ns=at, attributes={
        "runwire.run.state": event.payload.state, "runwire.approval.wait_ms": (at - awaiting.time_ns) // 1_000_000})


_NONE: list[Span] = []
"""What most events end (never appended to)."""
_QUIET = frozenset({TextDelta, ReasoningDelta, Extension})
"""Event types that matter to a run's spans only when they open it (or carry ``ext``, or the
text of a model step with content on)."""


class _Run:
    """What the derivation holds for one run while its span is open."""

    __slots__ = ("awaiting", "chats", "children", "parent", "span", "step_start", "step_text",
                 "step_usage", "tools", "usage")

    def __init__(self, span: Span, parent: _Run | None) -> None:
        self.span = span
        self.parent = parent
        self.children: list[_Run] = []
        self.tools: dict[str, Span] = {}
        self.step_start: tuple[str, int] = (span.start_ts, span.start_ns)
        self.step_usage: list[Usage] = []
        self.step_text: list[str] = []
        self.usage = [0, 0]
        self.chats = 0
        self.awaiting: SpanEvent | None = None


class SpanTree:
    """Folds a root run's stream, one event at a time, into its spans.

    :meth:`apply` returns the spans an event ended (children before their parents); with
    ``keep`` the tree remembers every span for :meth:`spans` (the page), without it only the
    open ones (the exporter: memory bounded by what is open).
    """

    def __init__(self, root_id: str, *, content: bool = False, keep: bool = True) -> None:
        self.root_id = root_id
        self.trace_id = trace_id(root_id)
        self.content = content
        self.keep = keep
        self.last_seq = 0
        """The seq of the last event applied."""
        self._runs: dict[str, _Run] = {}
        self._done: set[str] = set()
        """Runs whose span ended (a later event of one is not a new run)."""
        self._all: list[Span] = []
        self._ended: list[Span] = []
        self._ids = _span_ids(root_id)

    def _id(self, what: str) -> str:
        """:func:`span_id` of this root and ``what`` (its parts joined with NULs)."""
        digest = self._ids.copy()
        digest.update(what.encode())
        return str(digest.hexdigest()[:16])

    # ---- reading ------------------------------------------------------------
    def spans(self) -> list[Span]:
        """Every span so far in the order they were opened (with ``keep``; else none)."""
        return list(self._all)

    @property
    def is_open(self) -> bool:
        """Whether a span is still open (a run's is, while anything under it is)."""
        return bool(self._runs)

    @property
    def span_count(self) -> int:
        """How many spans :meth:`spans` holds."""
        return len(self._all)

    def open_spans(self) -> list[Span]:
        """The spans not ended yet."""
        found: list[Span] = []
        for run in self._runs.values():
            found.append(run.span)
            found.extend(run.tools.values())
        return found

    # ---- folding ------------------------------------------------------------
    def apply_many(self, events: Sequence[Event], past: int = 0) -> list[Span]:
        """:meth:`apply` each of ``events`` (a stretch of the stream, seqs ascending); the spans
        they ended whose ``end_seq`` is past ``past``.

        Most of a stream are deltas of open runs, which change no span unless content is
        captured: those without ``ext`` are passed over here, a few bytecodes each and no call
        (for a run streaming many deltas, most of the exporter's CPU per event); the rest are folded one by one."""
        if not events:
            return []
        ended: list[Span] = []
        runs, apply = self._runs, self.apply
        text, reasoning, skip = TextDelta, ReasoningDelta, not self.content
        refs, count = self._refs(), len(runs)
        for event in events:
            kind = type(event)
            # a delta's child_ref: a sub-run's id, or absent (UNSET) or null on the root's own
            if skip and (kind is text or kind is reasoning) and event.ext is None and event.child_ref in refs:
                continue
            found = apply(event)
            if len(runs) != count:
                refs, count = self._refs(), len(runs)
            if found:  # each span an event ended has that event's seq as its end_seq
                if event.seq > past:
                    ended += found
                else:
                    ended += [span for span in found if span.end_seq is not None and span.end_seq > past]
        if events[-1].seq > self.last_seq:
            self.last_seq = events[-1].seq
        return ended

    def _refs(self) -> set[Any]:
        """The ``child_ref`` of a delta of an open run: its id, or (the root's) absent or null."""
        refs: set[Any] = set(self._runs)
        if self.root_id in refs:
            refs.update((UNSET, None))
        return refs

    def apply(self, event: Event) -> list[Span]:
        """Fold one event of the root's stream in; the spans it ended."""
        seq = event.seq
        if seq <= self.last_seq:
            return _NONE
        self.last_seq = seq
        kind, ref = type(event), event.child_ref
        run_id = self.root_id if ref is UNSET or ref is None else ref
        run = self._runs.get(run_id)
        if run is not None and kind in _QUIET and event.ext is None:
            if self.content and kind is TextDelta:
                run.step_text.append(event.payload.text)  # type: ignore[union-attr]
            return _NONE  # the common case, a delta of a run already open: nothing to do
        ended: list[Span] = []
        self._ended = ended
        at = ts_ms(event.ts) * 1_000_000
        # fanned in: the parent is known from its spawn (or the event names it)
        parent_id = event.parent_id if run_id is ref and event.parent_id and event.parent_id != ref else None
        if run is None or at < run.span.start_ns or parent_id is not None and (
                run.parent is None or run.parent.span.run_id != parent_id):
            run = self._run(run_id, parent_id, event, at)
            if run is None:
                return ended
        if event.ext is not None or event.thread_id:
            self._name(run, event)
        handle = _HANDLERS.get(kind)
        if handle is not None:
            handle(self, run, event, at)
        return ended

    def _run(self, run_id: str, parent_id: str | None, event: Event, at: int) -> _Run | None:
        run = self._runs.get(run_id)
        if run is not None:
            if parent_id is not None and (run.parent is None or run.parent.span.run_id != parent_id) \
                    and run_id != self.root_id:
                self._adopt(run, parent_id, event)
            if at < run.span.start_ns:  # a spawn stamped before the child's first event
                run.span.start_ns, run.span.start_ts = at, event.ts
            return run
        if run_id in self._done:
            return None  # an event after the run's end: its span is closed
        parent = None
        if run_id != self.root_id:
            parent = self._runs.get(parent_id or self.root_id) or self._run(self.root_id, None, event, at)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": run_id,
                                      "runwire.run_id": run_id}
        if event.tenant:
            attributes["runwire.tenant"] = event.tenant
        span = Span(trace_id=self.trace_id, span_id=self._id(f"agent\0{run_id}"),
                    parent_span_id=parent.span.span_id if parent else None, name="invoke_agent",
                    operation="invoke_agent", run_id=run_id, start_ts=event.ts, start_ns=at,
                    attributes=attributes)
        run = _Run(span, parent)
        if parent is not None:
            parent.children.append(run)
        self._runs[run_id] = run
        self._keep(span)
        return run

    def _adopt(self, run: _Run, parent_id: str, event: Event) -> None:
        """A deeper parent learned late (a sub-run's events before its parent's spawn)."""
        parent = self._runs.get(parent_id)
        if parent is None or parent is run or self._under(parent, run):
            return  # a parent under the run itself would make the tree a cycle: the first one stays
        if run.parent is not None and run in run.parent.children:
            run.parent.children.remove(run)
        run.parent = parent
        parent.children.append(run)
        run.span.parent_span_id = parent.span.span_id

    @staticmethod
    def _under(run: _Run, ancestor: _Run) -> bool:
        """Whether ``run`` is a descendant of ``ancestor``."""
        above = run.parent
        while above is not None:
            if above is ancestor:
                return True
            above = above.parent
        return False

    def _name(self, run: _Run, event: Event) -> None:
        name = agent_name(event.ext)
        if name is not None:
            run.span.attributes["gen_ai.agent.name"] = name
            run.span.name = f"invoke_agent {name}"
        thread = event.thread_id
        if thread and "gen_ai.conversation.id" not in run.span.attributes:
            run.span.attributes["gen_ai.conversation.id"] = thread

    def _tool_start(self, run: _Run, event: ToolStart, at: int) -> None:
        p = event.payload
        self._open_tool(run, p.call_id, p.tool, event.ts, at, p.input)

    def _open_tool(self, run: _Run, call_id: str, tool: str, ts: str, at: int, arguments: Any) -> Span:
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                      "gen_ai.tool.call.id": call_id, "runwire.run_id": run.span.run_id}
        if self.content and known(arguments) is not None:
            attributes["gen_ai.tool.call.arguments"] = _json(arguments)
        span = Span(trace_id=self.trace_id, span_id=self._id(f"tool\0{run.span.run_id}\0{call_id}"),
                    parent_span_id=run.span.span_id, name=f"execute_tool {tool}",
                    operation="execute_tool", run_id=run.span.run_id, start_ts=ts,
                    start_ns=at, attributes=attributes)
        run.tools[call_id] = span
        if self.keep:
            self._all.append(span)
        return span

    def _tool_end(self, run: _Run, event: ToolEnd, at: int) -> None:
        p = event.payload
        span = run.tools.pop(p.call_id, None)
        if span is None:  # its start is not in the stream: an end alone says when, not how long
            span = self._open_tool(run, p.call_id, "(unknown)", event.ts, at, None)
            del run.tools[p.call_id]
        if not p.ok:
            span.status = "error"
            span.status_message, span.attributes["error.type"] = tool_error(p.error)
        if self.content and known(p.output) is not None:
            span.attributes["gen_ai.tool.call.result"] = _json(p.output)
        self._end(span, event, at)
        if at > run.step_start[1]:
            run.step_start = (event.ts, at)

    def _usage(self, run: _Run, event: Usage, at: int) -> None:
        run.step_usage.append(event)

    def _text(self, run: _Run, event: TextDelta, at: int) -> None:
        if self.content:
            run.step_text.append(event.payload.text)

    def _spawn(self, run: _Run, event: ChildSpawn, at: int) -> None:
        self._run(event.payload.child_id, run.span.run_id, event, at)

    def _step(self, run: _Run, event: StepBoundary, at: int) -> None:
        p = event.payload
        if p.step_kind in MODEL_STEP_KINDS or run.step_usage:
            self._chat(run, event, at)
        run.step_start = (event.ts, at)
        if run.step_usage:
            run.step_usage = []
        if run.step_text:
            run.step_text = []

    def _chat(self, run: _Run, event: StepBoundary, at: int) -> None:
        start_ts, start_ns = run.step_start
        if start_ns > at:
            start_ts, start_ns = event.ts, at
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "runwire.run_id": run.span.run_id,
                                      "runwire.step.index": event.payload.step_index,
                                      "runwire.step.kind": event.payload.step_kind}
        model = None
        usage = run.step_usage
        if len(usage) == 1:
            only = usage[0].payload
            attributes["gen_ai.usage.input_tokens"] = only.input_tokens
            attributes["gen_ai.usage.output_tokens"] = only.output_tokens
            model = None if only.model is UNSET else only.model
        elif usage:
            attributes["gen_ai.usage.input_tokens"] = sum(u.payload.input_tokens for u in usage)
            attributes["gen_ai.usage.output_tokens"] = sum(u.payload.output_tokens for u in usage)
            model = next((known(u.payload.model) for u in reversed(usage) if known(u.payload.model)), None)
        if model:
            attributes["gen_ai.request.model"] = attributes["gen_ai.response.model"] = model
        if self.content and run.step_text:
            text = _clip("".join(run.step_text), CONTENT_CHARS)
            attributes["gen_ai.output.messages"] = msgspec.json.encode(
                [{"role": "assistant", "parts": [{"type": "text", "content": text}]}]).decode()
        span = Span(trace_id=self.trace_id, span_id=self._id(f"chat\0{run.span.run_id}\0{run.chats}"),
                    parent_span_id=run.span.span_id, name=f"chat {model}" if model else "chat",
                    operation="chat", run_id=run.span.run_id, start_ts=start_ts, start_ns=start_ns,
                    attributes=attributes)
        run.chats += 1
        if self.keep:
            self._all.append(span)
        span.end_ts, span.end_ns, span.end_seq = event.ts, at, event.seq  # at ≥ its start (above)
        self._ended.append(span)

    def _lifecycle(self, run: _Run, event: RunLifecycle, at: int) -> None:
        p = event.payload
        if run.awaiting is not None and p.state != "awaiting_approval":
            run.span.events.append(approval_resolved(event, at, run.awaiting))
            run.awaiting = None
        if p.state == "awaiting_approval" and run.awaiting is None:
            run.awaiting = approval_requested(event, at)
            run.span.events.append(run.awaiting)
        if p.state in TERMINAL_STATES:
            run.span.attributes["runwire.run.state"] = p.state
            if p.state == "error":
                run.span.status = "error"
                run.span.status_message = run_error(p.reason)
                run.span.attributes["error.type"] = "_OTHER"
            self._close(run, event, at)

    def _close(self, run: _Run, event: Event, at: int) -> None:
        """End a run's span, and first whatever is still open under it (at the same moment), the
        deepest first; no recursion: a chain of sub-runs is as deep as a stream makes it."""
        stack = [run]
        while stack:
            below = stack[-1].children
            if below:
                stack.append(below[0])  # its end takes it out of the list
            else:
                self._end_run(stack.pop(), event, at)

    def _end_run(self, run: _Run, event: Event, at: int) -> None:
        """End a run with nothing open under it: its open calls, its usage, then its span."""
        for span in run.tools.values():
            span.status = "error"
            span.status_message = "the run ended before the call did"
            span.attributes["error.type"] = "_OTHER"
            self._end(span, event, at)
        run.tools.clear()
        usage = run.step_usage
        if usage:
            run.usage[0] += sum(u.payload.input_tokens for u in usage)
            run.usage[1] += sum(u.payload.output_tokens for u in usage)
        if run.usage != [0, 0]:
            run.span.attributes["gen_ai.usage.input_tokens"] = run.usage[0]
            run.span.attributes["gen_ai.usage.output_tokens"] = run.usage[1]
        if run.parent is not None:
            run.parent.children.remove(run)
            parent = run.parent
            if at > parent.step_start[1]:
                parent.step_start = (event.ts, at)
        del self._runs[run.span.run_id]
        self._done.add(run.span.run_id)
        self._end(run.span, event, at)

    def _keep(self, span: Span) -> None:
        if self.keep:
            self._all.append(span)

    def _end(self, span: Span, event: Event, at: int) -> None:
        span.end_ts = event.ts
        span.end_ns = at if at > span.start_ns else span.start_ns
        span.end_seq = event.seq
        self._ended.append(span)


_HANDLERS: dict[type[Any], Any] = {
    ToolStart: SpanTree._tool_start, ToolEnd: SpanTree._tool_end, Usage: SpanTree._usage,
    StepBoundary: SpanTree._step, TextDelta: SpanTree._text, ChildSpawn: SpanTree._spawn,
    RunLifecycle: SpanTree._lifecycle,
}
"""What each event type does to its run's spans (the others only open or name the run)."""


def derive_spans(root_id: str, events: list[Event], *, content: bool = False) -> list[Span]:
    """Every span of a root run's stream (open ones with ``end_ts`` None)."""
    tree = SpanTree(root_id, content=content)
    for event in events:
        tree.apply(event)
    return tree.spans()
