"""runwire.integrations.langgraph end to end: real LangGraph graphs driven by LangChain's offline
``GenericFakeChatModel``, published through the real pipeline (Redis bus, workers, edge) and read
back as an SSE client of the raw view, compared with what LangGraph itself returns."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from runwire.integrations import langgraph
from runwire.sdk.publisher import Publisher
from tests.e2e_harness import Pipeline, unique
from tests.integrations.conftest import (
    cancel_stops_it_within_a_second,
    control,
    own,
    read_run,
    states,
    text_of,
)

MODEL = "fake-model-1"


@pytest.fixture
async def redis_publisher(pipe: Pipeline) -> AsyncIterator[Publisher]:
    """A publisher on the bus itself (tests that need only one transport)."""
    async with Publisher.connect(pipe.url, linger_ms=1.0) as pub:
        yield pub


class ScriptedModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` whose stream also carries what its own stream leaves out: tool
    calls (as ``tool_call_chunks``), ``usage_metadata`` and the model's name, on the last chunk.
    Content is streamed word by word (a list of blocks: block by block); ``delay`` s between
    chunks."""

    delay: float = 0.0

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: Any = None, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        message = next(self.messages)
        assert isinstance(message, AIMessage)
        parts: list[Any] = (re.split(r"(\s)", message.content) if isinstance(message.content, str)
                            else [[block] for block in message.content])
        for part in parts:
            if part:
                await asyncio.sleep(self.delay)
                yield ChatGenerationChunk(message=AIMessageChunk(content=part, id=message.id))
        calls = [{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                 for i, c in enumerate(message.tool_calls)]
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="" if isinstance(message.content, str) else [], id=message.id,
            chunk_position="last", tool_call_chunks=calls, usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata))


def said(text: Any, *calls: tuple[str, str, dict[str, Any]], id: str, tokens: tuple[int, int] = (0, 0)
         ) -> AIMessage:
    """A scripted model response: content, tool calls ``(call_id, tool, args)``, usage."""
    usage = ({"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)}
             if any(tokens) else None)
    return AIMessage(content=text, id=id, tool_calls=[{"name": t, "args": a, "id": c} for c, t, a in calls],
                     usage_metadata=usage, response_metadata={"model_name": MODEL})


def react_graph(script: Callable[[], list[AIMessage]], tools: list[BaseTool], *, name: str = "LangGraph",
                handle_tool_errors: bool = True, delay: float = 0.0, checkpointer: Any = None) -> Any:
    """The classic agent loop: a model node and a ``ToolNode``, until the model stops calling tools."""
    model = ScriptedModel(messages=iter(script()), delay=delay).bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=handle_tool_errors))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(name=name, checkpointer=checkpointer)


def question(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text, id="question")]}


def plain(state: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A state's messages as what they say (ids of messages LangGraph numbers itself left out)."""
    return [(m.type, m.content, getattr(m, "tool_calls", None), getattr(m, "tool_call_id", None),
             getattr(m, "status", None), getattr(m, "usage_metadata", None)) for m in state["messages"]]


def children(events: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["child_id"] for e in events if e["type"] == "child.spawn"]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["type"] == kind]


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    get_stream_writer()({"progress": f"adding {a} and {b}"})
    return a + b


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
def broken(path: str) -> str:
    """A tool that fails."""
    raise ValueError(f"cannot open {path}")


def weather_script() -> list[AIMessage]:
    return [
        said([{"type": "reasoning", "reasoning": "Two tools. "}, {"type": "text", "text": "Let me check."}],
             ("c1", "add", {"a": 1, "b": 2}), ("c2", "lookup", {"city": "Oslo"}), id="m1", tokens=(12, 5)),
        said("It is sunny in Oslo and 1 + 2 = 3.", id="m2", tokens=(30, 11)),
    ]


async def test_text_tools_usage_and_state_as_langgraph_streams_and_returns_them(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("lg-basic")
    state = await langgraph.run(react_graph(weather_script, [add, lookup]), question("Weather?"),
                                publisher=publisher, run_id=run_id)
    expected = await react_graph(weather_script, [add, lookup]).ainvoke(question("Weather?"))
    assert plain(state) == plain(expected)

    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "done"]
    answers = [m for m in state["messages"] if isinstance(m, AIMessage)]
    assert text_of(events) == "".join(m.text for m in answers) == "Let me check.It is sunny in Oslo and 1 + 2 = 3."
    assert [p["text"] for p in of_type(events, "reasoning.delta")] == ["Two tools. "]
    calls = {c["id"]: c for m in answers for c in m.tool_calls}
    results = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    starts = {p["call_id"]: p for p in of_type(events, "tool.start")}
    ends = {p["call_id"]: p for p in of_type(events, "tool.end")}
    assert {k: (p["tool"], p["input"]) for k, p in starts.items()} == {
        k: (c["name"], c["args"]) for k, c in calls.items()}
    assert {k: p["output"] for k, p in ends.items()} == results == {"c1": "3", "c2": "sunny in Oslo"}
    assert all(p["ok"] and isinstance(p["duration_ms"], int) for p in ends.values())
    assert of_type(events, "x.usage") == [
        {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17, "model": MODEL},
        {"input_tokens": 30, "output_tokens": 11, "total_tokens": 41, "model": MODEL}]
    assert [p["step_kind"] for p in of_type(events, "step.boundary")] == ["tool-roundtrip", "text-only"]
    assert of_type(events, "x.langgraph.custom") == [{"data": {"progress": "adding 1 and 2"}}]
    order = [e["type"] for e in events if e["type"] in ("tool.start", "tool.end", "step.boundary")]
    assert order[:3] == ["step.boundary", "tool.start", "tool.start"]


async def test_a_failing_tool_ends_not_ok_with_its_error(pipe: Pipeline, publisher: Publisher) -> None:
    def script() -> list[AIMessage]:
        return [said("", ("c1", "broken", {"path": "/etc/x"}), id="m1"), said("It failed.", id="m2")]

    run_id = unique("lg-fail")
    state = await langgraph.run(react_graph(script, [broken]), question("Open it"),
                                publisher=publisher, run_id=run_id)
    failed = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert failed.status == "error"  # LangGraph turned the exception into a message for the model
    events = await read_run(pipe, run_id)
    (end,) = of_type(events, "tool.end")
    assert end["ok"] is False and end["error"] == failed.content
    assert "cannot open /etc/x" in end["error"] and "output" not in end
    assert text_of(events) == "It failed."
    assert states(events) == ["running", "done"]


def leaf(name: str, text: str, id: str) -> Any:
    """A one-node graph whose model says ``text``."""
    model = ScriptedModel(messages=iter([said(text, id=id)]))

    async def speak(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("speak", speak)
    graph.add_edge(START, "speak")
    return graph.compile(name=name)


async def test_subgraphs_two_deep_become_nested_child_runs(pipe: Pipeline, publisher: Publisher) -> None:
    async def lead(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Delegating. ", id="lead")]}

    inner = StateGraph(MessagesState)
    inner.add_node("plan", leaf("planner", "A plan. ", "plan"))  # a graph as a node: a subgraph
    inner.add_node("writer", leaf("writer", "Deep words.", "deep"))
    inner.add_edge(START, "plan")
    inner.add_edge("plan", "writer")
    graph = StateGraph(MessagesState)
    graph.add_node("lead", lead)
    graph.add_node("research", inner.compile(name="research"))
    graph.add_edge(START, "lead")
    graph.add_edge("lead", "research")

    run_id = unique("lg-sub")
    state = await langgraph.run(graph.compile(), question("Go"), publisher=publisher, run_id=run_id)
    assert [m.text for m in state["messages"][1:]] == ["Delegating. ", "A plan. ", "Deep words."]
    events = await read_run(pipe, run_id)
    (research,) = children(own(events))
    plan, writer = children(own(events, research))
    assert text_of(own(events)) == "Delegating. "
    assert text_of(own(events, research)) == ""
    assert text_of(own(events, plan)) == "A plan. "
    assert text_of(own(events, writer)) == "Deep words."
    assert children(own(events, plan)) == children(own(events, writer)) == []
    for child in (research, plan, writer):
        assert states(own(events, child)) == ["running", "done"]
        assert own(events, child)[0]["ext"]["agent"]["framework"] == "langgraph"
    names = {own(events, c)[0]["ext"]["agent"]["name"] for c in (research, plan, writer)}
    assert names == {"research", "plan", "writer"}
    assert text_of(events) == "Delegating. A plan. Deep words."  # each text once


async def test_run_inside_a_tool_is_a_child_run_at_any_depth(pipe: Pipeline, publisher: Publisher) -> None:
    @tool
    async def summarise(topic: str) -> str:
        """Ask the summariser."""
        result = await langgraph.run(summariser, question(topic), publisher=publisher)
        return str(result["messages"][-1].text)

    @tool
    async def fact(topic: str) -> str:
        """Ask the fact checker."""
        result = await langgraph.run(leaf("checker", "Checked.", "fact"), question(topic),
                                     publisher=publisher)
        return str(result["messages"][-1].text)

    summariser = react_graph(lambda: [said("", ("s1", "fact", {"topic": "tides"}), id="s1"),
                                      said("Tides are lunar.", id="s2")], [fact], name="summariser")
    lead = react_graph(lambda: [said("Asking. ", ("l1", "summarise", {"topic": "tides"}), id="l1"),
                                said("Done: tides are lunar.", id="l2")], [summarise], name="lead")
    run_id = unique("lg-nested")
    state = await langgraph.run(lead, question("Explain tides"), publisher=publisher, run_id=run_id)
    assert state["messages"][-1].text == "Done: tides are lunar."
    events = await read_run(pipe, run_id)
    (middle,) = children(own(events))
    (deepest,) = children(own(events, middle))
    assert {e.get("child_id") for e in events} == {None, middle, deepest}  # no doubled children
    assert text_of(own(events)) == "Asking. Done: tides are lunar."
    assert text_of(own(events, middle)) == "Tides are lunar."
    assert text_of(own(events, deepest)) == "Checked."
    assert of_type(own(events), "tool.end")[0]["output"] == "Tides are lunar."
    assert of_type(own(events, middle), "tool.end")[0]["output"] == "Checked."
    assert own(events, middle)[0]["ext"]["agent"]["name"] == "summariser"
    spawn = next(e for e in own(events) if e["type"] == "child.spawn")
    assert spawn["payload"]["prompt"] == "tides"
    for run in (middle, deepest):
        assert states(own(events, run)) == ["running", "done"]


async def test_run_inside_a_tool_of_a_subgraph_is_a_child_of_the_subgraphs_run(
    pipe: Pipeline, publisher: Publisher
) -> None:
    @tool
    async def check(claim: str) -> str:
        """Ask the checker."""
        result = await langgraph.run(leaf("checker", "True.", "check"), question(claim), publisher=publisher)
        return str(result["messages"][-1].text)

    team = react_graph(lambda: [said("", ("k1", "check", {"claim": "sky is blue"}), id="t1"),
                                said("Checked it.", id="t2")], [check], name="team")
    graph = StateGraph(MessagesState)
    graph.add_node("team", team)
    graph.add_edge(START, "team")
    run_id = unique("lg-subtool")
    await langgraph.run(graph.compile(), question("Is the sky blue?"), publisher=publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    (team_run,) = children(own(events))
    (checker,) = children(own(events, team_run))
    assert {e.get("child_id") for e in events} == {None, team_run, checker}
    assert text_of(own(events, team_run)) == "Checked it."
    assert text_of(own(events, checker)) == "True."
    assert of_type(own(events, team_run), "tool.end")[0]["output"] == "True."


async def test_a_clients_cancel_stops_the_graph_within_a_second(pipe: Pipeline, publisher: Publisher) -> None:
    started = asyncio.Event()
    stopped_at: list[float] = []

    @tool
    async def wait(seconds: int) -> str:
        """Wait."""
        started.set()
        try:
            await asyncio.sleep(seconds)
        finally:
            stopped_at.append(time.monotonic())
        return "waited"

    graph = react_graph(lambda: [said("Waiting.", ("w1", "wait", {"seconds": 60}), id="m1"),
                                 said("never", id="m2")], [wait])
    run_id = unique("lg-cancel")
    task = asyncio.create_task(langgraph.run(graph, question("Wait"), publisher=publisher, run_id=run_id))
    await asyncio.wait_for(started.wait(), 10)
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, stopped_at, run_id)
    assert text_of(events) == "Waiting."
    (end,) = of_type(events, "tool.end")
    assert end["call_id"] == "w1" and end["ok"] is False


async def first_child_text(pipe: Pipeline, run_id: str) -> str:
    """The id of the child run whose text the root's stream shows first, once published."""
    async with asyncio.timeout(10):
        while True:
            for event in await pipe.bus.read((run_id, "raw"), 0, 1000):
                if event.child_id is not None and getattr(event.payload, "text", None):
                    return str(event.child_id)
            await asyncio.sleep(0.05)


async def test_a_cancel_of_a_subgraphs_child_run_stops_the_graph_within_a_second(
    pipe: Pipeline, publisher: Publisher
) -> None:
    # 8,000 chunks, 20 ms apart: 160 s of streaming, so a pipeline slowed by a loaded machine
    # still has the graph running when the cancel is sent (it stops within a second of it).
    words = " ".join(f"w{i}" for i in range(4000))
    model = ScriptedModel(messages=iter([said(words, id="long")]), delay=0.02)
    stopped_at: list[float] = []

    async def speak(state: MessagesState) -> dict[str, Any]:
        try:
            return {"messages": [await model.ainvoke(state["messages"])]}
        finally:
            stopped_at.append(time.monotonic())

    team = StateGraph(MessagesState)
    team.add_node("speak", speak)
    team.add_edge(START, "speak")
    graph = StateGraph(MessagesState)
    graph.add_node("team", team.compile(name="team"))
    graph.add_edge(START, "team")
    run_id = unique("lg-subcancel")
    task = asyncio.create_task(langgraph.run(graph.compile(), question("Talk"), publisher=publisher,
                                             run_id=run_id))
    team_run = await first_child_text(pipe, run_id)  # the subgraph's run, streaming
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, stopped_at, run_id,
                                                   target=team_run, reason="stop the team")
    assert children(own(events)) == [team_run]
    assert states(own(events, team_run)) == ["running", "aborted"]
    assert states(own(events)) == ["running", "aborted"]  # the graph stopped: so did its run
    assert own(events)[-1]["payload"] == {"state": "aborted", "reason": "cancelled"}
    streamed = text_of(own(events, team_run))
    assert streamed and words.startswith(streamed) and len(streamed) < len(words)


async def awaiting_calls(pipe: Pipeline, run_id: str) -> list[dict[str, Any]]:
    """The calls of the run's first ``awaiting_approval`` not yet decided, once published."""
    async with asyncio.timeout(10):
        while True:
            for event in await pipe.bus.read((run_id, "raw"), 0, 1000):
                if event.child_id is None and getattr(event.payload, "state", None) == "awaiting_approval":
                    assert event.ext is not None
                    calls: list[dict[str, Any]] = event.ext["approval"]["calls"]
                    return calls
            await asyncio.sleep(0.05)


def approval_graph(deleted: list[str]) -> Any:
    def delete(state: MessagesState) -> dict[str, Any]:
        path = "/tmp/report.txt"
        if interrupt({"action": "delete", "path": path}):
            deleted.append(path)
            return {"messages": [AIMessage(f"Deleted {path}.", id="deleted")]}
        return {"messages": [AIMessage("Left it.", id="kept")]}

    graph = StateGraph(MessagesState)
    graph.add_node("delete", delete)
    graph.add_edge(START, "delete")
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("command", ["approve", "deny"])
async def test_an_interrupt_waits_for_the_clients_decision_and_resumes_with_it(
    pipe: Pipeline, redis_publisher: Publisher, command: str
) -> None:
    deleted: list[str] = []
    run_id = unique(f"lg-{command}")
    config = {"configurable": {"thread_id": run_id}}
    task = asyncio.create_task(langgraph.run(approval_graph(deleted), question("Clean up"),
                                             publisher=redis_publisher, run_id=run_id, config=config))
    (call,) = await awaiting_calls(pipe, run_id)
    assert call["tool"] == "delete" and call["input"] == {"action": "delete", "path": "/tmp/report.txt"}
    await control(pipe, run_id, command, call_id=call["call_id"])
    state = await asyncio.wait_for(task, 10)
    assert deleted == (["/tmp/report.txt"] if command == "approve" else [])
    said_last = "Deleted /tmp/report.txt." if command == "approve" else "Left it."
    assert state["messages"][-1].text == said_last
    assert "__interrupt__" not in state
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "awaiting_approval", "running", "done"]
    assert text_of(events) == said_last


async def test_an_answer_is_what_interrupt_returns(pipe: Pipeline, redis_publisher: Publisher) -> None:
    def ask(state: MessagesState) -> dict[str, Any]:
        name = interrupt("What is your name?")
        return {"messages": [AIMessage(f"Hello {name}.", id="hello")]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    run_id = unique("lg-answer")
    task = asyncio.create_task(langgraph.run(
        graph.compile(checkpointer=InMemorySaver()), question("Hi"), publisher=redis_publisher,
        run_id=run_id, config={"configurable": {"thread_id": run_id}}))
    (call,) = await awaiting_calls(pipe, run_id)
    assert call["input"] == "What is your name?"
    await control(pipe, run_id, "answer", call_id=call["call_id"], answer="Ada")
    state = await asyncio.wait_for(task, 10)
    assert state["messages"][-1].text == "Hello Ada."


async def test_without_a_checkpointer_an_interrupt_is_carried_and_returned_as_ainvoke_does(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    def ask(state: MessagesState) -> dict[str, Any]:
        interrupt("Sure?")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    compiled = graph.compile()
    run_id = unique("lg-nockpt")
    state = await langgraph.run(compiled, question("Hi"), publisher=redis_publisher, run_id=run_id)
    expected = await compiled.ainvoke(question("Hi"))
    assert [i.value for i in state["__interrupt__"]] == [i.value for i in expected["__interrupt__"]]
    assert plain(state) == plain(expected)
    events = await read_run(pipe, run_id)
    assert [p["data"]["value"] for p in of_type(events, "x.langgraph.interrupt")] == ["Sure?"]
    assert states(events) == ["running", "done"]


async def test_an_exception_in_the_graph_ends_the_run_in_error_and_is_raised(
    pipe: Pipeline, redis_publisher: Publisher
) -> None:
    graph = react_graph(lambda: [said("Trying.", ("c1", "broken", {"path": "/x"}), id="m1")], [broken],
                        handle_tool_errors=False)
    run_id = unique("lg-error")
    with pytest.raises(ValueError, match="cannot open /x"):
        await langgraph.run(graph, question("Open"), publisher=redis_publisher, run_id=run_id)
    events = await read_run(pipe, run_id)
    (end,) = of_type(events, "tool.end")
    assert end["ok"] is False and end["error"] == "ValueError: cannot open /x"
    assert states(events) == ["running", "error"]
    assert events[-1]["payload"]["reason"] == "ValueError: cannot open /x"
