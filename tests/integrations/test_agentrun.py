"""What every framework integration shares (:mod:`runwire.integrations.agentrun`), end to end:
nested runs become child runs, a client's cancel and approvals reach the agent on any bus
(``http://`` included), and tool calls are paired, timed and bounded."""

from __future__ import annotations

import asyncio
import time

from runwire.core import limits
from runwire.integrations.agentrun import AgentRun
from runwire.integrations.values import TRUNCATED
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


async def test_a_run_opened_inside_another_is_its_child_at_any_depth(
    pipe: Pipeline, publisher: Publisher
) -> None:
    root = unique("nest")
    async with AgentRun(publisher, root, framework="test", name="lead") as lead:
        await lead.text("delegating. ")
        async with AgentRun(publisher, framework="test", name="helper") as helper:
            await helper.text("helping. ")
            async with AgentRun(publisher, framework="test") as deepest:
                await deepest.text("deep.")
        await lead.text("done.")
    events = await read_run(pipe, root)
    assert text_of(own(events)) == "delegating. done."
    spawned = [e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn"]
    assert spawned == [helper.run_id]
    assert text_of(own(events, helper.run_id)) == "helping. "
    assert text_of(own(events, deepest.run_id)) == "deep."
    assert [e["payload"]["child_id"] for e in own(events, helper.run_id)
            if e["type"] == "child.spawn"] == [deepest.run_id]
    assert states(own(events)) == ["running", "done"]
    assert states(own(events, deepest.run_id)) == ["running", "done"]
    first = own(events)[0]
    assert first["ext"] == {"agent": {"framework": "test", "name": "lead"}}


async def test_a_clients_cancel_stops_the_agent_within_a_second_on_any_bus(
    pipe: Pipeline, publisher: Publisher
) -> None:
    """Koder agent stream: a cancel is a command, not a disconnect; the run ends ``aborted``
    with the client's reason and the agent's task sees ``CancelledError``."""
    run_id = unique("cancel")
    started = asyncio.Event()
    stopped_at: list[float] = []

    async def agent() -> None:
        async with AgentRun(publisher, run_id, framework="test") as run:
            await run.tool_start("c1", "sleep", {"seconds": 60})
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                stopped_at.append(time.monotonic())

    task = asyncio.create_task(agent())
    await started.wait()
    events = await cancel_stops_it_within_a_second(pipe, publisher, task, stopped_at, run_id)
    ends = [e for e in events if e["type"] == "tool.end"]
    assert [(e["payload"]["call_id"], e["payload"]["ok"]) for e in ends] == [("c1", False)]


async def test_an_approval_from_a_client_reaches_the_waiting_agent(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("approve")
    async with AgentRun(publisher, run_id, framework="test") as run:
        waiting = asyncio.create_task(run.awaiting([
            {"call_id": "c1", "tool": "delete_file", "input": {"path": "/tmp/x"}},
            {"call_id": "c2", "tool": "send_mail", "input": {"to": "a@b.c"}},
        ]))
        await publisher.flush()
        await control(pipe, run_id, "deny", call_id="c2", reason="not now")
        await control(pipe, run_id, "approve", call_id="c1")
        decisions = await asyncio.wait_for(waiting, 10)
    assert decisions["c1"].approved and not decisions["c2"].approved
    assert decisions["c2"].reason == "not now"
    events = await read_run(pipe, run_id)
    assert states(events) == ["running", "awaiting_approval", "running", "done"]
    waiting_event = next(e for e in events if e["payload"].get("state") == "awaiting_approval")
    assert [c["call_id"] for c in waiting_event["ext"]["approval"]["calls"]] == ["c1", "c2"]


async def test_tool_values_that_are_not_json_or_too_large_are_converted_and_cut(
    pipe: Pipeline, publisher: Publisher
) -> None:
    import datetime as dt
    from dataclasses import dataclass

    @dataclass
    class Query:
        text: str
        at: dt.datetime

    run_id = unique("values")
    async with AgentRun(publisher, run_id, framework="test") as run:
        await run.tool_start("c1", "search", Query("x", dt.datetime(2026, 1, 2, 3, 4, 5)))
        await run.tool_end("c1", ok=True, output=b"\x00\x01")
        await run.tool_start("c2", "dump")
        await run.tool_end("c2", ok=True, output="y" * (limits.TOOL_VALUE_BYTES + 10))
        await run.tool_end("c3", ok=False, error=ValueError("boom"), tool="lookup")
        await run.tool_start("c4", "echo", {"q\udfff": ["a\ud800b"]})  # lone surrogates
    events = await read_run(pipe, run_id)
    starts = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.start"}
    ends = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.end"}
    assert starts["c1"]["input"] == {"text": "x", "at": "2026-01-02T03:04:05"}
    assert ends["c1"]["output"] == {"$bytes": "AAE=", "size": 2}
    assert ends["c2"]["output"][TRUNCATED] is True
    assert ends["c2"]["output"]["size"] == limits.TOOL_VALUE_BYTES + 12
    assert starts["c3"]["tool"] == "lookup" and ends["c3"]["ok"] is False
    assert starts["c4"]["input"] == {"q\ufffd": ["a\ufffdb"]}
    assert all(isinstance(e["duration_ms"], int) for e in ends.values())
    assert states(events) == ["running", "done"]


async def test_what_a_framework_hands_over_whole_never_stops_the_agent(
    pipe: Pipeline, publisher: Publisher
) -> None:
    """A 2 MB text (one LangGraph message, an ADK final text) is published in order as several
    deltas; a prompt of a sub-agent is cut for display; an event over the frame limit is refused,
    counted and logged — and the run goes on to its end."""
    run_id = unique("big")
    text = "".join(f"{i:07d} " for i in range(250_000))  # 2 MB
    async with AgentRun(publisher, run_id, framework="test") as run:
        await run.text(text)
        async with AgentRun(publisher, framework="test", prompt="p" * 100_000) as helper:
            await helper.text("ok")
        await run.emit("x.test.blob", {"data": "z" * (limits.FRAME_BYTES + 1)})
        await run.text("a lone surrogate \ud800")  # no UTF-8 encodes it: refused, no seq taken
        assert run.delta_now("text.delta", "\udfff")
        await run.text("after")
    assert run.refused == 3
    events = await read_run(pipe, run_id)
    assert text_of(own(events)) == text + "after"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # no gap (a child's fanned in)
    spawn = next(e["payload"] for e in own(events) if e["type"] == "child.spawn")
    assert spawn["prompt"] == "p" * 4096
    assert states(own(events)) == ["running", "done"]
