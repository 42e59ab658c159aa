"""``GET /v1/runs/{run_id}/spans``: the derivation the timeline draws and the exporter sends."""

from __future__ import annotations

import httpx
import msgspec

from runwire.bus.base import Bus
from runwire.jobs.spans import Span, derive_spans
from runwire.store.base import ReplayLog
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
    assert live["last_seq"] == 12
    assert sorted(s["name"] for s in live["spans"] if "end_ts" not in s) == ["invoke_agent planner",
                                                                            "invoke_agent researcher"]
    assert ended["trace_id"] == derive_spans(ROOT, events)[0].trace_id
    assert msgspec.convert(ended["spans"], list[Span]) == derive_spans(ROOT, events)
