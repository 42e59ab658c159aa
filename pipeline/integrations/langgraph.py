"""LangGraph graphs published on runwire: ``run(graph, input, publisher=...)``.

::

    from runwire.integrations import langgraph
    async with Publisher.connect("redis://localhost:6379") as pub:
        state = await langgraph.run(graph, {"messages": [("user", "hi")]}, publisher=pub)

``run`` drives ``graph.astream(input, config, stream_mode=[...], subgraphs=True, **kwargs)``
and returns what ``graph.ainvoke(input, config)`` returns (the final state). What maps to what:

* ``messages``: ``AIMessageChunk`` text (``str`` content or ``text`` blocks) → ``text.delta``;
  ``reasoning``/``thinking`` blocks and ``reasoning_content`` → ``reasoning.delta``;
  ``usage_metadata`` → ``x.usage`` (model from ``response_metadata.model_name`` or
  ``ls_model_name``) once per message; a whole ``AIMessage`` a node returns unstreamed → its
  text once (deduplicated by message id); a ``ToolMessage`` → ``tool.end`` (``status="error"``
  → ``ok: false``); other messages → ``x.langgraph.message``.
* ``updates``: a node's update with a new ``AIMessage`` ends a model step → ``step.boundary``
  (``tool-roundtrip`` when it calls tools, else ``text-only``), then ``tool.start`` per tool
  call; the rest of an update (keys that are not messages) → ``x.langgraph.update``.
* ``custom`` (``get_stream_writer()``) → ``x.langgraph.custom``.
* a subgraph namespace (``("node:<task id>", ...)``) → a child run of its parent namespace's
  run at any depth, opened when its first task starts and closed when its task ends (``tasks``
  mode). A client's cancel of such a child run stops the whole graph, as a cancel of the root
  does: the child ends ``aborted`` with the client's reason, the runs above it ``aborted``
  (``"cancelled"``), and ``run()`` raises ``CancelledError``.
* ``interrupt(value)`` with a checkpointer and a ``thread_id`` → ``awaiting_approval`` (call id =
  the ``Interrupt``'s id, tool = the node that interrupted, input = its value); the client's
  decision resumes the graph with ``Command(resume=...)``: ``answer`` → ``args.answer``,
  ``approve`` → ``True``, ``deny`` → ``False`` (``resume_value=`` changes that). Without a
  checkpointer the interrupts are carried (``x.langgraph.interrupt``) and returned under
  ``"__interrupt__"`` as ``ainvoke`` does.

A ``run()`` nested in a node or tool of a graph being published is a child run of the run of
the graph that called it; the outer run leaves that namespace to it (no doubling).

Just over ~400 lines: the five stream modes' mapping and the subgraph runs' bookkeeping share
one state (the runs open by namespace, the messages already published).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any, Literal

from runwire.integrations import require
from runwire.integrations.agentrun import AgentRun, Decision, OnPublishError, close_all, describe
from runwire.sdk.publisher import Publisher

require("langgraph")

from langchain_core.messages import (  # noqa: E402 - after require(): its one-line ImportError
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ToolMessage,
)
from langchain_core.runnables.config import var_child_runnable_config  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.pregel import Pregel  # noqa: E402
from langgraph.types import Command, Interrupt  # noqa: E402

__all__ = ["STREAM_MODES", "decision_value", "run"]

FRAMEWORK = "langgraph"
STREAM_MODES: list[Literal["messages", "updates", "custom", "values", "tasks"]] = [
    "messages", "updates", "custom", "values", "tasks"]
"""What ``run`` streams: ``values`` gives the return value, ``tasks`` when a subgraph ends."""
INTERRUPT = "__interrupt__"
Namespace = tuple[str, ...]
_ACTIVE: ContextVar[_Publishing | None] = ContextVar("runwire_langgraph_publishing", default=None)


def decision_value(decision: Decision) -> Any:
    """What ``interrupt()`` returns for a client's decision: ``answer`` → ``args.answer``,
    ``approve`` → ``True``, ``deny`` → ``False``."""
    if decision.command == "answer":
        return decision.answer
    return decision.approved


async def run(
    agent: Pregel[Any, Any, Any, Any],
    input: Any,
    *,
    publisher: Publisher,
    run_id: str | None = None,
    on_publish_error: OnPublishError = "continue",
    publish_timeout: float = 5.0,
    resume_value: Callable[[Decision], Any] = decision_value,
    tenant: str | None = None,
    thread: str | None = None,
    **kwargs: Any,
) -> Any:
    """Run the compiled graph ``agent`` on ``input`` (``config`` and other ``astream`` keywords
    in ``kwargs``), publishing it as run ``run_id``; returns what ``agent.ainvoke`` returns.
    Interrupts are decided by the run's clients when the graph can resume (module docstring);
    ``resume_value`` turns a :class:`Decision` into the value ``interrupt()`` returns."""
    outer = _ACTIVE.get()
    here = _namespace_here() if outer is not None else None
    parent: AgentRun | Literal["current"] = "current"
    if outer is not None and here is not None:
        inside = outer.relative(here)
        outer.claimed.add(inside)
        parent = await outer.run_for(inside[:-1])
    async with AgentRun(publisher, run_id, framework=FRAMEWORK, name=agent.name, parent=parent,
                        prompt=_prompt_of(input), on_publish_error=on_publish_error,
                        publish_timeout=publish_timeout, tenant=tenant,
                        thread=thread) as agent_run:
        publishing = _Publishing(agent_run, here or ())
        token = _ACTIVE.set(publishing)
        try:
            return await publishing.drive(agent, input, kwargs, resume_value)
        except BaseException as exc:
            await publishing.close(exc)
            raise
        finally:
            _ACTIVE.reset(token)


class _Publishing:
    """One ``run()``'s mapping of LangGraph's stream onto its runs (root and subgraphs)."""

    def __init__(self, root: AgentRun, base: Namespace = ()) -> None:
        self.root = root
        self.base = base
        """The namespace this graph runs in when nested in another's node: its events carry it."""
        self.children: dict[Namespace, AgentRun] = {}  # relative namespace → its child run
        self.claimed: set[Namespace] = set()
        """Namespaces a nested ``run()`` publishes itself."""
        self.values: Any = None
        self.interrupts: list[Interrupt] = []
        self.interrupt_nodes: dict[str, str] = {}
        self._runs: dict[Namespace, AgentRun] = {base: root}  # as streamed → open run (fast path)
        self._entering: dict[Namespace, asyncio.Event] = {}
        self._published: set[str | None] = set()  # ids of messages whose text/usage went out
        self._stepped: set[str] = set()  # ids of AI messages that ended a step
        self._tools: dict[str, AgentRun] = {}  # tool call id → the run it started on
        self._ended: set[str] = set()
        self._usage: dict[Namespace, list[Any]] = {}
        self._by_mode: dict[str, Callable[[Namespace, Any], Awaitable[None]]] = {
            "messages": self.on_message, "updates": self.on_update, "custom": self.on_other,
            "values": self.on_values, "tasks": self.task_event}

    # ---- driving -------------------------------------------------------------
    async def drive(self, agent: Pregel[Any, Any, Any, Any], input: Any, kwargs: dict[str, Any],
                    decide: Callable[[Decision], Any]) -> Any:
        config = kwargs.pop("config", None)
        resumable = isinstance(agent.checkpointer, BaseCheckpointSaver) and bool(
            (config or {}).get("configurable", {}).get("thread_id"))
        while True:
            await self.stream(agent.astream(input, config, stream_mode=STREAM_MODES, subgraphs=True,
                                            **kwargs))
            await self.flush_usage()
            if not self.interrupts:
                await self.close(None)
                return self.values
            interrupts, self.interrupts = self.interrupts, []
            if not resumable:
                for pending in interrupts:
                    await self.root.carry("interrupt", {"id": pending.id, "value": pending.value})
                await self.close(None)
                latest = self.values if isinstance(self.values, dict) else {}
                return {**latest, INTERRUPT: interrupts}
            decisions = await self.root.awaiting([
                {"call_id": i.id, "tool": self.interrupt_nodes.get(i.id, "interrupt"), "input": i.value}
                for i in interrupts])
            input = Command(resume={i.id: decide(decisions[i.id]) for i in interrupts})

    def relative(self, namespace: Namespace) -> Namespace:
        """``namespace`` (as LangGraph streams it) from this graph's own root."""
        if self.base and namespace[: len(self.base)] == self.base:
            return namespace[len(self.base):]
        return namespace

    async def stream(self, events: AsyncIterator[tuple[Namespace, str, Any]]) -> None:
        """Publish one ``astream``'s events. Inline fast path (most events, per token): a plain
        text chunk (``str`` content, no usage or metadata, not the last) of a run already open."""
        runs, published, handle = self._runs, self._published, self.handle
        async for namespace, mode, chunk in events:
            if mode == "messages":
                message = chunk[0]
                if type(message) is AIMessageChunk and (target := runs.get(namespace)) is not None:
                    text = message.content
                    if type(text) is str and not (message.usage_metadata or message.chunk_position
                                                  or message.response_metadata or message.additional_kwargs):
                        published.add(message.id)
                        if text and not target.delta_now("text.delta", text):
                            await target.text(text)
                        continue
            await handle(namespace, mode, chunk)

    async def handle(self, namespace: Namespace, mode: str, chunk: Any) -> None:
        namespace = self.relative(namespace)
        if self.claimed and any(namespace[: len(c)] == c for c in self.claimed):
            return
        await self._by_mode.get(mode, self.on_other)(namespace, chunk)

    async def on_values(self, namespace: Namespace, chunk: Any) -> None:
        if not namespace:
            self.values = chunk

    async def on_other(self, namespace: Namespace, chunk: Any) -> None:
        await (await self.run_for(namespace)).carry("custom", chunk)

    # ---- child runs ----------------------------------------------------------
    async def run_for(self, namespace: Namespace) -> AgentRun:
        """The run publishing ``namespace``: the root, or a child opened on its first event."""
        if not namespace:
            return self.root
        child = self.children.get(namespace)
        if child is None:
            parent = await self.run_for(namespace[:-1])
            child = self.children.get(namespace)
            if child is None:
                return await self.open(parent, namespace)
        entering = self._entering.get(namespace)
        if entering is not None:  # being opened by another task (a nested run()): wait for it
            await entering.wait()
        return child

    async def open(self, parent: AgentRun, namespace: Namespace) -> AgentRun:
        """Open the child run of a subgraph in the task that calls (the one driving the graph,
        unless a nested ``run()`` gets there first): a cancel of it cancels that task, so the
        graph stops; it does not become the current run there (``current=False``)."""
        child = parent.child(name=namespace[-1].split(":")[0], current=False)
        self.children[namespace] = child
        entered = self._entering[namespace] = asyncio.Event()
        try:
            await child.__aenter__()
        except BaseException:
            if child.run is None:
                del self.children[namespace]
            raise
        finally:
            del self._entering[namespace]
            entered.set()
        self._runs[self.base + namespace] = child
        return child

    async def task_event(self, namespace: Namespace, chunk: dict[str, Any]) -> None:
        """A task's start in a subgraph opens the subgraph's run (if not yet); a task's end
        closes the child run of its subgraph (not when it interrupted: a resume continues the
        same subgraph task)."""
        if "triggers" in chunk:
            if namespace:
                await self.run_for(namespace)
            return
        interrupted = chunk.get("interrupts") or ()
        for pending in interrupted:
            self.interrupt_nodes.setdefault(str(pending["id"]), str(chunk["name"]))
        if not interrupted:
            error = chunk.get("error")
            if error is not None and not isinstance(error, BaseException):
                error = RuntimeError(str(error))
            await self.close(error, under=(*namespace, f"{chunk['name']}:{chunk['id']}"))

    async def close(self, exc: BaseException | None, under: Namespace | None = None) -> None:
        """Close the child runs (all, or those at and below ``under``), deepest first; when all
        close on an exception, the tool calls still open end with it first."""
        if under is None and exc is not None and not isinstance(exc, asyncio.CancelledError):
            for call_id, owner in self._tools.items():
                if owner.tool_open(call_id):
                    await owner.tool_end(call_id, ok=False, error=describe(exc))
        closing = [ns for ns in self.children if under is None or ns[: len(under)] == under]
        children = []
        for namespace in sorted(closing, key=len, reverse=True):
            await self.flush_usage(namespace)
            self._runs.pop(self.base + namespace, None)
            children.append(self.children.pop(namespace))
        await close_all(children, exc)

    # ---- messages ------------------------------------------------------------
    async def on_message(self, namespace: Namespace, chunk: tuple[BaseMessage, dict[str, Any]]) -> None:
        """A ``messages`` event the fast path in :meth:`stream` leaves."""
        target = await self.run_for(namespace)
        message, metadata = chunk
        if isinstance(message, AIMessageChunk):
            await self.ai_chunk(target, namespace, message, metadata)
        elif isinstance(message, ToolMessage):
            await self.tool_result(target, message)
        elif message.id is None or message.id not in self._published:
            if message.id is not None:
                self._published.add(message.id)
            if isinstance(message, AIMessage):
                await self.ai_content(target, message)
                self.add_usage(namespace, message, metadata)
                await self.flush_usage(namespace)
            else:
                await target.carry("message", {"type": message.type, "id": message.id,
                                                "content": message.content})

    async def ai_chunk(self, target: AgentRun, namespace: Namespace, chunk: AIMessageChunk,
                       metadata: dict[str, Any]) -> None:
        if chunk.id is not None:
            self._published.add(chunk.id)
        await self.ai_content(target, chunk)
        if chunk.usage_metadata or chunk.response_metadata:
            self.add_usage(namespace, chunk, metadata)
        if chunk.chunk_position == "last":
            await self.flush_usage(namespace)

    @staticmethod
    async def ai_content(target: AgentRun, message: AIMessage | AIMessageChunk) -> None:
        reasoning = message.additional_kwargs.get("reasoning_content")
        if isinstance(reasoning, str):
            await target.reasoning(reasoning)
        if isinstance(message.content, str):
            await target.text(message.content)
            return
        for kind, text in _content_parts(message.content):
            await (target.text(text) if kind == "text" else target.reasoning(text))

    async def tool_result(self, target: AgentRun, message: ToolMessage) -> None:
        call_id = message.tool_call_id
        if call_id in self._ended:
            return
        self._ended.add(call_id)
        owner = self._tools.get(call_id, target)
        if message.status == "error":
            await owner.tool_end(call_id, ok=False, error=message.content, tool=message.name)
        else:
            await owner.tool_end(call_id, ok=True, output=message.content, tool=message.name)

    # ---- updates -------------------------------------------------------------
    async def on_update(self, namespace: Namespace, chunk: dict[str, Any]) -> None:
        target = await self.run_for(namespace)
        for node, update in chunk.items():
            if node == INTERRUPT:
                if not namespace:
                    self.interrupts.extend(update)
                continue
            for message in _messages_in(update):
                if isinstance(message, AIMessage):
                    await self.model_step(target, namespace, message)
                elif isinstance(message, ToolMessage):
                    await self.tool_result(target, message)
            rest = _without_messages(update)
            if rest is not None:
                await target.carry("update", {"node": node, "update": rest})

    async def model_step(self, target: AgentRun, namespace: Namespace, message: AIMessage) -> None:
        """A new model response in a node's update: ``step.boundary``, then its tool calls."""
        if message.id is not None:
            if message.id in self._stepped:
                return
            self._stepped.add(message.id)
        await self.flush_usage(namespace)
        await target.step("tool-roundtrip" if message.tool_calls else "text-only")
        for call in message.tool_calls:
            call_id = call.get("id")
            if call_id and call_id not in self._tools:
                self._tools[call_id] = target
                await target.tool_start(call_id, call["name"], call["args"])

    # ---- usage ---------------------------------------------------------------
    def add_usage(self, namespace: Namespace, message: AIMessage | AIMessageChunk,
                  metadata: dict[str, Any]) -> None:
        usage = message.usage_metadata
        model = message.response_metadata.get("model_name") or metadata.get("ls_model_name")
        totals = self._usage.setdefault(namespace, [0, 0, 0, None])
        if usage:
            totals[0] += usage.get("input_tokens", 0)
            totals[1] += usage.get("output_tokens", 0)
            totals[2] += usage.get("total_tokens", 0)
        totals[3] = totals[3] or model

    async def flush_usage(self, namespace: Namespace | None = None) -> None:
        """``x.usage`` of what was counted (in ``namespace``, or everywhere) since the last."""
        for ns in [namespace] if namespace is not None else list(self._usage):
            totals = self._usage.pop(ns, None)
            if totals and totals[2] + totals[0] + totals[1]:
                target = self.root if not ns else self.children[ns]
                await target.usage(totals[0], totals[1], totals[3], total_tokens=totals[2])


def _namespace_here() -> Namespace | None:
    """The namespace of the LangGraph node or tool this code runs in, if any."""
    config = var_child_runnable_config.get() or {}
    checkpoint_ns = config.get("configurable", {}).get("checkpoint_ns")
    return tuple(checkpoint_ns.split("|")) if checkpoint_ns else None


def _content_parts(content: list[Any]) -> Iterable[tuple[str, str]]:
    """``("text" | "reasoning", text)`` of a message's content blocks, in order."""
    for block in content:
        if isinstance(block, str):
            yield "text", block
        elif isinstance(block, dict):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                yield "text", block["text"]
            elif kind in ("reasoning", "thinking") and isinstance(block.get(kind), str):
                yield "reasoning", block[kind]


def _messages_in(update: Any) -> Iterable[BaseMessage]:
    """The messages a node's update carries (top-level values, single or in a list)."""
    if not isinstance(update, dict):
        return
    for value in update.values():
        if isinstance(value, BaseMessage):
            yield value
        elif isinstance(value, list | tuple):
            yield from (item for item in value if isinstance(item, BaseMessage))


def _is_messages(value: Any) -> bool:
    return isinstance(value, BaseMessage) or (
        isinstance(value, list | tuple) and bool(value)
        and all(isinstance(item, BaseMessage) for item in value))


def _without_messages(update: Any) -> Any:
    """A node's update without its messages (published as such); None when nothing is left."""
    if isinstance(update, dict):
        rest = {key: value for key, value in update.items() if not _is_messages(value)}
        return rest or None
    return update


def _prompt_of(input: Any) -> str | None:
    """The text a run starts from: a string input, or the last message of ``{"messages"}``."""
    if isinstance(input, str):
        return input
    messages = input.get("messages") if isinstance(input, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, BaseMessage):
        return str(last.text)
    if isinstance(last, tuple) and len(last) == 2 and isinstance(last[1], str):
        return last[1]
    return last if isinstance(last, str) else None
