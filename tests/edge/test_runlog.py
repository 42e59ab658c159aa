"""``GET /v1/runs/{run_id}/spans``: the derivation the timeline draws and the exporter sends."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from runwire.bus.base import Bus
from runwire.edge.http import runlog
from runwire.jobs.spans import Span, derive_spans
from runwire.store.base import ReplayLog
from tests.events import event
from tests.jobs.traced import ROOT, traced_run

from .harness import serve_edge


async def test_the_edge_serves_a_runs_span_tree_as_the_exporter_derives_it(memory_bus: Bus, store: ReplayLog) -> None:
    events = traced_run()
    await store.append(events[:12])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        live = (await http.get(f"{edge.url}/v1/runs/{ROOT}/spans")).json()
        await store.append(events[12:])
        ended = (await http.get(f"{edge.url}/v1/runs/{ROOT}/spans")).json()
        missing = await http.get(f"{edge.url}/v1/runs/nope/spans")
    assert missing.status_code == 404
    # while it runs: what is open has no end yet
    assert live["last_seq"] == 12 and live["truncated"] is False and ended["truncated"] is False
    assert sorted(s["name"] for s in live["spans"] if "end_ts" not in s) == ["invoke_agent planner",
                                                                            "invoke_agent researcher"]
    assert ended["trace_id"] == derive_spans(ROOT, events)[0].trace_id
    assert msgspec.convert(ended["spans"], list[Span]) == derive_spans(ROOT, events)


async def test_a_long_runs_tree_is_cut_short_and_says_so(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The edge derives at most so many spans (and events) of a run, however often the page asks:
    past that the answer is the run's first spans, marked truncated, and stays so as the run grows."""
    monkeypatch.setattr(runlog, "MAX_SPANS", 5)
    calls = [event("long", 1, "run.lifecycle", {"state": "running"}, second=0)]
    for n in range(10):
        calls.append(event("long", 2 * n + 2, "tool.start", {"call_id": f"c{n}", "tool": "t"}, second=2 * n + 1))
        calls.append(event("long", 2 * n + 3, "tool.end", {"call_id": f"c{n}", "ok": True}, second=2 * n + 2))
    await store.append(calls[:7])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        short = (await http.get(f"{edge.url}/v1/runs/long/spans")).json()
        await store.append(calls[7:])
        cut = (await http.get(f"{edge.url}/v1/runs/long/spans")).json()
        await store.append([event("long", 22, "run.lifecycle", {"state": "done"}, second=30)])
        later = (await http.get(f"{edge.url}/v1/runs/long/spans")).json()
    assert short["truncated"] is False and len(short["spans"]) == 4  # the run and three calls
    assert cut["truncated"] is True and len(cut["spans"]) == 5
    assert [s["name"] for s in cut["spans"]] == ["invoke_agent"] + ["execute_tool t"] * 4
    assert cut["spans"][1]["attributes"]["gen_ai.tool.call.id"] == "c0"
    assert later == cut
