"""A framework event with no runwire type is carried, not dropped: ``x.<framework>.<kind>``
with the framework's value in ``payload.data`` survives the replay log's JSONL export and every
egress format that has a custom/data event (``docs/protocols.md``: Cogency has none and writes
no ``x.*`` event; StreamWeave is a progress view computed from the run's events)."""

from __future__ import annotations

import httpx
import pytest

from runwire import protocols
from runwire.integrations.agentrun import AgentRun
from runwire.sdk.publisher import Publisher
from tests.e2e_harness import Pipeline, unique, wait_for_terminal
from tests.integrations.conftest import read_run

MARK = "carried-7c1e"
WITHOUT_EXTENSIONS = {"cogency", "streamweave"}
"""Formats that write no ``x.*`` event (docs/protocols.md § Egress: cogency, streamweave)."""


async def test_a_carried_framework_event_survives_export_and_every_format(
    pipe: Pipeline, publisher: Publisher
) -> None:
    run_id = unique("carry")
    async with AgentRun(publisher, run_id, framework="langgraph") as run:
        await run.carry("custom", {"progress": MARK, "step": 3})
        await run.text("ok")
    events = await read_run(pipe, run_id)
    carried = [e for e in events if e["type"] == "x.langgraph.custom"]
    assert [e["payload"] for e in carried] == [{"data": {"progress": MARK, "step": 3}}]
    await wait_for_terminal(pipe.store, run_id)
    async with httpx.AsyncClient(base_url=pipe.edge.url, timeout=30) as http:
        exported = await http.get(f"/v1/runs/{run_id}/events.jsonl")
        assert exported.status_code == 200 and MARK in exported.text
        for name in sorted(protocols.EGRESS):
            body = await http.get(f"/v1/runs/{run_id}/stream?detail=full&format={name}",
                                  headers={"Accept": "application/x-ndjson"})
            assert body.status_code == 200, (name, body.text[:200])
            assert (MARK in body.text) is (name not in WITHOUT_EXTENSIONS), name


@pytest.mark.parametrize("name", sorted(WITHOUT_EXTENSIONS))
def test_the_formats_said_to_drop_extensions_are_still_egress_formats(name: str) -> None:
    assert name in protocols.EGRESS
