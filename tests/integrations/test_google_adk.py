"""Google ADK (:mod:`runwire.integrations.google_adk`) end to end: a real ``Runner`` driven by a
scripted :class:`~google.adk.models.BaseLlm` (no network, no Google auth), published through the
real pipeline and read back as an SSE client of the raw view, compared with what ADK itself
streams and returns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from google.adk.agents import LlmAgent, RunConfig
from google.adk.agents.run_config import StreamingMode
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import InMemoryRunner, Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools import AgentTool, FunctionTool
from google.genai import types
from pydantic import Field, PrivateAttr

from runwire.integrations import google_adk
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
)

Turn = list[str | types.Part] | BaseException
USAGE = types.GenerateContentResponseUsageMetadata(
    prompt_token_count=11, candidates_token_count=7, total_token_count=18)


class Scripted(BaseLlm):
    """A model that answers from a script, one turn per call: a list of pieces (a ``str`` is a
    text chunk, a thought ``Part`` a reasoning chunk, a function-call ``Part`` a call) or an
    exception to raise. Streaming, the text and thought chunks come as partial responses, then
    the aggregated final response ADK expects (thoughts, text, calls); ``delay`` paces the
    chunks, ``streaming`` is set once one was sent."""

    model: str = "scripted"
    turns: list[Any] = []
    delay: float = 0.0
    streaming: asyncio.Event = Field(default_factory=asyncio.Event, exclude=True)
    stopped_at: list[float] = Field(default_factory=list, exclude=True)
    _next: int = PrivateAttr(default=0)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        turn: Turn = self.turns[self._next]
        self._next += 1
        if isinstance(turn, BaseException):
            raise turn
        pieces = [types.Part(text=p) if isinstance(p, str) else p for p in turn]
        chunks = [p for p in pieces if p.text is not None]
        try:
            for chunk in chunks if stream else []:
                yield LlmResponse(content=_model(chunk), partial=True)
                self.streaming.set()
                await asyncio.sleep(self.delay)
        finally:
            self.stopped_at.append(time.monotonic())
        thoughts = "".join(p.text or "" for p in chunks if p.thought)
        text = "".join(p.text or "" for p in chunks if not p.thought)
        parts = [types.Part(text=thoughts, thought=True)] if thoughts else []
        parts += [types.Part(text=text)] if text else []
        parts += [p for p in pieces if p.function_call is not None]
        yield LlmResponse(content=_model(*parts), usage_metadata=USAGE, model_version="scripted-1")


def thought(text: str) -> types.Part:
    return types.Part(text=text, thought=True)


def _model(*parts: types.Part) -> types.Content:
    return types.Content(role="model", parts=list(parts))


def call(name: str, call_id: str, **args: Any) -> types.Part:
    return types.Part(function_call=types.FunctionCall(id=call_id, name=name, args=args))


def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


def boom(x: int) -> int:
    """Always fails."""
    raise ValueError(f"kaboom {x}")


def weather_agent() -> LlmAgent:
    model = Scripted(turns=[[thought("I should add. "), call("add", "c1", a=2, b=3)],
                            [thought("Now "), thought("answer."), "The sum ", "is ", "5, ",
                             "and it is sunny."]])
    return LlmAgent(name="weather", model=model, tools=[add])


def runner_of(agent: LlmAgent) -> InMemoryRunner:
    return InMemoryRunner(agent=agent, app_name="tests")


async def adk_events(agent: LlmAgent, mode: StreamingMode) -> list[Event]:
    """What ADK itself yields for the prompt "hi" (its own session, no runwire)."""
    runner = runner_of(agent)
    await runner.session_service.create_session(app_name="tests", user_id="u", session_id="s")
    message = types.Content(role="user", parts=[types.Part(text="hi")])
    return [event async for event in runner.run_async(
        user_id="u", session_id="s", new_message=message,
        run_config=RunConfig(streaming_mode=mode))]


def text_parts(event: Event | None) -> str:
    assert event is not None and event.content is not None
    return "".join(part.text or "" for part in event.content.parts or [] if not part.thought)


@pytest.fixture
async def redis_publisher(pipe: Pipeline) -> AsyncIterator[Publisher]:
    async with Publisher.connect(pipe.url, linger_ms=1.0) as pub:
        yield pub


async def test_text_tools_usage_and_result_are_what_adk_streams_and_returns(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("adk")
    final = await google_adk.run(runner_of(weather_agent()), "hi", publisher=publisher,
                                 run_id=run_id, user_id="u1")
    events = await read_run(pipe, run_id)
    streamed = await adk_events(weather_agent(), StreamingMode.SSE)
    whole = await adk_events(weather_agent(), StreamingMode.NONE)
    adk_final = [e for e in whole if e.is_final_response()][-1]
    assert text_of(events) == "".join(p.text or "" for e in streamed if e.partial and e.content
                                      for p in e.content.parts or [] if not p.thought)
    assert text_of(events) == text_parts(adk_final) == text_parts(final)
    reasoning = [e["payload"]["text"] for e in events if e["type"] == "reasoning.delta"]
    assert joins(reasoning, ["I should add. ", "Now ", "answer."], publisher)
    assert joins([e["payload"]["text"] for e in events if e["type"] == "text.delta"],
                 ["The sum ", "is ", "5, ", "and it is sunny."], publisher)
    assert final is not None and final.author == "weather" and final.is_final_response()
    assert final.content == adk_final.content
    starts = [e["payload"] for e in events if e["type"] == "tool.start"]
    ends = [e["payload"] for e in events if e["type"] == "tool.end"]
    adk_calls = [c for e in streamed for c in e.get_function_calls()]
    adk_responses = [r for e in streamed for r in e.get_function_responses()]
    assert [(s["call_id"], s["tool"], s["input"]) for s in starts] == [
        (c.id, c.name, c.args) for c in adk_calls] == [("c1", "add", {"a": 2, "b": 3})]
    assert [(x["call_id"], x["ok"], x["output"]) for x in ends] == [
        (r.id, True, (r.response or {})["result"]) for r in adk_responses] == [("c1", True, 5)]
    assert all(isinstance(x["duration_ms"], int) for x in ends)
    usage = [e["payload"] for e in events if e["type"] == "x.usage"]
    assert usage == [{"input_tokens": 11, "output_tokens": 7, "total_tokens": 18,
                      "model": "scripted-1"}] * 2
    steps = [e["payload"]["step_kind"] for e in events if e["type"] == "step.boundary"]
    assert steps == ["tool-roundtrip", "text-only"]
    assert states(events) == ["running", "done"]
    assert events[0]["ext"] == {"agent": {"framework": "google_adk", "name": "weather"}}


async def test_the_plugin_publishes_each_invocation_of_the_runner_it_is_on(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    plugin = google_adk.RunwirePlugin(redis_publisher)
    runner = Runner(app=App(name="tests", root_agent=weather_agent(), plugins=[plugin]),
                    session_service=InMemorySessionService())
    await runner.session_service.create_session(app_name="tests", user_id="u", session_id="s")
    message = types.Content(role="user", parts=[types.Part(text="hi")])
    streamed = [event async for event in runner.run_async(
        user_id="u", session_id="s", new_message=message,
        run_config=RunConfig(streaming_mode=StreamingMode.SSE))]
    [run_id] = plugin.run_ids
    events = await read_run(pipe, run_id)
    assert text_of(events) == text_parts(streamed[-1]) == "The sum is 5, and it is sunny."
    assert [(e["type"], e["payload"]["call_id"]) for e in events if e["type"].startswith("tool.")] \
        == [("tool.start", "c1"), ("tool.end", "c1")]
    assert states(events) == ["running", "done"]


async def test_a_failing_tool_ends_ok_false_before_the_run_errors(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    run_id = unique("adk-fail")
    agent = LlmAgent(name="failing", tools=[boom],
                     model=Scripted(turns=[[call("boom", "c9", x=4)], ["unreached"]]))
    with pytest.raises(ValueError, match="kaboom 4"):
        await google_adk.run(runner_of(agent), "hi", publisher=redis_publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    ends = [e["payload"] for e in events if e["type"] == "tool.end"]
    assert [(x["call_id"], x["ok"], x["error"]) for x in ends] == [("c9", False,
                                                                   "ValueError: kaboom 4")]
    kinds = [e["type"] if e["type"] != "run.lifecycle" else e["payload"]["state"] for e in events]
    assert kinds.index("tool.end") < kinds.index("error") == len(kinds) - 1


async def test_transfers_to_sub_agents_are_child_runs_two_levels_deep(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    run_id = unique("adk-transfer")
    deepest = LlmAgent(name="researcher", description="digs",
                       model=Scripted(turns=[["found ", "it"]]))
    middle = LlmAgent(name="planner", description="plans", sub_agents=[deepest], model=Scripted(
        turns=[[types.Part(text="handing over. "), call("transfer_to_agent", "t2",
                                                       agent_name="researcher")]]))
    root = LlmAgent(name="lead", sub_agents=[middle], model=Scripted(
        turns=[[call("transfer_to_agent", "t1", agent_name="planner")]]))
    final = await google_adk.run(runner_of(root), "hi", publisher=redis_publisher, run_id=run_id)
    assert final is not None and final.author == "researcher" and text_parts(final) == "found it"
    events = await read_run(pipe, run_id)
    spawned = [e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn"]
    assert len(spawned) == 1
    planner = own(events, spawned[0])
    grand = [e["payload"]["child_id"] for e in planner if e["type"] == "child.spawn"]
    assert len(grand) == 1
    researcher = own(events, grand[0])
    assert planner[0]["ext"]["agent"]["name"] == "planner"
    assert researcher[0]["ext"]["agent"]["name"] == "researcher"
    assert text_of(own(events)) == "" and text_of(planner) == "handing over. "
    assert text_of(researcher) == "found it"
    transfers = [e["payload"]["data"] for e in events if e["type"] == "x.google_adk.transfer"]
    assert transfers == [{"from": "lead", "to": "planner"}, {"from": "planner", "to": "researcher"}]
    assert [e["payload"]["call_id"] for e in planner if e["type"] == "tool.end"] == ["t2"]
    assert states(own(events)) == states(planner) == states(researcher) == ["running", "done"]


# ADK's own AgentTool passes its parent's plugins to the Runner it builds through the
# deprecated `plugins` argument (google.adk.tools.agent_tool, even with no plugins at all).
@pytest.mark.filterwarnings(
    "ignore:The `plugins` argument is deprecated:DeprecationWarning:google.adk.runners")
async def test_agent_tools_are_child_runs_two_levels_deep(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    run_id = unique("adk-agenttool")
    deepest = LlmAgent(name="researcher", description="digs",
                       model=Scripted(turns=[["deep ", "answer"]]))
    middle = LlmAgent(name="planner", description="plans", tools=[AgentTool(deepest)],
                      model=Scripted(turns=[[call("researcher", "a2", request="q2")],
                                            ["planned ", "it"]]))
    root = LlmAgent(name="lead", tools=[AgentTool(middle)], model=Scripted(
        turns=[[call("planner", "a1", request="q1")], ["all ", "done"]]))
    final = await google_adk.run(runner_of(root), "hi", publisher=redis_publisher, run_id=run_id)
    assert text_parts(final) == "all done"
    events = await read_run(pipe, run_id)
    assert text_of(own(events)) == "all done"
    [planner_id] = [e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn"]
    planner = own(events, planner_id)
    [researcher_id] = [e["payload"]["child_id"] for e in planner if e["type"] == "child.spawn"]
    researcher = own(events, researcher_id)
    assert text_of(planner) == "planned it" and text_of(researcher) == "deep answer"
    root_ends = {e["payload"]["call_id"]: e["payload"] for e in own(events) if e["type"] == "tool.end"}
    assert root_ends["a1"]["output"] == "planned it"
    assert [e["payload"]["call_id"] for e in planner if e["type"] == "tool.start"] == ["a2"]
    assert states(own(events)) == states(planner) == states(researcher) == ["running", "done"]


async def test_nested_runs_inside_tools_are_child_runs_two_levels_deep(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    run_id = unique("adk-nested")

    async def dig(topic: str) -> str:
        """Digs into a topic."""
        agent = LlmAgent(name="digger", model=Scripted(turns=[[f"dug {topic}"]]))
        found = await google_adk.run(runner_of(agent), topic, publisher=redis_publisher)
        return text_parts(found)

    async def plan(goal: str) -> str:
        """Plans a goal."""
        agent = LlmAgent(name="planner", tools=[dig], model=Scripted(
            turns=[[call("dig", "d1", topic=goal)], ["planned"]]))
        return text_parts(await google_adk.run(runner_of(agent), goal, publisher=redis_publisher))

    root = LlmAgent(name="lead", tools=[plan], model=Scripted(
        turns=[[call("plan", "p1", goal="moon")], ["launch"]]))
    await google_adk.run(runner_of(root), "go", publisher=redis_publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    [planner_id] = [e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn"]
    planner = own(events, planner_id)
    [digger_id] = [e["payload"]["child_id"] for e in planner if e["type"] == "child.spawn"]
    assert text_of(own(events)) == "launch" and text_of(planner) == "planned"
    assert text_of(own(events, digger_id)) == "dug moon"
    assert [e["payload"]["output"] for e in own(events) if e["type"] == "tool.end"] == ["planned"]
    assert states(own(events, digger_id)) == ["running", "done"]


async def test_a_clients_cancel_stops_adk_within_a_second(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("adk-cancel")
    model = Scripted(turns=[["tick "] * 2000], delay=0.02)
    task = asyncio.create_task(google_adk.run(runner_of(LlmAgent(name="ticker", model=model)),
                                              "count", publisher=publisher, run_id=run_id))
    await asyncio.wait_for(model.streaming.wait(), 10)
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, model.stopped_at, run_id)
    assert text_of(events).startswith("tick tick ")


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_tool_confirmation_waits_for_the_clients_decision(
    pipe: Pipeline, redis_publisher: Publisher, decision: str
) -> None:
    run_id = unique("adk-confirm")
    deleted: list[str] = []

    def delete(path: str) -> str:
        """Deletes a file."""
        deleted.append(path)
        return f"deleted {path}"

    agent = LlmAgent(name="janitor", tools=[FunctionTool(delete, require_confirmation=True)],
                     model=Scripted(turns=[[call("delete", "c1", path="/tmp/x")], ["finished"]]))
    task = asyncio.create_task(google_adk.run(runner_of(agent), "clean", run_id=run_id,
                                              publisher=redis_publisher))
    await redis_publisher.flush()
    await control(pipe, run_id, decision, call_id="c1", reason="checked")
    final = await asyncio.wait_for(task, 10)
    assert text_parts(final) == "finished"
    assert deleted == (["/tmp/x"] if decision == "approve" else [])
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "awaiting_approval", "running", "done"]
    waiting = next(e for e in events if e["payload"].get("state") == "awaiting_approval")
    assert waiting["ext"]["approval"]["calls"] == [
        {"call_id": "c1", "tool": "delete", "input": {"path": "/tmp/x"}}]
    [end] = [e["payload"] for e in events if e["type"] == "tool.end"]
    if decision == "approve":
        assert (end["ok"], end["output"]) == (True, "deleted /tmp/x")
    else:
        assert (end["ok"], end["error"]) == (False, "This tool call is rejected.")
    assert [e["payload"]["tool"] for e in events if e["type"] == "tool.start"] == ["delete"]


async def test_an_exception_in_the_agent_ends_the_run_error_and_is_raised(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    run_id = unique("adk-error")
    failure = RuntimeError("model unavailable")
    agent = LlmAgent(name="broken", model=Scripted(turns=[failure]))
    with pytest.raises(RuntimeError, match="model unavailable") as raised:
        await google_adk.run(runner_of(agent), "hi", publisher=redis_publisher, run_id=run_id)
    assert raised.value is failure
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "error"]
    assert events[-1]["payload"]["reason"] == "RuntimeError: model unavailable"
