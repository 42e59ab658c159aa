"""Google ADK runs published as runwire runs.

What maps to what (``docs/integrations.md`` has the full table)::

    partial text part / thought part        -> text.delta / reasoning.delta (once: the final
                                               aggregated event's text is not published again)
    function_call / function_response       -> tool.start / tool.end (by the call's id)
    a model response event                  -> step.boundary; its usage_metadata -> x.usage
    an event of another agent (path/branch) -> a child run of that agent, at any depth
    an AgentTool's inner runner             -> a child run (through :class:`RunwirePlugin`)
    adk_request_confirmation                -> awaiting_approval; approve/deny resumes the runner
    transfer / escalate / state, artifacts  -> x.google_adk.<kind> (carried)

Usage::

    runner = InMemoryRunner(agent=agent, app_name="app")
    async with Publisher.connect("redis://localhost:6379") as pub:
        final = await google_adk.run(runner, "What is the weather?", publisher=pub)

The idiomatic hook is :class:`RunwirePlugin`: ``App(..., plugins=[RunwirePlugin(pub)])`` publishes
every invocation of the runner (approvals then stay with the caller).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from .agentrun import AgentRun, OnPublishError, close_all, describe
from .values import to_json

try:
    from google.adk.agents._streaming_mode import StreamingMode  # run_config's, not re-exported
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.agents.run_config import RunConfig
    from google.adk.events.event import Event
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.plugins.plugin_manager import PluginManager
    from google.adk.runners import Runner
    from google.adk.tools.agent_tool import AgentTool
    from google.genai import types
except ImportError:  # the one-line message naming the extra
    from . import require

    require("google_adk")
    raise

from ..sdk.publisher import Publisher

__all__ = ["FRAMEWORK", "RunwirePlugin", "run"]

FRAMEWORK = "google_adk"
CONFIRMATION = "adk_request_confirmation"
"""The function call ADK sends when a tool asks for confirmation (``require_confirmation``)."""
_ACTIVE: contextvars.ContextVar[RunwirePlugin | None] = contextvars.ContextVar(
    "runwire_adk_plugin", default=None)


@dataclass
class _Pending:
    """A tool call waiting for confirmation: the original call and ADK's request id."""

    request_id: str
    call_id: str
    tool: str
    args: Any
    owner: AgentRun


class _Mapper:
    """Maps one invocation's ADK events onto a run and child runs of its sub-agents."""

    def __init__(self, root: AgentRun, root_agent: str, runner_agent: Any = None) -> None:
        self.root, self.root_agent, self.runner_agent = root, root_agent, runner_agent
        self.children: dict[tuple[str, ...], AgentRun] = {}
        self._opened: list[AgentRun] = []
        self._paths: dict[tuple[str, str | None, str], tuple[str, ...]] = {}
        self._streamed: dict[tuple[str, bool], list[str]] = {}
        """(run id, thought?) -> the text its partial events published since its last final one."""
        self._calls: dict[str, AgentRun] = {}  # open tool call id -> the run it was started on
        self.pending: list[_Pending] = []
        self.final: Event | None = None

    # ---- which run an event belongs to --------------------------------------
    def agent_path(self, event: Event) -> tuple[str, ...]:
        """The agents from the root to the event's author: ``node_info.path`` ("root@1/sub@1"),
        else ``branch`` ("root.sub"), else the author alone."""
        key = (event.node_info.path, event.branch, event.author)
        known = self._paths.get(key)
        if known is None:
            names: list[str] = []
            if event.node_info.path:
                names = [seg.split("@", 1)[0] for seg in event.node_info.path.split("/") if seg]
            elif event.branch:
                names = [seg for seg in event.branch.split(".") if seg]
            if not names:
                names = [event.author]
            known = self._paths[key] = tuple(names[1:] if names[0] == self.root_agent else names)
        return known

    async def run_of(self, path: tuple[str, ...]) -> AgentRun:
        if not path:
            return self.root
        if path not in self.children:
            parent = await self.run_of(path[:-1])
            child = parent.child(name=path[-1])
            await child.__aenter__()
            self.children[path] = child
            self._opened.append(child)
        return self.children[path]

    async def close(self, exc: BaseException | None) -> None:
        """Close the child runs, deepest first (``exc``: how the invocation ended)."""
        if exc is not None:
            error = "cancelled" if isinstance(exc, asyncio.CancelledError) else describe(exc)
            for call_id, owner in self._calls.items():
                if owner.tool_open(call_id):
                    await owner.tool_end(call_id, ok=False, error=error)
        self._calls.clear()
        opened, self._opened = self._opened[::-1], []
        await close_all(opened, exc)

    # ---- events ------------------------------------------------------------
    async def event(self, event: Event) -> None:
        if event.author == "user":
            return
        path = self.agent_path(event)
        target = self.children.get(path) if path else self.root
        if target is None:
            target = await self.run_of(path)
        content = event.content
        if event.partial:  # every token's path: no coroutine of its own when the publisher has room
            for part in content.parts or () if content else ():
                if part.text and not self._delta_now(target, part):
                    await (target.reasoning(part.text) if part.thought else target.text(part.text))
            return
        parts = list(content.parts or []) if content else []
        await self._texts(target, parts)
        for part in parts:
            await self._part(target, event, part)
        await self._actions(target, event)
        if _is_model_response(event):
            await self._usage(target, event)
            await target.step("tool-roundtrip" if event.get_function_calls() else "text-only")
        if _is_final(event) and (
                self.final is None or self.final.author != self.root_agent
                or event.author == self.root_agent):
            self.final = event  # the root agent's last final response, else the last one

    def _delta_now(self, target: AgentRun, part: types.Part) -> bool:
        """A partial event's text noted as streamed and published now; False when the publisher
        has no room now (then the caller awaits it)."""
        text, thought = part.text, bool(part.thought)
        assert text is not None
        self._streamed.setdefault((target.run_id, thought), []).append(text)
        return target.delta_now("reasoning.delta" if thought else "text.delta", text)

    async def _texts(self, target: AgentRun, parts: list[types.Part]) -> None:
        """The text of a final (non-partial) event: what its partial events did not publish
        already (ADK sends the chunks, then the whole text again)."""
        for thought in (False, True):
            whole = "".join(p.text for p in parts if p.text and bool(p.thought) is thought)
            if not whole:
                continue
            streamed = "".join(self._streamed.pop((target.run_id, thought), ()))
            rest = whole[len(streamed):] if whole.startswith(streamed) else ""
            await (target.reasoning(rest) if thought else target.text(rest))

    async def _part(self, target: AgentRun, event: Event, part: types.Part) -> None:
        if part.function_call is not None:
            await self._call(target, event, part.function_call)
        elif part.function_response is not None:
            await self._response(target, event, part.function_response)
        elif part.text is None:
            await target.carry("part", part.model_dump(mode="json", exclude_none=True))

    async def _call(self, target: AgentRun, event: Event, call: types.FunctionCall) -> None:
        if call.name == CONFIRMATION:
            original = (call.args or {}).get("originalFunctionCall") or {}
            call_id = str(original.get("id") or call.id)
            owner = self._calls.get(call_id, target)
            self.pending.append(_Pending(str(call.id), call_id, str(original.get("name")),
                                         original.get("args"), owner))
            return
        call_id = call.id or str(call.name)
        self._calls[call_id] = target
        await target.tool_start(call_id, str(call.name), call.args or {})
        if event.long_running_tool_ids and call.id in event.long_running_tool_ids:
            await target.carry("long_running", {"call_id": call_id, "tool": call.name})

    async def _response(self, target: AgentRun, event: Event,
                        response: types.FunctionResponse) -> None:
        call_id = response.id or str(response.name)
        if call_id in event.actions.requested_tool_confirmations:
            return  # not the tool's outcome: it waits for a decision
        owner = self._calls.pop(call_id, target)
        value = response.response
        error = value.get("error") if isinstance(value, Mapping) and set(value) == {"error"} else None
        if error is not None:
            await owner.tool_end(call_id, ok=False, error=error, tool=response.name)
        else:
            result = value.get("result", value) if isinstance(value, Mapping) and set(value) == \
                {"result"} else value
            await owner.tool_end(call_id, ok=True, output=result, tool=response.name)

    async def _actions(self, target: AgentRun, event: Event) -> None:
        actions = event.actions
        if actions.transfer_to_agent:
            await target.carry("transfer", {"from": event.author, "to": actions.transfer_to_agent})
        if actions.escalate:
            await target.carry("escalate", {"agent": event.author})
        for kind in ("state_delta", "artifact_delta"):
            if delta := getattr(actions, kind):
                await target.carry(kind, delta)
        if event.error_code or event.error_message:
            await target.carry("model_error", {"code": event.error_code,
                                               "message": event.error_message})

    async def _usage(self, target: AgentRun, event: Event) -> None:
        usage = event.usage_metadata
        if usage is None:
            return
        await target.usage(usage.prompt_token_count, usage.candidates_token_count,
                           event.model_version or self._model_of(event.author),
                           usage.total_token_count)

    def _model_of(self, author: str) -> str | None:
        agent = self.runner_agent.find_agent(author) if self.runner_agent is not None else None
        model = getattr(agent, "model", None)
        return model if isinstance(model, str) else getattr(model, "model", None)


def _is_model_response(event: Event) -> bool:
    """A model's answer (text and/or function calls), not a tool's response event."""
    return bool(event.content and event.content.role == "model" and not event.partial
                and not event.get_function_responses() and not _is_confirmation(event))


def _is_final(event: Event) -> bool:
    """A final response, not a pause for confirmation."""
    return event.is_final_response() and not _is_confirmation(event) \
        and not event.actions.requested_tool_confirmations


def _is_confirmation(event: Event) -> bool:
    return any(call.name == CONFIRMATION for call in event.get_function_calls())


class RunwirePlugin(BasePlugin):
    """ADK's hook: publishes each invocation of the runner it is registered on as a run (and the
    inner runner of an ``AgentTool``, which inherits plugins, as a child run of the current one).

    ``skip``: a runner's plugin manager whose own invocations are not published (:func:`run`
    maps that stream itself and registers a plugin for the ``AgentTool`` runs only)."""

    def __init__(self, publisher: Publisher, *, skip: PluginManager | None = None,
                 on_publish_error: OnPublishError = "continue", publish_timeout: float = 5.0,
                 name: str = "runwire") -> None:
        super().__init__(name=name)
        self.publisher, self.skip = publisher, skip
        self.on_publish_error, self.publish_timeout = on_publish_error, publish_timeout
        self._mappers: dict[int, _Mapper] = {}
        self.run_ids: list[str] = []
        """The runs this plugin opened, in order (an invocation's, then its AgentTools')."""

    def _mine(self, ctx: InvocationContext) -> bool:
        if self.skip is None:
            return True
        return ctx.plugin_manager is not self.skip and _ACTIVE.get() is self

    async def before_run_callback(self, *, invocation_context: InvocationContext) -> None:
        if not self._mine(invocation_context):
            return None
        agent = invocation_context.agent
        name = agent.name if agent is not None else None
        run = AgentRun(self.publisher, framework=FRAMEWORK, name=name,
                       prompt=_text_of(invocation_context.user_content),
                       on_publish_error=self.on_publish_error,
                       publish_timeout=self.publish_timeout)
        await run.__aenter__()
        self.run_ids.append(run.run_id)
        self._mappers[id(invocation_context)] = _Mapper(run, name or "", agent)
        return None

    async def on_event_callback(self, *, invocation_context: InvocationContext,
                                event: Event) -> Event | None:
        mapper = self._mappers.get(id(invocation_context))
        if mapper is not None:
            await mapper.event(event)
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        await self._end(invocation_context, None)

    async def on_run_error_callback(self, *, invocation_context: InvocationContext,
                                    error: Exception) -> None:
        await self._end(invocation_context, error)

    async def _end(self, ctx: InvocationContext, exc: BaseException | None) -> None:
        mapper = self._mappers.pop(id(ctx), None)
        if mapper is not None:
            await mapper.close(exc)
            await mapper.root.__aexit__(type(exc) if exc else None, exc, None)

    async def abandon(self, exc: BaseException | None) -> None:
        """Close the runs of invocations that ended without a callback (a cancelled task)."""
        for mapper in [self._mappers.pop(key) for key in list(self._mappers)]:
            await mapper.close(exc)
            await mapper.root.__aexit__(type(exc) if exc else None, exc, None)


def _text_of(content: types.Content | None) -> str | None:
    if content is None or not content.parts:
        return None
    return "".join(part.text for part in content.parts if part.text) or None


def _message(input: types.Content | str) -> types.Content:
    if isinstance(input, str):
        return types.Content(role="user", parts=[types.Part(text=input)])
    return input


def _streaming(config: RunConfig | None) -> RunConfig:
    """``config`` with SSE streaming, so text arrives as partial events."""
    config = config or RunConfig()
    if config.streaming_mode == StreamingMode.NONE:
        config = config.model_copy(update={"streaming_mode": StreamingMode.SSE})
    return config


def _has_agent_tool(agent: Any) -> bool:
    """Whether an ``AgentTool`` is in the ``tools`` of ``agent`` or of a sub-agent (then
    :func:`run` registers its plugin to see the inner runner's events)."""
    return any(isinstance(tool, AgentTool) for tool in getattr(agent, "tools", None) or ()) \
        or any(_has_agent_tool(sub) for sub in getattr(agent, "sub_agents", None) or ())


async def _session(runner: Runner, user_id: str, session_id: str) -> None:
    service = runner.session_service
    found = await service.get_session(app_name=runner.app_name, user_id=user_id,
                                      session_id=session_id)
    if found is None:
        await service.create_session(app_name=runner.app_name, user_id=user_id,
                                     session_id=session_id)


async def run(agent: Runner, input: types.Content | str, *, publisher: Publisher,
              run_id: str | None = None, on_publish_error: OnPublishError = "continue",
              publish_timeout: float = 5.0, tenant: str | None = None, thread: str | None = None,
              **kwargs: Any) -> Event | None:
    """Drive ``agent.run_async(...)`` (a :class:`Runner`) with ``input`` as ``new_message`` (a
    ``str`` becomes a user ``Content``), publishing every event as it happens, and return the
    root agent's final-response :class:`Event` (else the last final response; ``None`` when
    there is none). ``user_id`` (default ``"runwire"``) and ``session_id`` (default: the run's
    id) are in ``kwargs``; a missing session is created. Other ``kwargs`` go to ``run_async``;
    ``run_config`` is given SSE streaming when it has none. A tool that asks for confirmation
    makes the run ``awaiting_approval``; the client's approve/deny resumes the runner with it."""
    runner = agent
    root_name = runner.agent.name
    async with AgentRun(publisher, run_id, framework=FRAMEWORK, name=root_name,
                        on_publish_error=on_publish_error, publish_timeout=publish_timeout,
                        tenant=tenant, thread=thread) as root:
        user_id = str(kwargs.pop("user_id", "runwire"))
        session_id = str(kwargs.pop("session_id", root.run_id))
        kwargs["run_config"] = _streaming(kwargs.get("run_config"))
        await _session(runner, user_id, session_id)
        plugin = RunwirePlugin(publisher, skip=runner.plugin_manager, name=f"runwire-{root.run_id}",
                               on_publish_error=on_publish_error, publish_timeout=publish_timeout)
        watching = _has_agent_tool(runner.agent)
        if watching:
            runner.plugin_manager.register_plugin(plugin)
        token = _ACTIVE.set(plugin)
        mapper = _Mapper(root, root_name, runner.agent)
        message: types.Content | None = _message(input)
        ended: BaseException | None = None
        try:
            while message is not None:
                async with aclosing(runner.run_async(user_id=user_id, session_id=session_id,
                                                     new_message=message, **kwargs)) as events:
                    async for event in events:
                        await mapper.event(event)
                message = await _decide(mapper)
        except BaseException as exc:
            ended = exc
            raise
        finally:
            _ACTIVE.reset(token)
            if watching:
                runner.plugin_manager.plugins.remove(plugin)
            try:
                await plugin.abandon(ended)
            finally:
                await mapper.close(ended)
        return mapper.final


async def _decide(mapper: _Mapper) -> types.Content | None:
    """The confirmations the runner waits for, decided by the client: the message that resumes
    it (``None``: nothing waits)."""
    pending, mapper.pending = mapper.pending, []
    if not pending:
        return None
    parts: list[types.Part] = []
    for owner in dict.fromkeys(p.owner for p in pending):
        mine = [p for p in pending if p.owner is owner]
        decided = await owner.awaiting([{"call_id": p.call_id, "tool": p.tool, "input": p.args}
                                        for p in mine])
        for p in mine:
            decision = decided[p.call_id]
            answer: dict[str, Any] = {"confirmed": decision.approved}
            if decision.answer is not None:
                answer["payload"] = to_json(decision.answer)
            parts.append(types.Part(function_response=types.FunctionResponse(
                id=p.request_id, name=CONFIRMATION, response=answer)))
    return types.Content(role="user", parts=parts)
