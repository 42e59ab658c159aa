"""The demo's framework agent (``runwire up --demo`` with pydantic-ai installed): a real
pydantic-ai run on its offline model, published through the integration — reasoning, a tool
call whose tool delegates to a second agent (a child run), the answer — under the demo tenant."""

from __future__ import annotations

import asyncio
from typing import Any

from runwire.integrations.demo import framework_runs
from runwire.jobs.demo import DEMO_TENANT
from runwire.sdk.publisher import Publisher
from tests.e2e_harness import Pipeline
from tests.integrations.conftest import own, read_run, states, text_of
from tests.waiting import until


async def test_the_demo_triage_agent_publishes_a_tree_with_a_tool_and_a_child_run(
    pipe: Pipeline, publisher: Publisher
) -> None:
    stop = asyncio.Event()
    started = await framework_runs(publisher, stop, pace=0.0, limit=1)
    assert started == 1
    await publisher.flush()  # on the bus: the worker writes it to the replay log a moment later

    async def roots() -> list[Any]:
        return [r for r in await pipe.store.runs(tenant=DEMO_TENANT, limit=10) if r.parent_id is None]

    runs = await until(roots, what="the demo's run in the replay log")
    assert len(runs) == 1
    events = await read_run(pipe, runs[0].run_id)
    assert states(own(events)) == ["running", "done"]
    assert text_of(own(events)).startswith("The ") and "deploy" in text_of(own(events))
    assert any(e["type"] == "reasoning.delta" for e in own(events))
    spawned = [e["payload"]["child_id"] for e in own(events) if e["type"] == "child.spawn"]
    assert len(spawned) == 1
    assert "timeouts" in text_of(own(events, spawned[0]))
    tool_end = next(e["payload"] for e in own(events) if e["type"] == "tool.end")
    assert tool_end["ok"] is True and "timeouts" in tool_end["output"]
    assert all(e.get("tenant") in (None, DEMO_TENANT) for e in events)
