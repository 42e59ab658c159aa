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

The events are read by the run's ``event_stream_handler`` (the framework's one consumer of its
stream; a handler of the caller's own gets the same events passed on); the capability
:class:`Publishing` adds what only its hooks see (usage, steps, a raising tool, approvals).

Use::

    from runwire.integrations import pydantic_ai
    result = await pydantic_ai.run(agent, "What is the weather?", publisher=pub)
    print(result.output)      # what `await agent.run(...)` returns

For code that calls ``agent.run`` itself, around a run it opened: ``publishing = Publishing(run)``,
then ``agent.run(prompt, capabilities=[publishing], event_stream_handler=publishing.handler())``;
events only: ``agent.run(prompt, event_stream_handler=handler(run))``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Sequence,
)
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, cast

from ..core.errors import BusUnavailable, DeliveryTimeout, ProtocolError
from ..core.events import TextPayload
from ..sdk.publisher import Publisher
from . import require
from .agentrun import DELTA_CHARS, AgentRun, Decision, OnPublishError, describe

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
_DELTA_EVENTS: dict[type, str] = {TextPart: "text.delta", ThinkingPart: "reasoning.delta",
                                  TextPartDelta: "text.delta", ThinkingPartDelta: "reasoning.delta"}
"""The runwire event of a text or thinking part's content, by the type of the part or delta."""

EventStreamHandler = Callable[[RunContext[Any], AsyncIterable[AgentStreamEvent]], Awaitable[None]]
_Route = Callable[[Any], Awaitable[None]]


async def run(
    agent: AbstractAgent[Any, Any],
    input: Any = None,
    *,
    publisher: Publisher,
    run_id: str | None = None,
    on_publish_error: OnPublishError = "continue",
    publish_timeout: float = 5.0,
    tenant: str | None = None,
    thread: str | None = None,
    **kwargs: Any,
) -> AgentRunResult[Any]:
    """Run ``agent`` on ``input`` (its user prompt) with ``kwargs`` (``deps``, ``message_history``,
    ``output_type``, ``event_stream_handler`` …), publishing the run as it streams; return what
    ``await agent.run(...)`` returns. Inside another published run (a tool of an agent run this
    way) this is its child.

    Your ``event_stream_handler`` (or the agent's) gets every event, after it is published. Tools
    that need approval wait for a client's ``approve``/``deny`` and the run goes on with the
    decisions; a client's ``cancel`` raises :class:`asyncio.CancelledError` here."""
    prompt = input if isinstance(input, str) else None
    if kwargs.pop("infer_name", True):
        _infer_name(agent, inspect.currentframe())
    async with AgentRun(publisher, run_id, framework=FRAMEWORK, name=agent.name, prompt=prompt,
                        on_publish_error=on_publish_error, publish_timeout=publish_timeout,
                        tenant=tenant, thread=thread) as published:
        publishing = Publishing(published)
        given: Sequence[AgentCapability[Any]] = kwargs.pop("capabilities", None) or ()
        then = kwargs.pop("event_stream_handler", None) or agent.event_stream_handler
        return await agent.run(input, capabilities=[*given, publishing], infer_name=False,
                               event_stream_handler=publishing.handler(then), **kwargs)


def _infer_name(agent: AbstractAgent[Any, Any], frame: FrameType | None) -> None:
    """Name an unnamed agent as ``agent.run`` does: by its variable in the caller's scope."""
    caller = frame.f_back if frame is not None else None
    if agent.name is not None or caller is None:
        return
    for scope in (caller.f_locals, caller.f_globals):
        agent.name = next((name for name, item in scope.items() if item is agent), None)
        if agent.name is not None:
            return


def handler(published: AgentRun, then: EventStreamHandler | None = None) -> EventStreamHandler:
    """An ``event_stream_handler`` for ``agent.run`` publishing the run's events (text, reasoning,
    tool calls, carried events) onto ``published``, a run the caller opened, and passing them on
    to ``then`` if given. :class:`Publishing` also publishes usage, steps, a raising tool's error
    and approvals."""
    return _EventMapper(published).handler(then)


@dataclass
class Publishing(AbstractCapability[Any]):
    """A capability publishing an agent's run onto ``published`` (an open :class:`AgentRun`), with
    its event stream handler: ``publishing = Publishing(published)``, then
    ``agent.run(prompt, capabilities=[publishing], event_stream_handler=publishing.handler())``.

    The capability publishes usage, steps, a raising tool's error and approvals; the handler, the
    events (without it, the run's text and tool calls are not published)."""

    published: AgentRun
    _mapper: _EventMapper = field(init=False, repr=False)
    _deciding: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    """One wait for decisions at a time (calls deferred one by one, in parallel, wait in turn)."""

    def __post_init__(self) -> None:
        self._mapper = _EventMapper(self.published)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # not part of an agent spec: it holds a live run

    def handler(self, then: EventStreamHandler | None = None) -> EventStreamHandler:
        """The ``event_stream_handler`` publishing this run's events, passing them on to ``then``."""
        return self._mapper.handler(then)

    def wrap_run_event_stream(self, ctx: RunContext[Any], *,
                              stream: AsyncIterable[AgentStreamEvent]) -> AsyncIterable[AgentStreamEvent]:
        """The stream as it is: the default wraps it in a generator passing each event on, a layer
        more for every event of the run (the events are read by :meth:`handler`)."""
        return stream

    def listens_to(self, event: AgentStreamEvent) -> bool:
        """No ``on_event`` here (events go through :meth:`handler`): say so without the default's
        per-event look-up of ``@on_event`` methods."""
        return False

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any,
                                  response: ModelResponse) -> ModelResponse:
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


def _delta_event(item: Any) -> str | None:
    """The runwire event of a subclass of a text or thinking part or delta, else ``None``."""
    if isinstance(item, TextPart | TextPartDelta):
        return "text.delta"
    if isinstance(item, ThinkingPart | ThinkingPartDelta):
        return "reasoning.delta"
    return None


def _no_room(_type: str, _text: str) -> bool:
    """No run open: no delta without a coroutine."""
    return False


class _EventMapper:
    """Pydantic AI's stream events onto one :class:`AgentRun` (the module docstring's mapping).

    Each event goes to its route by its type (a dict lookup, no chain of ``isinstance``); a
    subclass finds its base's route once, then has its own."""

    def __init__(self, published: AgentRun) -> None:
        self.published = published
        self._failed: set[str] = set()
        """Calls whose failure the tool's exception published (its call event may come later)."""
        self._sent: dict[int, tuple[str, list[str]]] = {}
        """Each text or thinking part of the current response, by index: the event type its content
        is published as, the chunks sent (joined only when the framework replaces the part)."""
        self._nowait: Callable[[str, str], bool] = _no_room
        """The run's ``delta_nowait``, bound when the handler is called (the run is open then)."""
        self._routes: dict[type, _Route] = {
            PartDeltaEvent: self._delta, PartStartEvent: self._part_start,
            PartEndEvent: self._part_end, FunctionToolCallEvent: self._call,
            FunctionToolResultEvent: self._result}

    def handler(self, then: EventStreamHandler | None = None) -> EventStreamHandler:
        """An ``event_stream_handler`` publishing each event, then passing it on to ``then``: the
        framework's stream has one consumer; what ``then`` leaves unread is published too."""

        async def publish_events(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
            self._sent.clear()  # called once per node: a model response's parts, or tool calls
            run = self.published.run
            self._nowait = run.delta_nowait if run is not None else _no_room
            source = aiter(events)
            if then is not None:
                forwarded = self._passed_on(source)
                try:
                    await then(ctx, forwarded)
                finally:
                    await forwarded.aclose()
            routes, delta_now = self._routes, self._delta_now
            async for event in source:
                if type(event) is not PartDeltaEvent or not delta_now(event):
                    await (routes.get(type(event)) or self._route(event))(event)

        return publish_events

    async def _passed_on(self, source: AsyncIterator[AgentStreamEvent]) -> AsyncGenerator[AgentStreamEvent]:
        """``source``'s events, each published before the handler passed them sees it."""
        routes, delta_now = self._routes, self._delta_now
        async for event in source:
            if type(event) is not PartDeltaEvent or not delta_now(event):
                await (routes.get(type(event)) or self._route(event))(event)
            yield event

    def _delta_now(self, event: PartDeltaEvent) -> bool:
        """A text or thinking delta published without a coroutine (every token's path) when the
        publisher has room; False for anything else (then :meth:`_delta` takes it). The run's
        ``delta_nowait`` is called directly, :meth:`AgentRun.delta_now`'s checks inline: a layer
        less per token (between two, the framework's work leaves every object cold in cache)."""
        delta = event.delta
        published_as = _DELTA_EVENTS.get(type(delta))
        if published_as is None:
            return False
        text = delta.content_delta  # type: ignore[union-attr]  # a text or thinking delta's
        if not text or len(text) > DELTA_CHARS:
            return False
        sent = self._sent.get(event.index)
        if sent is None or sent[0] != published_as or self.published.degraded:
            return False
        try:
            if not self._nowait(published_as, text):
                return False
        except (DeliveryTimeout, BusUnavailable, ProtocolError) as exc:
            self.published.delta_failed(published_as, exc)
            return True
        sent[1].append(text)
        return True

    def _route(self, event: AgentStreamEvent) -> _Route:
        """The route of an event type not seen yet: its nearest base's, else carried."""
        kind = type(event)
        route = next((self._routes[base] for base in kind.__mro__ if base in self._routes), self._carry)
        self._routes[kind] = route
        return route

    async def _carry(self, event: AgentStreamEvent) -> None:
        await self.published.carry(event.event_kind, event)

    async def _delta(self, event: PartDeltaEvent) -> None:
        delta = event.delta
        published_as = _DELTA_EVENTS.get(type(delta)) or _delta_event(delta)
        if published_as is None:
            if not isinstance(delta, ToolCallPartDelta):  # a call's arguments: whole at tool.start
                await self.published.carry("delta", delta)
            return
        text = cast("TextPartDelta | ThinkingPartDelta", delta).content_delta
        if text:  # a thinking delta may carry only a signature
            sent = self._sent.get(event.index)
            if sent is None or sent[0] != published_as:
                self._sent[event.index] = (published_as, [text])
            else:
                sent[1].append(text)
            await self.published.emit(published_as, TextPayload(text=text))

    async def _part_start(self, event: PartStartEvent) -> None:
        part = event.part
        published_as = _DELTA_EVENTS.get(type(part)) or _delta_event(part)
        if published_as is not None:
            await self._content(event.index, published_as, cast("TextPart | ThinkingPart", part).content)
        elif isinstance(part, NativeToolReturnPart):
            await self.published.tool_end(part.tool_call_id, ok=part.outcome == "success",
                                          output=part.content, error=part.content,
                                          tool=part.tool_name)
        elif not isinstance(part, ToolCallPart | NativeToolCallPart):  # calls: at their call event
            await self.published.carry("part", part)

    async def _content(self, index: int, published_as: str, text: str) -> None:
        """The whole content of part ``index``, of a new part or one the framework replaced. Of a
        replacement only what extends the text sent is new; one that rewrites it is carried
        (``x.pydantic_ai.part_replaced``), not sent twice."""
        sent = self._sent.get(index)
        new = text
        if sent is not None:
            sent_text = "".join(sent[1])
            if sent[0] != published_as or not text.startswith(sent_text):
                self._sent[index] = (published_as, [text])
                kind = "text" if published_as == "text.delta" else "thinking"
                await self.published.carry("part_replaced", {"index": index, "kind": kind, "content": text})
                return
            new = text[len(sent_text):]
        self._sent[index] = (published_as, [text])
        if new:
            await self.published.emit(published_as, TextPayload(text=new))

    async def _part_end(self, event: PartEndEvent) -> None:
        if isinstance(event.part, NativeToolCallPart):  # text and calls: sent already, or at their call event
            call = event.part
            await self.published.tool_start(call.tool_call_id, call.tool_name, call.args_as_dict())

    async def _call(self, event: FunctionToolCallEvent) -> None:
        call = event.part
        if call.tool_call_id not in self._failed:
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
