"""Pydantic AI agents through :mod:`runwire.integrations.pydantic_ai`, end to end: the real
library with its offline test models (``TestModel``, ``FunctionModel``), a real Redis bus, two
workers and an edge; each run read back as an SSE client of the raw view and compared with
what the framework itself streamed and returned."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import RunContext

from runwire.integrations import pydantic_ai
from runwire.integrations.agentrun import AgentRun
from runwire.integrations.values import to_json
from runwire.sdk.publisher import Publisher
from tests.e2e_harness import Pipeline, unique
from tests.integrations.conftest import (
    cancel_stops_it_within_a_second,
    control,
    joins,
    own,
    read_run,
    states,
    text_of,
    wait_for_awaiting,
)

ANSWER = "It is sunny in Paris, and the city has about two million people."


def weather_agent(model: Any) -> Agent[None, str]:
    agent = Agent(model, name="forecaster")

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"sunny in {city}"

    @agent.tool_plain
    def population(city: str) -> dict[str, Any]:
        return {"city": city, "people": 2_100_000}

    return agent


def parts(messages: list[ModelMessage]) -> list[tuple[str, Any]]:
    """What a run's messages say, without ids or timestamps."""
    return [(p.part_kind, to_json(getattr(p, "content", None) or getattr(p, "args", None)))
            for m in messages for p in m.parts]


def ends(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.end"}


def starts(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.start"}


async def test_text_tools_and_usage_are_published_as_the_framework_streams_them(
    pipe: Pipeline, publisher: Publisher
) -> None:
    agent = weather_agent(TestModel(custom_output_text=ANSWER))
    streamed: list[AgentStreamEvent] = []

    async def record(_ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            streamed.append(event)

    run_id = unique("pai")
    result = await pydantic_ai.run(agent, "Weather and size of Paris?", publisher=publisher,
                                   run_id=run_id, event_stream_handler=record)
    plain = await agent.run("Weather and size of Paris?")
    assert result.output == plain.output == ANSWER
    assert parts(result.all_messages()) == parts(plain.all_messages())

    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "done"]
    deltas = [e["payload"]["text"] for e in events if e["type"] == "text.delta"]
    framework_deltas = [e.part.content if isinstance(e, PartStartEvent) else e.delta.content_delta
                        for e in streamed
                        if (isinstance(e, PartStartEvent) and isinstance(e.part, TextPart))
                        or (isinstance(e, PartDeltaEvent) and isinstance(e.delta, TextPartDelta))]
    assert joins(deltas, framework_deltas, publisher) and len(framework_deltas) > 1
    assert text_of(events) == ANSWER

    calls = {p.tool_call_id: p for m in result.all_messages() for p in m.parts
             if isinstance(p, ToolCallPart)}
    returns = {p.tool_call_id: p for m in result.all_messages() for p in m.parts
               if isinstance(p, ToolReturnPart)}
    started, ended = starts(events), ends(events)
    assert set(started) == set(ended) == set(calls) and len(calls) == 2
    for call_id, call in calls.items():
        assert started[call_id]["tool"] == call.tool_name
        assert started[call_id]["input"] == call.args_as_dict()
        assert ended[call_id]["ok"] is True
        assert ended[call_id]["output"] == to_json(returns[call_id].content)
        assert isinstance(ended[call_id]["duration_ms"], int)
    usage = [e["payload"] for e in events if e["type"] == "x.usage"]
    assert {u["model"] for u in usage} == {"test"}
    assert sum(u["total_tokens"] for u in usage) == result.usage.total_tokens
    steps = [e["payload"]["step_kind"] for e in events if e["type"] == "step.boundary"]
    assert steps == ["tool-roundtrip", "text-only"]
    assert [e["type"] for e in events if e["type"].startswith("x.pydantic_ai.")] == \
        ["x.pydantic_ai.final_result"]


def thinking_then_text(thoughts: list[str], chunks: list[str]) -> FunctionModel:
    async def stream(_messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[
            str | DeltaThinkingCalls]:
        for thought in thoughts:
            yield {0: DeltaThinkingPart(content=thought)}
        for chunk in chunks:
            yield chunk

    return FunctionModel(stream_function=stream, model_name="thinker")


async def test_reasoning_and_text_deltas_are_exact(pipe: Pipeline, publisher: Publisher) -> None:
    thoughts, chunks = ["The user ", "wants a ", "haiku."], ["Autumn ", "moonlight—\n", "a worm digs"]
    poet = Agent(thinking_then_text(thoughts, chunks))
    run_id = unique("pai-think")
    result = await pydantic_ai.run(poet, "A haiku", publisher=publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    assert events[0]["ext"]["agent"]["name"] == poet.name == "poet"  # named as agent.run names it
    assert joins([e["payload"]["text"] for e in events if e["type"] == "reasoning.delta"], thoughts, publisher)
    assert joins([e["payload"]["text"] for e in events if e["type"] == "text.delta"], chunks, publisher)
    assert text_of(events) == result.output == "".join(chunks)
    assert [e["payload"]["model"] for e in events if e["type"] == "x.usage"] == ["thinker"]


def calling(*calls: tuple[str, dict[str, Any]], then: str = "done") -> FunctionModel:
    """A model that makes ``calls`` one per response (each call id ``c<n>``), then says ``then``."""
    async def stream(messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        made = sum(isinstance(p, ToolCallPart) for m in messages for p in m.parts)
        if made < len(calls):
            name, args = calls[made]
            yield {0: DeltaToolCall(name=name, json_args=json.dumps(args), tool_call_id=f"c{made}")}
        else:
            yield then

    return FunctionModel(stream_function=stream, model_name="caller")


async def test_a_failing_tool_ends_not_ok_with_its_error_before_the_run_ends_error(
    pipe: Pipeline, publisher: Publisher
) -> None:
    agent = Agent(calling(("flaky", {"n": 1}), ("broken", {"path": "/x"})), name="fragile")

    @agent.tool_plain
    def flaky(n: int) -> str:
        raise ModelRetry(f"n={n} is not allowed, try another")

    @agent.tool_plain
    def broken(path: str) -> str:
        raise ValueError(f"cannot open {path}")

    run_id = unique("pai-fail")
    with pytest.raises(ValueError, match="cannot open /x"):
        await pydantic_ai.run(agent, "go", publisher=publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    ended = ends(events)
    assert ended["c0"]["ok"] is False and "n=1 is not allowed" in ended["c0"]["error"]
    assert ended["c1"]["ok"] is False and ended["c1"]["error"] == "ValueError: cannot open /x"
    assert starts(events)["c1"]["input"] == {"path": "/x"}
    assert [(e["type"], e["payload"].get("call_id")) for e in events[-2:]] == [
        ("tool.end", "c1"), ("run.lifecycle", None)]
    assert states(events) == ["running", "error"]
    assert events[-1]["payload"]["reason"] == "ValueError: cannot open /x"


async def test_agents_delegating_through_run_are_child_runs_two_levels_deep(
    pipe: Pipeline, publisher: Publisher
) -> None:
    leaf = Agent(TestModel(custom_output_text="leaf says hi"), name="leaf")
    helper = Agent(calling(("ask_leaf", {"question": "hi?"}), then="helper relays: "), name="helper")
    lead = Agent(calling(("ask_helper", {"task": "relay"}), then="lead is done"), name="lead")

    @helper.tool_plain
    async def ask_leaf(question: str) -> str:
        return (await pydantic_ai.run(leaf, question, publisher=publisher)).output

    @lead.tool_plain
    async def ask_helper(task: str) -> str:
        return (await pydantic_ai.run(helper, task, publisher=publisher)).output

    run_id = unique("pai-nest")
    result = await pydantic_ai.run(lead, "delegate", publisher=publisher, run_id=run_id)
    assert result.output == "lead is done"
    events = await read_run(pipe, run_id)
    root = own(events)
    [helper_id] = [e["payload"]["child_id"] for e in root if e["type"] == "child.spawn"]
    [spawn] = [e for e in root if e["type"] == "child.spawn"]
    assert spawn["payload"]["prompt"] == "relay"
    helper_events = own(events, helper_id)
    [leaf_id] = [e["payload"]["child_id"] for e in helper_events if e["type"] == "child.spawn"]
    leaf_events = own(events, leaf_id)
    assert text_of(root) == "lead is done"
    assert text_of(helper_events) == "helper relays: "
    assert text_of(leaf_events) == "leaf says hi"
    assert ends(root)["c0"]["output"] == "helper relays: "
    assert ends(helper_events)["c0"]["output"] == "leaf says hi"
    for own_events, name in ((root, "lead"), (helper_events, "helper"), (leaf_events, "leaf")):
        assert states(own_events) == ["running", "done"]
        assert own_events[0]["ext"] == {"agent": {"framework": "pydantic_ai", "name": name}}


async def test_a_clients_cancel_stops_the_agent_within_a_second(
    pipe: Pipeline, publisher: Publisher
) -> None:
    streaming = asyncio.Event()
    stopped_at: list[float] = []

    async def slow(_messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
        yield "Let me think"
        streaming.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped_at.append(time.monotonic())
        yield " never"

    agent = Agent(FunctionModel(stream_function=slow), name="slowpoke")
    run_id = unique("pai-cancel")
    task = asyncio.create_task(pydantic_ai.run(agent, "think", publisher=publisher, run_id=run_id))
    await streaming.wait()
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, stopped_at, run_id)
    assert text_of(events) == "Let me think"


async def test_approvals_from_a_client_resume_the_run(pipe: Pipeline, publisher: Publisher) -> None:
    deleted: list[str] = []
    mailed: list[str] = []
    agent = Agent(TestModel(custom_output_text="handled"), name="careful")

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        deleted.append(path)
        return f"deleted {path}"

    @agent.tool_plain(requires_approval=True)
    def send_mail(to: str) -> str:
        mailed.append(to)
        return f"mailed {to}"

    @agent.tool_plain(requires_approval=True)
    def rename(old: str, new: str) -> str:
        return f"renamed {old} to {new}"

    run_id = unique("pai-approve")
    task = asyncio.create_task(pydantic_ai.run(agent, "clean up", publisher=publisher, run_id=run_id))
    waiting = await wait_for_awaiting(pipe, run_id)
    calls = {c["tool"]: c for c in waiting["ext"]["approval"]["calls"]}
    assert set(calls) == {"delete_file", "send_mail", "rename"}
    assert calls["delete_file"]["input"] == {"path": "a"}
    await control(pipe, run_id, "approve", call_id=calls["delete_file"]["call_id"])
    await control(pipe, run_id, "answer", call_id=calls["rename"]["call_id"],
                  answer={"old": "a", "new": "b"})
    await control(pipe, run_id, "deny", call_id=calls["send_mail"]["call_id"], reason="not today")
    result = await asyncio.wait_for(task, 10)
    assert result.output == "handled"
    assert deleted == ["a"] and mailed == []
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "awaiting_approval", "running", "done"]
    ended = ends(events)
    assert ended[calls["delete_file"]["call_id"]] | {"duration_ms": 0} == {
        "call_id": calls["delete_file"]["call_id"], "ok": True, "output": "deleted a", "duration_ms": 0}
    assert ended[calls["rename"]["call_id"]]["output"] == "renamed a to b"
    denied = ended[calls["send_mail"]["call_id"]]
    assert denied["ok"] is False and denied["error"] == "not today"



async def test_an_exception_in_the_model_ends_the_run_error_and_is_raised(
    pipe: Pipeline, publisher: Publisher
) -> None:
    async def failing(_messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
        yield "partial "
        raise UnexpectedModelBehavior("the model went off the rails")

    agent = Agent(FunctionModel(stream_function=failing), name="wobbly")
    run_id = unique("pai-error")
    with pytest.raises(UnexpectedModelBehavior, match="off the rails"):
        await pydantic_ai.run(agent, "go", publisher=publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "error"]
    assert events[-1]["payload"]["reason"] == "UnexpectedModelBehavior: the model went off the rails"


async def test_the_event_stream_handler_publishes_onto_a_run_the_caller_opened(
    pipe: Pipeline, publisher: Publisher
) -> None:
    agent = weather_agent(TestModel(custom_output_text=ANSWER))
    run_id = unique("pai-handler")
    async with AgentRun(publisher, run_id, framework="pydantic_ai", name="mine") as published:
        result = await agent.run("Paris?", event_stream_handler=pydantic_ai.handler(published))
    events = await read_run(pipe, run_id)
    assert text_of(events) == result.output == ANSWER
    assert {p["tool"] for p in starts(events).values()} == {"weather", "population"}
    assert all(p["ok"] for p in ends(events).values()) and len(ends(events)) == 2
    assert states(events) == ["running", "done"]


async def test_the_capability_and_its_handler_publish_a_run_the_caller_opened(
    pipe: Pipeline, publisher: Publisher
) -> None:
    agent = weather_agent(TestModel(custom_output_text=ANSWER))
    run_id = unique("pai-capability")
    async with AgentRun(publisher, run_id, framework="pydantic_ai", name="mine") as published:
        publishing = pydantic_ai.Publishing(published)
        result = await agent.run("Paris?", capabilities=[publishing],
                                 event_stream_handler=publishing.handler())
    events = await read_run(pipe, run_id)
    assert text_of(events) == result.output == ANSWER
    assert len(ends(events)) == 2 and all(p["ok"] for p in ends(events).values())
    assert [e["payload"]["step_kind"] for e in events if e["type"] == "step.boundary"] == [
        "tool-roundtrip", "text-only"]
    assert sum(e["payload"]["total_tokens"] for e in events if e["type"] == "x.usage") == \
        result.usage.total_tokens


async def test_what_the_callers_handler_leaves_unread_is_published_too(pipe: Pipeline) -> None:
    chunks = ["One ", "two ", "three ", "four."]
    agent = Agent(thinking_then_text([], chunks), name="counter")
    seen: list[AgentStreamEvent] = []

    async def first_only(_ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            seen.append(event)
            break

    run_id = unique("pai-partial")
    async with Publisher.connect(pipe.url, linger_ms=1.0) as publisher:
        result = await pydantic_ai.run(agent, "count", publisher=publisher, run_id=run_id,
                                       event_stream_handler=first_only)
    events = await read_run(pipe, run_id)
    assert seen and joins([e["payload"]["text"] for e in events if e["type"] == "text.delta"], chunks)
    assert text_of(events) == result.output == "".join(chunks)
    assert states(events) == ["running", "done"]
