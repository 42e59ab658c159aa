"""Audience profiles (the loom-mcp stream package's StreamProfile) as predicates over canonical events."""

from __future__ import annotations

import pytest

from runwire.core import envelope
from runwire.core.errors import ConfigError
from runwire.protocols.profiles import PROFILES, profile
from tests.protocols.runs import Run, all_runs, child_run, plan_run, tool_run


def kinds(name: str, events: list[envelope.Event]) -> set[str]:
    keep = profile(name)
    return {e.type for e in events if keep(e)}


def mcp(kind: str, seq: int) -> envelope.Event:
    return envelope.make(f"x.mcp.{kind}", {}, id=f"m{seq}", ts="2026-01-01T00:00:00Z", run_id="r", seq=seq)


MCP_KINDS = ["planner_thought", "prompt_rendered", "tool_update", "tool_output_delta", "tool_call_args_delta",
             "await_clarification", "await_confirmation", "await_questions", "await_external_tools",
             "tool_authorization", "workflow", "run_stream_end"]


def every_kind() -> list[envelope.Event]:
    events = [e for run in all_runs().values() for e in run]
    events += [mcp(k, i) for i, k in enumerate(MCP_KINDS, 1)]
    return events


def test_user_chat_profile() -> None:
    """UserChatProfile: "assistant replies, tool start/end/update, awaits, usage, workflow, and
    child_run_linked links" — no thoughts, prompts, argument deltas or authorizations."""
    seen = kinds("user-chat", every_kind())
    assert seen == {
        "text.delta", "tool.start", "tool.end", "x.mcp.tool_update", "x.mcp.tool_output_delta",
        "x.mcp.await_clarification", "x.mcp.await_confirmation", "x.mcp.await_questions",
        "x.mcp.await_external_tools", "plan.proposal", "x.usage", "run.lifecycle", "step.boundary",
        "x.mcp.workflow", "x.mcp.run_stream_end", "x.mcp.session_stream_started", "x.mcp.session_stream_end",
        "child.spawn", "x.gap",
    }


def test_metrics_profile() -> None:
    """MetricsProfile: "emits only usage and workflow events" (plus x.gap, so loss stays visible)."""
    assert kinds("metrics", every_kind()) == {
        "x.usage", "run.lifecycle", "step.boundary", "x.mcp.workflow", "x.mcp.run_stream_end",
        "x.mcp.session_stream_started", "x.mcp.session_stream_end", "x.gap"}


@pytest.mark.parametrize("name", ["default", "debug"])
def test_default_and_debug_emit_everything(name: str) -> None:
    events = every_kind()
    assert kinds(name, events) == {e.type for e in events}


def test_profiles_filter_real_runs() -> None:
    chat = [e for e in tool_run() if profile("user-chat")(e)]
    assert "reasoning.delta" not in {e.type for e in chat}
    assert [e.type for e in chat if e.type.startswith("tool.")] == ["tool.start", "tool.end"] * 2
    assert any(e.type == "plan.proposal" for e in plan_run() if profile("chat")(e))
    assert any(e.type == "child.spawn" for e in child_run() if profile("metrics")(e)) is False


def test_names_and_aliases() -> None:
    assert set(PROFILES) == {"default", "debug", "user-chat", "metrics"}
    event = Run("r").think("x").events[0]
    assert profile("USER_CHAT")(event) is False and profile("agent-debug")(event) is True


def test_unknown_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown profile 'gossip'; known: debug, default, metrics, user-chat"):
        profile("gossip")


def test_edge_feed_filter_uses_these_profiles() -> None:
    """The edge's ``profile=`` parameter resolves through this module."""
    from runwire.edge.fanout.filters import event_filter

    def profile_filter(name: str):  # type: ignore[no-untyped-def]
        return event_filter(name, "flatten")

    thought = Run("r").think("x").events[0]
    assert profile_filter("user")(thought) is False
    assert profile_filter("debug")(thought) is True
    gap = envelope.make("x.gap", {"run_id": "r", "first": 1, "last": 2}, id="g", ts="2026-01-01T00:00:00Z",
                        run_id="r", seq=3)
    assert profile_filter("metrics")(gap) is True  # loss stays visible in every profile
