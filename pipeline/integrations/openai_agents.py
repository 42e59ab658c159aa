"""OpenAI Agents SDK runs publish their events: ``Runner.run_streamed`` onto a runwire run.

What maps to what (``docs/integrations.md`` has the table):

* raw ``response.output_text.delta`` → ``text.delta``; ``response.reasoning_text.delta`` and
  ``response.reasoning_summary_text.delta`` → ``reasoning.delta``; ``response.completed`` →
  ``x.usage`` (its tokens, its model) and ``step.boundary`` (``tool-roundtrip`` when the response
  calls a tool or a handoff, else ``text-only``); refusal deltas, ``response.failed`` and
  ``response.incomplete`` → ``x.openai_agents.<kind>``;
* ``tool_called`` → ``tool.start``; ``tool_output`` → ``tool.end``, ``ok: false`` with the
  exception when the tool raised (the SDK hands the model a friendly string: the exception is
  seen through ``RunConfig.tool_error_formatter``) or when a client denied it; a hosted tool's
  call (web or file search, code interpreter, hosted MCP) → both at once;
* ``handoff_requested``/``handoff_occured`` → a ``tool.start``/``tool.end`` pair; the agent that
  takes over (``AgentUpdatedStreamEvent``) → a child run of the run that handed off, for the rest;
* a tool needing approval (``result.interruptions``) → ``awaiting_approval``; the clients'
  decisions go to ``RunState.approve``/``reject`` and the run resumes, in the same runwire run;
* any other item (MCP approvals and tool lists, tool search) → ``x.openai_agents.<event name>``;
* another agent run through :func:`run` inside a tool, or an agent made a tool with
  :func:`as_tool` (``Agent.as_tool``, its inner run streamed) → a child run, at any depth.

Use::

    from runwire.integrations import openai_agents
    result = await openai_agents.run(agent, "What is the weather?", publisher=pub)
    print(result.final_output)   # the completed RunResultStreaming: what Runner.run's RunResult has

For code that calls ``Runner.run_streamed`` itself inside an :class:`AgentRun` it opened:
``async for event in openai_agents.events(run, result): ...`` publishes each event as it passes.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Literal, cast

from ..sdk.publisher import Publisher
from . import require
from .agentrun import AgentRun, OnPublishError, describe

require("openai_agents")  # the one-line ImportError naming the extra when openai-agents is missing

from agents import Agent, FunctionTool, RunConfig, Runner  # noqa: E402
from agents.agent import AgentToolStreamEvent  # noqa: E402
from agents.items import ToolApprovalItem  # noqa: E402
from agents.result import RunResultStreaming  # noqa: E402
from agents.run_config import ToolErrorFormatter, ToolErrorFormatterArgs  # noqa: E402
from agents.run_context import RunContextWrapper  # noqa: E402
from agents.run_state import RunState  # noqa: E402
from agents.stream_events import (  # noqa: E402
    AgentUpdatedStreamEvent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
    StreamEvent,
)
from agents.tool import ToolErrorFunction, default_tool_error_function  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["as_tool", "events", "run"]

FRAMEWORK = "openai_agents"
Approvals = Literal["clients", "return"]
_REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
_CARRIED_RAW = frozenset({"response.refusal.delta", "response.failed", "response.incomplete"})
_RAW_DELTAS = {"response.output_text.delta": "text.delta", **dict.fromkeys(_REASONING, "reasoning.delta")}
_RAW_PUBLISHED = _CARRIED_RAW | {"response.completed", *_RAW_DELTAS}
"""Raw events :meth:`_Published.publish` publishes something of (the others pass over)."""
_HOSTED = frozenset({"web_search_call", "file_search_call", "code_interpreter_call",
                     "image_generation_call", "mcp_call"})
"""Tool calls the provider runs itself: their item holds the outcome, no ``tool_output`` follows."""
_SILENT_ITEMS = frozenset({"message_output_created", "reasoning_item_created"})
"""Items whose text was published as its deltas already (publishing it again would double it)."""
_PUBLISHED: ContextVar[_Published | None] = ContextVar("runwire_openai_agents", default=None)
_AGENT_TOOL: ContextVar[_Published | None] = ContextVar("runwire_openai_agents_tool", default=None)


class _Published:
    """One framework run being published: its run, the runs agents handed off to, and the calls
    that failed (shared by every run published under the same root: call ids are unique)."""

    def __init__(self, run: AgentRun, agent: Agent[Any], failures: dict[str, str] | None = None):
        self.runs = [run]
        self.agent = agent
        self.failures: dict[str, str] = {} if failures is None else failures
        self.failed: BaseException | None = None
        """The exception of an :func:`as_tool` run the SDK turned into its failure message."""

    @property
    def active(self) -> AgentRun:
        """The run of the agent running now (the last handoff's)."""
        return self.runs[-1]

    def publish_now(self, event: StreamEvent) -> bool:
        """A raw text or reasoning delta published without a coroutine (every token's path), or
        a raw event published as nothing passed over; False for anything else, or a delta the
        publisher has no room for now (then await :meth:`publish`)."""
        if type(event) is not RawResponsesStreamEvent:
            return False
        data: Any = event.data
        kind = getattr(data, "type", "")
        published_as = _RAW_DELTAS.get(kind) if type(kind) is str else None
        if published_as is None:
            return type(kind) is str and kind not in _RAW_PUBLISHED
        return self.runs[-1].delta_now(published_as, data.delta)

    async def publish(self, event: StreamEvent) -> None:
        """Publish one event of ``result.stream_events()``."""
        if isinstance(event, RawResponsesStreamEvent):
            await self._raw(event.data)
        elif isinstance(event, RunItemStreamEvent):
            await self._item(event.name, event.item)
        elif isinstance(event, AgentUpdatedStreamEvent):
            await self._agent(event.new_agent)

    async def close_handoffs(self, exc: BaseException | None) -> None:
        """End the runs agents handed off to, innermost first, as the run itself ends."""
        while len(self.runs) > 1:
            await _end(self.runs.pop(), exc)

    async def _raw(self, data: Any) -> None:
        kind = str(getattr(data, "type", ""))
        if kind == "response.output_text.delta":
            if not self.active.delta_now("text.delta", data.delta):
                await self.active.text(data.delta)
        elif kind in _REASONING:
            if not self.active.delta_now("reasoning.delta", data.delta):
                await self.active.reasoning(data.delta)
        elif kind == "response.completed":
            await self._completed(data.response)
        elif kind in _CARRIED_RAW:
            await self.active.carry(kind.removeprefix("response.").replace(".", "_"), data)

    async def _completed(self, response: Any) -> None:
        usage = getattr(response, "usage", None)
        if usage is not None:
            await self.active.usage(usage.input_tokens, usage.output_tokens,
                                    getattr(response, "model", None), usage.total_tokens)
        calls = any(str(_field(item, "type")).endswith("_call") for item in response.output or ())
        await self.active.step("tool-roundtrip" if calls else "text-only")

    async def _item(self, name: str, item: Any) -> None:
        if name in ("tool_called", "handoff_requested"):
            await self._call(item.raw_item, getattr(item, "tool_name", None))
        elif name in ("tool_output", "handoff_occured"):
            output = item.output if name == "tool_output" else _field(item.raw_item, "output")
            await self._output(_call_id(item.raw_item), output)
        elif name not in _SILENT_ITEMS:
            await self.active.carry(name, item.raw_item)

    async def _call(self, raw: Any, tool_name: str | None) -> None:
        call_id, kind = _call_id(raw), str(_field(raw, "type"))
        tool = tool_name or _field(raw, "name") or kind
        await self.active.tool_start(call_id, tool, _arguments(raw))
        if kind in _HOSTED:
            error = _field(raw, "error")
            ok = _field(raw, "status") != "failed" and not error
            output = _field(raw, "output") or _field(raw, "results") or _field(raw, "status")
            await self.active.tool_end(call_id, ok=ok, output=output, error=error)

    async def _output(self, call_id: str, output: Any) -> None:
        owner = next((run for run in reversed(self.runs) if run.tool_open(call_id)), self.active)
        failure = self.failures.pop(call_id, None)
        await owner.tool_end(call_id, ok=failure is None, output=output, error=failure)

    async def _agent(self, agent: Agent[Any]) -> None:
        if agent is self.agent:
            return
        self.agent = agent
        handed = self.active.child(name=agent.name)
        await handed.__aenter__()
        self.runs.append(handed)


def _field(raw: Any, name: str) -> Any:
    """A field of a raw SDK item (a pydantic model or a dict)."""
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _call_id(raw: Any) -> str:
    return str(_field(raw, "call_id") or _field(raw, "id") or "")


def _arguments(raw: Any) -> Any:
    """A call's arguments as JSON (the model's JSON text parsed); a hosted call: its item."""
    arguments = _field(raw, "arguments")
    if arguments is None:
        return _field(raw, "action") or _field(raw, "queries") or _field(raw, "code")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments else {}
        except ValueError:
            return arguments
    return arguments


async def _end(run: AgentRun, exc: BaseException | None) -> None:
    await run.__aexit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)


def _recording(run_config: RunConfig | dict[str, Any] | None, failures: dict[str, str]) -> RunConfig:
    """``run_config`` whose ``tool_error_formatter`` also notes each failed call (the user's own
    formatter, if any, still formats the message)."""
    config = run_config if isinstance(run_config, RunConfig) else RunConfig(**(run_config or {}))
    own: ToolErrorFormatter | None = config.tool_error_formatter

    async def formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
        failures.setdefault(args.call_id, describe(args.error) if args.error is not None
                            else f"{args.kind}: {args.default_message}")
        if own is None:
            return None
        message = own(args)
        return await message if inspect.isawaitable(message) else message

    return dataclasses.replace(config, tool_error_formatter=formatter)


async def _consume(published: _Published, result: RunResultStreaming) -> None:
    """Publish every event of one streamed segment; stop the framework if publishing stops."""
    stream = cast(AsyncGenerator[StreamEvent, None], result.stream_events())
    try:
        publish_now = published.publish_now
        async for event in stream:
            if not publish_now(event):
                await published.publish(event)
    except BaseException:
        result.cancel()  # a cancel (or a failure) met while publishing: the run loop stops too
        raise
    finally:
        await stream.aclose()


async def _decide(published: _Published, state: RunState[Any], pending: list[ToolApprovalItem]) -> None:
    """Ask the clients about each pending call and record their decisions on ``state``."""
    calls = [{"call_id": _call_id(item.raw_item), "tool": item.tool_name,
              "input": _arguments(item.raw_item)} for item in pending]
    decisions = await published.active.awaiting(calls)
    for item, call in zip(pending, calls, strict=True):
        decision = decisions[call["call_id"]]
        if decision.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=decision.reason)
            published.failures[call["call_id"]] = decision.reason or "denied by a client"


async def run(
    agent: Agent[Any],
    input: Any,
    *,
    publisher: Publisher,
    run_id: str | None = None,
    on_publish_error: OnPublishError = "continue",
    publish_timeout: float = 5.0,
    approvals: Approvals = "clients",
    tenant: str | None = None,
    thread: str | None = None,
    **kwargs: Any,
) -> RunResultStreaming:
    """``Runner.run_streamed(agent, input, **kwargs)`` with every event published onto a run.

    Returns the completed :class:`~agents.result.RunResultStreaming` — a ``RunResultBase`` like
    the ``RunResult`` of ``Runner.run``, with the same ``final_output``, ``new_items``,
    ``raw_responses``, ``last_agent``, ``interruptions`` and ``to_state()``. A tool needing
    approval waits for the clients' ``approve``/``deny`` (``approvals="clients"``) and the run
    resumes; ``approvals="return"`` returns the result with its ``interruptions``, as
    ``Runner.run`` does. Raises what ``Runner.run`` raises; ``CancelledError`` on a client's
    cancel. Inside a tool of another :func:`run`, the run is a child of the calling agent's run.
    """
    parent = _PUBLISHED.get()
    failures: dict[str, str] = parent.failures if parent is not None else {}
    kwargs["run_config"] = _recording(kwargs.get("run_config"), failures)
    async with AgentRun(publisher, run_id, framework=FRAMEWORK, name=agent.name,
                        parent=parent.active if parent is not None else "current",
                        prompt=input if isinstance(input, str) else None,
                        on_publish_error=on_publish_error, publish_timeout=publish_timeout,
                        tenant=tenant, thread=thread) as opened:
        published = _Published(opened, agent, failures)
        token = _PUBLISHED.set(published)
        try:
            result = await _segments(published, agent, input, approvals, kwargs)
        except BaseException as exc:
            await published.close_handoffs(exc)
            raise
        finally:
            _PUBLISHED.reset(token)
        await published.close_handoffs(None)
        return result


async def _segments(published: _Published, agent: Agent[Any], input: Any, approvals: Approvals,
                    kwargs: dict[str, Any]) -> RunResultStreaming:
    """The streamed run, resumed after each round of the clients' decisions."""
    result = Runner.run_streamed(agent, input, **kwargs)
    await _consume(published, result)
    while result.interruptions and approvals == "clients":
        state = result.to_state()
        await _decide(published, state, result.interruptions)
        result = Runner.run_streamed(agent, state, **kwargs)
        await _consume(published, result)
    return result


async def events(run: AgentRun, result: RunResultStreaming) -> AsyncIterator[StreamEvent]:
    """Each event of ``result.stream_events()``, published onto ``run`` before it is yielded.

    For code that calls ``Runner.run_streamed`` itself, inside an :class:`AgentRun` it opened
    first (so that runs inside its tools are children). A tool that raises shows ``ok: false``
    only through :func:`run`, which installs the ``tool_error_formatter`` that sees it.
    """
    published = _Published(run, result.current_agent)
    stream = cast(AsyncGenerator[StreamEvent, None], result.stream_events())
    try:
        publish_now = published.publish_now
        async for event in stream:
            if not publish_now(event):
                await published.publish(event)
            yield event
    except BaseException as exc:
        result.cancel()
        await published.close_handoffs(exc)
        raise
    finally:
        await stream.aclose()
    await published.close_handoffs(None)


def as_tool(agent: Agent[Any], tool_name: str | None = None, tool_description: str | None = None,
            **kwargs: Any) -> FunctionTool:
    """``agent.as_tool(tool_name, tool_description, **kwargs)`` whose inner run, called from a run
    published by :func:`run`, is published as it streams as a child run of the calling agent's
    run (ending ``error`` when it failed, even where the SDK hands the model a failure message).
    Outside such a run it is ``Agent.as_tool`` as it is. ``on_stream`` still receives every event.
    """
    on_stream: Callable[[AgentToolStreamEvent], Any] | None = kwargs.pop("on_stream", None)
    format_failure: ToolErrorFunction | None = kwargs.pop(
        "failure_error_function", default_tool_error_function)

    async def publish(event: AgentToolStreamEvent) -> None:
        inner_run = _AGENT_TOOL.get()
        if inner_run is not None:
            await inner_run.publish(event["event"])
        if on_stream is not None:
            answer = on_stream(event)
            if inspect.isawaitable(answer):
                await answer

    def failed(context: RunContextWrapper[Any], error: Exception) -> str | Awaitable[str]:
        inner_run = _AGENT_TOOL.get()
        if inner_run is not None:
            inner_run.failed = error
            if isinstance(context, ToolContext):
                inner_run.failures[context.tool_call_id] = describe(error)
        assert format_failure is not None
        return format_failure(context, error)

    tool = agent.as_tool(tool_name, tool_description, on_stream=publish,
                         failure_error_function=failed if format_failure else None, **kwargs)
    invoke_inner = tool.on_invoke_tool

    async def invoke(context: ToolContext[Any], input_json: str) -> Any:
        caller = _PUBLISHED.get()
        if caller is None:
            return await invoke_inner(context, input_json)
        opened = await caller.active.child(name=agent.name, prompt=_tool_prompt(input_json)).__aenter__()
        inner_run = _Published(opened, agent, caller.failures)
        tokens = _AGENT_TOOL.set(inner_run), _PUBLISHED.set(inner_run)
        failure: BaseException | None = None
        try:
            output = await invoke_inner(context, input_json)
            failure = inner_run.failed
            return output
        except BaseException as exc:
            failure = exc
            raise
        finally:
            _PUBLISHED.reset(tokens[1])
            _AGENT_TOOL.reset(tokens[0])
            await inner_run.close_handoffs(failure)
            await _end(opened, failure)

    tool.on_invoke_tool = invoke
    return tool


def _tool_prompt(input_json: str) -> str:
    """The input an agent tool gives its agent (``{"input": ...}``), else its JSON."""
    try:
        value = json.loads(input_json)
    except ValueError:
        return input_json
    return str(value["input"]) if isinstance(value, dict) and "input" in value else input_json
