"""Audience profiles (the loom-mcp stream package's ``StreamProfile``) over canonical event types.

A profile says which event kinds an audience sees; :func:`profile` returns
it as a predicate on canonical events. The loom-mcp stream package's flags map onto canonical
types (loom-mcp's own kinds arrive as ``x.mcp.<type>``):

=====================  =====================================================
flag                   canonical types
=====================  =====================================================
Assistant              ``text.delta``
Thoughts               ``reasoning.delta``, ``x.mcp.planner_thought``
PromptRendered         ``x.mcp.prompt_rendered``
ToolStart              ``tool.start``
ToolUpdate             ``x.mcp.tool_update``, ``x.mcp.tool_output_delta``
ToolCallArgsDelta      ``x.mcp.tool_call_args_delta``
ToolEnd                ``tool.end``
AwaitClarification     ``x.mcp.await_clarification``
AwaitConfirmation      ``x.mcp.await_confirmation``, ``plan.proposal`` (a
                       plan waiting for the user's approval)
AwaitQuestions         ``x.mcp.await_questions``
AwaitExternalTools     ``x.mcp.await_external_tools``
ToolAuthorization      ``x.mcp.tool_authorization``
Usage                  ``x.usage``
Workflow               ``run.lifecycle``, ``step.boundary``,
                       ``x.mcp.workflow``, ``x.mcp.run_stream_end``,
                       ``x.mcp.session_stream_started``,
                       ``x.mcp.session_stream_end``
ChildRuns              ``child.spawn`` (the loom-mcp stream package's ``child_run_linked``)
(always)               ``x.gap`` — a client must be able to tell that events
                       were lost (Koder agent stream §7 T2), whatever it chose to see
(other)                any other ``x.*`` type (``x.cogency.*``,
                       ``x.loom.*``, …): only profiles that emit everything
=====================  =====================================================

The profiles, as the loom-mcp stream package defines them:

* ``default`` — every kind (DefaultProfile).
* ``debug`` — every kind (AgentDebugProfile: "a verbose profile intended
  for operational and debugging views").
* ``user-chat`` — assistant replies, tool start/update/end, awaits, usage,
  workflow and child links; no thoughts, rendered prompts, argument deltas
  or authorization decisions (UserChatProfile).
* ``metrics`` — usage and workflow only (MetricsProfile).

Profiles select *kinds*; whether a child run's events are flattened into the
parent stream or only linked is the separate ``children=flatten|link``
choice of the reader (the loom-mcp stream package's profiles all link).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..core import envelope
from ..core.envelope import Event
from ..core.errors import ConfigError


class StreamProfile(msgspec.Struct, frozen=True, kw_only=True):
    """Which event kinds an audience sees (the loom-mcp stream package's flags)."""

    assistant: bool = False
    thoughts: bool = False
    prompt_rendered: bool = False
    tool_start: bool = False
    tool_update: bool = False
    tool_call_args_delta: bool = False
    tool_end: bool = False
    await_clarification: bool = False
    await_confirmation: bool = False
    await_questions: bool = False
    await_external_tools: bool = False
    tool_authorization: bool = False
    usage: bool = False
    workflow: bool = False
    child_runs: bool = False
    other: bool = False
    """Extension types no flag names (``x.cogency.*``, ``x.loom.*``, …)."""


FLAG_OF_TYPE: dict[str, str] = {
    envelope.TextDelta.type_name: "assistant",
    envelope.ReasoningDelta.type_name: "thoughts",
    "x.mcp.planner_thought": "thoughts",
    "x.mcp.prompt_rendered": "prompt_rendered",
    envelope.ToolStart.type_name: "tool_start",
    "x.mcp.tool_update": "tool_update",
    "x.mcp.tool_output_delta": "tool_update",
    "x.mcp.tool_call_args_delta": "tool_call_args_delta",
    envelope.ToolEnd.type_name: "tool_end",
    "x.mcp.await_clarification": "await_clarification",
    "x.mcp.await_confirmation": "await_confirmation",
    envelope.PlanProposal.type_name: "await_confirmation",
    "x.mcp.await_questions": "await_questions",
    "x.mcp.await_external_tools": "await_external_tools",
    "x.mcp.tool_authorization": "tool_authorization",
    envelope.Usage.type_name: "usage",
    envelope.RunLifecycle.type_name: "workflow",
    envelope.StepBoundary.type_name: "workflow",
    "x.mcp.workflow": "workflow",
    "x.mcp.run_stream_end": "workflow",
    "x.mcp.session_stream_started": "workflow",
    "x.mcp.session_stream_end": "workflow",
    envelope.ChildSpawn.type_name: "child_runs",
}
ALWAYS: frozenset[str] = frozenset({envelope.Gap.type_name})

_EVERYTHING = StreamProfile(**{name: True for name in StreamProfile.__struct_fields__})

PROFILES: dict[str, StreamProfile] = {
    "default": _EVERYTHING,
    "debug": _EVERYTHING,
    "user-chat": StreamProfile(
        assistant=True,
        tool_start=True,
        tool_update=True,
        tool_end=True,
        await_clarification=True,
        await_confirmation=True,
        await_questions=True,
        await_external_tools=True,
        usage=True,
        workflow=True,
        child_runs=True,
    ),
    "metrics": StreamProfile(usage=True, workflow=True),
}
ALIASES: dict[str, str] = {
    "user": "user-chat",
    "chat": "user-chat",
    "userchat": "user-chat",
    "agent-debug": "debug",
    "agentdebug": "debug",
}


def profile_flags(name: str) -> StreamProfile:
    """The flags of profile ``name``; :class:`ConfigError` for an unknown name."""
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ConfigError(f"unknown profile {name!r}; known: {known}") from None


def emits(flags: StreamProfile, event_type: str) -> bool:
    """Whether a profile with ``flags`` emits events of ``event_type``."""
    if event_type in ALWAYS:
        return True
    flag = FLAG_OF_TYPE.get(event_type, "other")
    return bool(getattr(flags, flag))


def profile(name: str) -> Callable[[Event], bool]:
    """The predicate of profile ``name`` (default, debug, user-chat, metrics).

    Raises :class:`ConfigError` for an unknown name.
    """
    flags = profile_flags(name)

    def keep(event: Event) -> bool:
        return emits(flags, event.type)

    return keep


accepts = profile
"""Another name for :func:`profile` (what the edge's feed filter looks up)."""

__all__ = ["ALWAYS", "FLAG_OF_TYPE", "PROFILES", "StreamProfile", "accepts", "emits", "profile", "profile_flags"]
