"""Pydantic AI agents publish their runs: every event of ``agent.run`` onto a runwire run.

What maps to what (``docs/integrations.md`` has the table):

* ``PartStartEvent``/``PartDeltaEvent`` of text → ``text.delta``, of thinking → ``reasoning.delta``
  (the part's first content, then each delta: their concatenation is the output text);
* ``FunctionToolCallEvent`` → ``tool.start``; ``FunctionToolResultEvent`` → ``tool.end`` (``ok``
  only for the outcome ``success``; a retry, failure or denial is ``ok: false`` with the content
  the model sees); a tool that raises → ``tool.end`` ``ok: false`` with the exception, before the
  run ends ``error``; a native (provider-side) tool call and return → ``tool.start``/``tool.end``;
* each model response → ``x.usage`` (its tokens, its model) and ``step.boundary``
  (``tool-roundtrip`` when it calls function tools, else ``text-only``);
* a tool needing approval → ``awaiting_approval``, the clients' decisions answering it inline
  (the framework's own ``handle_deferred_tool_calls`` hook), and the run goes on;
* any other event (``FinalResultEvent``, output tool calls, custom events …) → ``x.pydantic_ai.<event_kind>``;
* another agent run through :func:`run` inside a tool → a child run.

Use::

    from runwire.integrations import pydantic_ai
    result = await pydantic_ai.run(agent, "What is the weather?", publisher=pub)
    print(result.output)      # what `await agent.run(...)` returns

The same mapping as a capability for code that calls ``agent.run`` itself, around a run it opened:
``agent.run(prompt, capabilities=[Publishing(run)])``, or, events only, as an event stream handler:
``agent.run(prompt, event_stream_handler=handler(run))``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ..sdk.publisher import Publisher
from . import require
from .agentrun import AgentRun, Decision, OnPublishError, describe

require("pydantic_ai")  # the one-line ImportError naming the extra when pydantic-ai is missing

from pydantic_ai.agent import AbstractAgent  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability, AgentCapability  # noqa: E402
from pydantic_ai.exceptions import (  # noqa: E402
    ApprovalRequired,
    CallDeferred,
    SkipToolExecution,
    ToolFailedError,
    ToolRetryError,
)
from pydantic_ai.messages import (  # noqa: E402
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
)
from pydantic_ai.run import AgentRunResult  # noqa: E402
from pydantic_ai.tools import (  # noqa: E402
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)

__all__ = ["FRAMEWORK", "Publishing", "handler", "run"]

FRAMEWORK = "pydantic_ai"
_SIGNALS = (ToolRetryError, ToolFailedError, ApprovalRequired, CallDeferred, SkipToolExecution)
"""What a tool raises to steer the run, not to fail it: its result event follows (or it waits)."""

EventStreamHandler = Callable[[RunContext[Any], AsyncIterable[AgentStreamEvent]], Awaitable[None]]


async def run(
    agent: AbstractAgent[Any, Any],
    input: Any = None,
    *,
    publisher: Publisher,
    run_id: str | None = None,
    on_publish_error: OnPublishError = "continue",
    publish_timeout: float = 5.0,
    **kwargs: Any,
) -> AgentRunResult[Any]:
    """Run ``agent`` on ``input`` (its user prompt) with ``kwargs`` (``deps``, ``message_history``,
    ``output_type`` …), publishing the run as it streams; return what ``await agent.run(...)``
    returns. Inside another published run (a tool of an agent run this way) this is its child.

    Tools that need approval wait for a client's ``approve``/``deny`` and the run goes on with
    the decisions; a client's ``cancel`` raises :class:`asyncio.CancelledError` here."""
    prompt = input if isinstance(input, str) else None
    if kwargs.pop("infer_name", True):
        _infer_name(agent, inspect.currentframe())
    async with AgentRun(publisher, run_id, framework=FRAMEWORK, name=agent.name, prompt=prompt,
                        on_publish_error=on_publish_error, publish_timeout=publish_timeout) as published:
        given: Sequence[AgentCapability[Any]] = kwargs.pop("capabilities", None) or ()
        capabilities: list[AgentCapability[Any]] = [*given, Publishing(published)]
        return await agent.run(input, capabilities=capabilities, infer_name=False, **kwargs)


def _infer_name(agent: AbstractAgent[Any, Any], frame: FrameType | None) -> None:
    """Name an unnamed agent as ``agent.run`` does: by its variable in the caller's scope."""
    caller = frame.f_back if frame is not None else None
    if agent.name is not None or caller is None:
        return
    for scope in (caller.f_locals, caller.f_globals):
        agent.name = next((name for name, item in scope.items() if item is agent), None)
        if agent.name is not None:
            return


def handler(published: AgentRun) -> EventStreamHandler:
    """An ``event_stream_handler`` for ``agent.run`` publishing the run's events (text, reasoning,
    tool calls, carried events) onto ``published``, a run the caller opened. :class:`Publishing`
    also publishes usage, steps, a raising tool's error and approvals."""
    mapper = _EventMapper(published)

    async def publish_events(_ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        mapper.new_response()  # called once per node: a model response's parts, or tool calls
        async for event in events:
            await mapper.event(event)

    return publish_events


@dataclass
class Publishing(AbstractCapability[Any]):
    """A capability publishing an agent's run onto ``published`` (an open :class:`AgentRun`):
    ``agent.run(prompt, capabilities=[Publishing(published)])``. With it the run streams."""

    published: AgentRun
    _mapper: _EventMapper = field(init=False, repr=False)
    _deciding: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    """One wait for decisions at a time (calls deferred one by one, in parallel, wait in turn)."""

    def __post_init__(self) -> None:
        self._mapper = _EventMapper(self.published)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # not part of an agent spec: it holds a live run

    async def on_event(self, ctx: RunContext[Any], *, event: AgentStreamEvent) -> None:
        await self._mapper.event(event)

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any,
                                  response: ModelResponse) -> ModelResponse:
        self._mapper.new_response()
        usage = response.usage
        await self.published.usage(usage.input_tokens, usage.output_tokens, response.model_name)
        calls_tools = any(isinstance(part, ToolCallPart) for part in response.parts)
        await self.published.step("tool-roundtrip" if calls_tools else "text-only")
        return response

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: Any,
                                args: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            return await handler(args)
        except _SIGNALS:
            raise
        except Exception as exc:  # the run ends with it: the call's failure is published first
            await self._mapper.tool_failed(call, exc)
            raise

    async def handle_deferred_tool_calls(self, ctx: RunContext[Any], *,
                                         requests: DeferredToolRequests) -> DeferredToolResults | None:
        """Tools that need approval: the clients decide (``awaiting_approval``); calls to run
        elsewhere (``CallDeferred``) are left to the caller, as the run's output."""
        if not requests.approvals:
            return None
        async with self._deciding:
            decisions = await self.published.awaiting([
                {"call_id": call.tool_call_id, "tool": call.tool_name, "input": call.args_as_dict()}
                for call in requests.approvals])
        return DeferredToolResults(approvals={call_id: _approval(decision)
                                              for call_id, decision in decisions.items()})


def _approval(decision: Decision) -> bool | ToolApproved | ToolDenied:
    """``approve`` → run the call; ``answer`` with an object → run it with those arguments;
    ``deny`` → the model is told so (the client's reason, if given)."""
    if not decision.approved:
        return ToolDenied(decision.reason or "The call was denied by a client.")
    if decision.command == "answer" and isinstance(decision.answer, dict):
        return ToolApproved(override_args=decision.answer)
    return True


class _EventMapper:
    """Pydantic AI's stream events onto one :class:`AgentRun` (the module docstring's mapping)."""

    def __init__(self, published: AgentRun) -> None:
        self.published = published
        self._failed: set[str] = set()
        """Calls whose failure the tool's exception published (its call event may come later)."""
        self._streamed: dict[int, tuple[str, str]] = {}
        """Each text or thinking part of the current response, by index: its kind, what was sent."""

    def new_response(self) -> None:
        """The next model response: its parts are numbered from 0 again."""
        self._streamed.clear()

    async def event(self, event: AgentStreamEvent) -> None:
        if isinstance(event, PartStartEvent):
            await self._part(event.index, event.part)
        elif isinstance(event, PartDeltaEvent):
            await self._delta(event.index, event.delta)
        elif isinstance(event, PartEndEvent):
            if isinstance(event.part, NativeToolCallPart):
                await self._native_call(event.part)
        elif isinstance(event, FunctionToolCallEvent):
            await self._call(event.part)
        elif isinstance(event, FunctionToolResultEvent):
            await self._result(event)
        else:
            await self.published.carry(event.event_kind, event)

    async def _part(self, index: int, part: Any) -> None:
        if isinstance(part, TextPart | ThinkingPart):
            await self._content(index, part.part_kind, part.content, whole=True)
        elif isinstance(part, NativeToolReturnPart):
            await self.published.tool_end(part.tool_call_id, ok=part.outcome == "success",
                                          output=part.content, error=part.content,
                                          tool=part.tool_name)
        elif not isinstance(part, ToolCallPart | NativeToolCallPart):  # calls: at their call event
            await self.published.carry("part", part)

    async def _delta(self, index: int, delta: Any) -> None:
        if isinstance(delta, TextPartDelta | ThinkingPartDelta):
            await self._content(index, delta.part_delta_kind, delta.content_delta or "", whole=False)
        elif not isinstance(delta, ToolCallPartDelta):  # a call's arguments: whole at tool.start
            await self.published.carry("delta", delta)

    async def _content(self, index: int, kind: str, text: str, *, whole: bool) -> None:
        """Text or thinking of part ``index``: a delta, or (``whole``) the part's content, of a new
        part or one the framework replaced. Of a replacement only what extends the text sent is
        new; one that rewrites it is carried (``x.pydantic_ai.part_replaced``), not sent twice."""
        sent_kind, sent = self._streamed.get(index, (kind, ""))
        if whole and (sent_kind != kind or not text.startswith(sent)):
            self._streamed[index] = (kind, text)
            await self.published.carry("part_replaced", {"index": index, "kind": kind, "content": text})
            return
        new = text[len(sent):] if whole else text
        self._streamed[index] = (kind, sent + new)
        await (self.published.text(new) if kind == "text" else self.published.reasoning(new))

    async def _call(self, call: ToolCallPart) -> None:
        if call.tool_call_id not in self._failed:
            await self.published.tool_start(call.tool_call_id, call.tool_name, call.args_as_dict())

    async def _native_call(self, call: NativeToolCallPart) -> None:
        await self.published.tool_start(call.tool_call_id, call.tool_name, call.args_as_dict())

    async def _result(self, event: FunctionToolResultEvent) -> None:
        part = event.part
        if not self.published.tool_open(part.tool_call_id):
            return  # a raising tool's failure, already published
        ok = part.outcome == "success"
        await self.published.tool_end(part.tool_call_id, ok=ok, output=part.content if ok else None,
                                      error=None if ok else part.model_response_str(wrap_if_error=False))
        if event.content is not None:
            await self.published.carry("tool_user_content", event.content)

    async def tool_failed(self, call: ToolCallPart, exc: BaseException) -> None:
        self._failed.add(call.tool_call_id)
        await self.published.tool_start(call.tool_call_id, call.tool_name, call.args_as_dict())
        await self.published.tool_end(call.tool_call_id, ok=False, error=describe(exc))
