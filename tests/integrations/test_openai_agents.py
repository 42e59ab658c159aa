"""OpenAI Agents SDK runs published by :mod:`runwire.integrations.openai_agents`, end to end: the
real SDK with its own offline model (``agents.testing.ScriptedModel``), through the real pipeline,
read back as an SSE client of the raw view and compared with what the SDK streamed or returned."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, ItemHelpers, Runner, function_tool, set_tracing_disabled
from agents.items import ToolCallItem, ToolCallOutputItem
from agents.testing import ScriptedModel, function_call
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from runwire.integrations import openai_agents
from runwire.integrations.agentrun import AgentRun
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

set_tracing_disabled(True)  # no exporter, no network


def message(*parts: str) -> ResponseOutputMessage:
    """One assistant message streamed as one delta per part."""
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(text=p, type="output_text", annotations=[], logprobs=[])
                 for p in parts])


def used(tokens_in: int, tokens_out: int) -> Usage:
    return Usage(requests=1, input_tokens=tokens_in, output_tokens=tokens_out,
                 total_tokens=tokens_in + tokens_out)


@function_tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def explode(level: int) -> str:
    """A tool that fails."""
    raise ValueError(f"kaputt at {level}")


def weather_script() -> list[Any]:
    return [
        {"output": [message("Let me ", "check. "), function_call("weather", {"city": "Oslo"}, call_id="c1"),
                    function_call("explode", {"level": 3}, call_id="c2")], "usage": used(12, 7)},
        {"output": [message("It is ", "sunny ", "in Oslo.")], "usage": used(30, 5)},
    ]


def weather_agent() -> Agent[Any]:
    return Agent(name="forecaster", tools=[weather, explode], model=ScriptedModel(weather_script()))


async def streamed(agent: Agent[Any], prompt: str) -> list[Any]:
    """What the SDK itself streams for ``agent`` (the reference for the published events)."""
    result = Runner.run_streamed(agent, prompt)
    return [event async for event in result.stream_events()]


async def test_text_tools_and_usage_are_published_as_the_sdk_streams_them(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("oa-text")
    result = await openai_agents.run(weather_agent(), "Weather in Oslo?", publisher=publisher,
                                     run_id=run_id)
    reference = await Runner.run(weather_agent(), "Weather in Oslo?")
    sdk_events = await streamed(weather_agent(), "Weather in Oslo?")
    await publisher.flush()
    events = own(await read_run(pipe, run_id))

    assert result.final_output == reference.final_output == "It is sunny in Oslo."
    assert [type(i) for i in result.new_items] == [type(i) for i in reference.new_items]
    assert len(result.raw_responses) == len(reference.raw_responses) == 2
    assert result.to_input_list() == reference.to_input_list()
    assert result.context_wrapper.usage.total_tokens == reference.context_wrapper.usage.total_tokens
    deltas = [e.data.delta for e in sdk_events
              if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    assert joins([e["payload"]["text"] for e in events if e["type"] == "text.delta"], deltas, publisher)
    assert text_of(events) == "".join(ItemHelpers.text_message_outputs(result.new_items))
    assert text_of(events).endswith(result.final_output)

    calls = [e.item for e in sdk_events if e.type == "run_item_stream_event" and isinstance(e.item, ToolCallItem)]
    outputs = [e.item for e in sdk_events
               if e.type == "run_item_stream_event" and isinstance(e.item, ToolCallOutputItem)]
    starts = [e["payload"] for e in events if e["type"] == "tool.start"]
    ends = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.end"}
    assert [(s["call_id"], s["tool"], s["input"]) for s in starts] == [
        (c.call_id, c.tool_name, {"city": "Oslo"} if c.tool_name == "weather" else {"level": 3})
        for c in calls]
    assert ends["c1"]["ok"] is True and ends["c1"]["output"] == outputs[0].output == "sunny in Oslo"
    assert all(isinstance(e["duration_ms"], int) for e in ends.values())
    usage = [e["payload"] for e in events if e["type"] == "x.usage"]
    assert usage == [{"input_tokens": 12, "output_tokens": 7, "total_tokens": 19, "model": "scripted-model"},
                     {"input_tokens": 30, "output_tokens": 5, "total_tokens": 35, "model": "scripted-model"}]
    assert [e["payload"]["step_kind"] for e in events if e["type"] == "step.boundary"] == [
        "tool-roundtrip", "text-only"]
    assert states(events) == ["running", "done"]
    assert events[0]["ext"] == {"agent": {"framework": "openai_agents", "name": "forecaster"}}


async def test_a_raising_tool_ends_not_ok_though_the_model_sees_a_friendly_message(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("oa-fail")
    result = await openai_agents.run(weather_agent(), "Weather?", publisher=publisher, run_id=run_id)
    friendly = next(i.output for i in result.new_items
                    if isinstance(i, ToolCallOutputItem) and i.call_id == "c2")
    events = await read_run(pipe, run_id)
    end = next(e["payload"] for e in events if e["type"] == "tool.end" and e["payload"]["call_id"] == "c2")
    assert end["ok"] is False and end["error"] == "ValueError: kaputt at 3"
    assert end["output"] == friendly == "An error occurred while running the tool. Please try again."
    assert states(events) == ["running", "done"]


async def test_an_agent_tool_that_fails_is_a_child_run_ending_error(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("oa-toolfail")
    broken = Agent(name="broken", model=ScriptedModel([RuntimeError("model down")]))
    lead = Agent(name="lead", tools=[openai_agents.as_tool(broken, "consult", "Ask the broken one")],
                 model=ScriptedModel([[function_call("consult", {"input": "help"}, call_id="t1")],
                                      [message("gave up")]]))
    result = await openai_agents.run(lead, "go", publisher=publisher, run_id=run_id)
    assert result.final_output == "gave up"
    events = await read_run(pipe, run_id)
    child = next(e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn")
    assert states(own(events, child)) == ["running", "error"]
    assert "model down" in own(events, child)[-1]["payload"]["reason"]
    end = next(e["payload"] for e in own(events) if e["type"] == "tool.end")
    assert end["ok"] is False and end["error"] == "RuntimeError: model down"
    assert states(own(events)) == ["running", "done"]


async def test_runs_inside_tools_are_child_runs_two_levels_deep(pipe: Pipeline) -> None:
    async with Publisher.connect(pipe.url, linger_ms=1.0) as publisher:
        deepest = Agent(name="deepest", model=ScriptedModel([[message("deep ", "answer")]]))

        @function_tool
        async def ask_deepest(question: str) -> str:
            """Ask the deepest agent."""
            return str((await openai_agents.run(deepest, question, publisher=publisher)).final_output)

        helper = Agent(name="helper", tools=[ask_deepest], model=ScriptedModel([
            [message("asking. "), function_call("ask_deepest", {"question": "why?"}, call_id="h1")],
            [message("helper ", "done")]]))

        @function_tool
        async def ask_helper(question: str) -> str:
            """Ask the helper agent."""
            return str((await openai_agents.run(helper, question, publisher=publisher)).final_output)

        lead = Agent(name="lead", tools=[ask_helper], model=ScriptedModel([
            [function_call("ask_helper", {"question": "how?"}, call_id="l1")],
            [message("lead ", "done")]]))
        run_id = unique("oa-nest")
        result = await openai_agents.run(lead, "go", publisher=publisher, run_id=run_id)
        await publisher.flush()
    assert result.final_output == "lead done"
    events = await read_run(pipe, run_id)
    spawns = [e["payload"] for e in own(events) if e["type"] == "child.spawn"]
    assert [s.get("prompt") for s in spawns] == ["how?"]
    helper_id = spawns[0]["child_id"]
    assert text_of(own(events, helper_id)) == "asking. helper done"
    deep_spawns = [e["payload"] for e in own(events, helper_id) if e["type"] == "child.spawn"]
    assert [s.get("prompt") for s in deep_spawns] == ["why?"]
    deep_id = deep_spawns[0]["child_id"]
    assert text_of(own(events, deep_id)) == "deep answer"
    assert own(events, deep_id)[0]["ext"]["agent"]["name"] == "deepest"
    tool_end = next(e["payload"] for e in own(events, helper_id) if e["type"] == "tool.end")
    assert tool_end == {**tool_end, "call_id": "h1", "ok": True, "output": "deep answer"}
    assert text_of(own(events)) == "lead done"
    for run in (None, helper_id, deep_id):
        assert states(own(events, run)) == ["running", "done"]


async def test_a_handoff_and_an_agent_tool_are_child_runs(pipe: Pipeline) -> None:
    """triage hands off to billing (a child of triage's run), whose agent tool runs the
    researcher (a child of billing's run): the SDK's own sub-agents, two levels deep."""
    researcher = Agent(name="researcher", model=ScriptedModel([
        {"output": [message("found ", "it")], "usage": used(3, 2)}]))
    billing = Agent(name="billing", tools=[openai_agents.as_tool(researcher, "research", "Look it up")],
                    model=ScriptedModel([
                        [message("checking. "), function_call("research", {"input": "invoice 7"}, call_id="b1")],
                        [message("billing ", "answer")]]))
    triage = Agent(name="triage", handoffs=[billing], model=ScriptedModel([
        [message("handing over. "), function_call("transfer_to_billing", {}, call_id="x1")]]))
    async with Publisher.connect(pipe.url, linger_ms=1.0) as publisher:
        run_id = unique("oa-handoff")
        result = await openai_agents.run(triage, "my invoice", publisher=publisher, run_id=run_id)
        await publisher.flush()
    reference = await Runner.run(Agent(name="researcher", model=ScriptedModel([[message("found it")]])), "x")
    assert reference.final_output == "found it"
    assert result.final_output == "billing answer" and result.last_agent is billing
    events = await read_run(pipe, run_id)
    root = own(events)
    assert text_of(root) == "handing over. "
    assert [(e["payload"]["call_id"], e["payload"]["tool"]) for e in root if e["type"] == "tool.start"] == [
        ("x1", "transfer_to_billing")]
    assert next(e["payload"]["ok"] for e in root if e["type"] == "tool.end") is True
    billing_id = next(e["payload"]["child_id"] for e in root if e["type"] == "child.spawn")
    billing_events = own(events, billing_id)
    assert billing_events[0]["ext"]["agent"]["name"] == "billing"
    assert text_of(billing_events) == "checking. billing answer"
    spawns = [e["payload"] for e in billing_events if e["type"] == "child.spawn"]
    assert [s.get("prompt") for s in spawns] == ["invoice 7"]
    researcher_events = own(events, spawns[0]["child_id"])
    assert text_of(researcher_events) == "found it"
    assert [e["payload"]["total_tokens"] for e in researcher_events if e["type"] == "x.usage"] == [5]
    end = next(e["payload"] for e in billing_events if e["type"] == "tool.end")
    assert end["call_id"] == "b1" and end["ok"] is True and end["output"] == "found it"
    for run in (None, billing_id, spawns[0]["child_id"]):
        assert states(own(events, run)) == ["running", "done"]


class SlowModel(ScriptedModel):
    """The SDK's scripted model, each streamed event after a pause (a model still talking)."""

    def __init__(self, steps: list[Any]) -> None:
        super().__init__(steps)
        self.talking = asyncio.Event()
        self.deltas = 0
        self.stopped_at: list[float] = []

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        try:
            async for event in super().stream_response(*args, **kwargs):
                yield event
                self.deltas += event.type == "response.output_text.delta"
                if self.deltas == 5:
                    self.talking.set()  # the first deltas reached the stream (one per 20 ms)
                await asyncio.sleep(0.02)
        finally:
            self.stopped_at.append(time.monotonic())


async def test_a_clients_cancel_stops_the_sdk_within_a_second(pipe: Pipeline, publisher: Publisher) -> None:
    model = SlowModel([[message(*[f"word{i} " for i in range(1000)])]])
    run_id = unique("oa-cancel")
    task = asyncio.create_task(openai_agents.run(Agent(name="talker", model=model), "talk",
                                                 publisher=publisher, run_id=run_id))
    await model.talking.wait()
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, model.stopped_at, run_id)
    assert 0 < len([e for e in events if e["type"] == "text.delta"]) < 1000


async def test_an_approval_and_a_denial_from_clients_resume_the_sdk_run(
    pipe: Pipeline, publisher: Publisher
) -> None:
    removed: list[str] = []

    @function_tool(needs_approval=True)
    def remove(path: str) -> str:
        """Remove a file."""
        removed.append(path)
        return f"removed {path}"

    model = ScriptedModel([
        [function_call("remove", {"path": "/tmp/a"}, call_id="r1"),
         function_call("remove", {"path": "/tmp/b"}, call_id="r2")],
        [message("one ", "removed")]])
    run_id = unique("oa-approve")
    task = asyncio.create_task(openai_agents.run(Agent(name="janitor", tools=[remove], model=model),
                                                 "clean up", publisher=publisher, run_id=run_id))
    waiting = await wait_for_awaiting(pipe, run_id)
    assert [(c["call_id"], c["tool"], c["input"]) for c in waiting["ext"]["approval"]["calls"]] == [
        ("r1", "remove", {"path": "/tmp/a"}), ("r2", "remove", {"path": "/tmp/b"})]
    assert removed == []
    await control(pipe, run_id, "deny", call_id="r2", reason="keep b")
    await control(pipe, run_id, "approve", call_id="r1")
    result = await asyncio.wait_for(task, 10)
    assert removed == ["/tmp/a"] and result.final_output == "one removed" and not result.interruptions
    assert "keep b" in str(model.last_call.input if model.last_call else "")  # what the model saw
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "awaiting_approval", "running", "done"]
    ends = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.end"}
    assert ends["r1"]["ok"] is True and ends["r1"]["output"] == "removed /tmp/a"
    assert ends["r2"]["ok"] is False and ends["r2"]["error"] == "keep b"



async def test_code_streaming_itself_publishes_through_events(pipe: Pipeline) -> None:
    run_id = unique("oa-events")
    async with Publisher.connect(pipe.url, linger_ms=1.0) as publisher:
        async with AgentRun(publisher, run_id, framework="openai_agents", name="forecaster") as run:
            result = Runner.run_streamed(weather_agent(), "Weather?")
            seen = [event async for event in openai_agents.events(run, result)]
        await publisher.flush()
    events = await read_run(pipe, run_id)
    assert len(seen) == len(await streamed(weather_agent(), "Weather?"))
    assert text_of(events) == "Let me check. It is sunny in Oslo." and result.is_complete
    assert [e["payload"]["call_id"] for e in events if e["type"] == "tool.end"] == ["c1", "c2"]
    assert states(events) == ["running", "done"]


async def test_an_exception_in_the_agent_ends_the_run_error_and_is_raised(pipe: Pipeline) -> None:
    with pytest.raises(RuntimeError, match="model down"):
        await Runner.run(Agent(name="x", model=ScriptedModel([RuntimeError("model down")])), "hi")
    async with Publisher.connect(pipe.url, linger_ms=1.0) as publisher:
        run_id = unique("oa-error")
        with pytest.raises(RuntimeError, match="model down"):
            await openai_agents.run(Agent(name="x", model=ScriptedModel([RuntimeError("model down")])),
                                    "hi", publisher=publisher, run_id=run_id)
        await publisher.flush()
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "error"]
    assert events[-1]["payload"]["reason"] == "RuntimeError: model down"
