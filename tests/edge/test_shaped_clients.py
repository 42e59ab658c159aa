"""Live shaped clients of the demo's runs: every character exactly once, spans that tile (T2).

The demo's runs have two children streaming at once, so the windows of a parent's shaped view
interleave in seq space. Clients on the default (shaped) SSE view join each run before it starts,
while its children stream, and again later, over a worker and an edge sharing the in-process bus
or Redis. Each must see the shaped view Koder agent stream §7 T2 describes — every ``span[0]`` the
previous event's seq + 1 — and each (child, type)'s text exactly as the raw view has it: the edge
never takes interleaved windows for a hole, so it never sends a window twice (§4 R1).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from pipeline.bus.base import Bus
from pipeline.demo import publish_runs
from pipeline.publisher import Publisher
from pipeline.store.base import ReplayLog
from tests.shaped_checks import as_dicts, r1_excess, t2_problems, texts
from workers.runtime import run_worker

from .harness import decoded, read_sse, serve_edge

RUNS = 5
JOIN_AT = (0, 45, 90)
"""Raw events of the run already delivered when each client joins (0: before the run starts)."""


async def shaped_client(
    bus: Bus, store: ReplayLog, url: str, run_id: str, join_at: int
) -> list[dict[str, Any]]:
    """Join the run's default view once its raw view has ``join_at`` events (or the run ended:
    an aborted run is short); read it to its end."""
    async with asyncio.timeout(60):
        while join_at:
            bounds = await bus.bounds((run_id, "raw"))
            if bounds and bounds[1] >= join_at:
                break
            info = await store.run(run_id)
            if info is not None and info.terminal:
                break
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=60) as http, http.stream(
            "GET", f"{url}/v1/runs/{run_id}/stream"
        ) as response:
            assert response.status_code == 200, response.status_code
            events, _ = await read_sse(response)
    return decoded(events)


async def test_shaped_clients_joining_the_demo_runs_get_every_character_once(
    bus: Bus, store: ReplayLog
) -> None:
    prefix = f"d{uuid.uuid4().hex[:8]}"
    run_ids = [f"{prefix}-{n + 1:04d}" for n in range(RUNS)]
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(bus, store, group="demo", name="w1", stop=stop))
    try:
        async with serve_edge(bus, store) as edge:
            clients = {
                (run_id, join_at): asyncio.create_task(
                    shaped_client(bus, store, edge.url, run_id, join_at)
                )
                for run_id in run_ids for join_at in JOIN_AT
            }
            async with Publisher(bus) as publisher:
                started = await publish_runs(
                    publisher, asyncio.Event(), rate=4.0, pace=0.01, prefix=prefix, limit=RUNS
                )
            assert started == RUNS
            got = {key: await task for key, task in clients.items()}
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    for (run_id, join_at), events in got.items():
        raw = as_dicts(await store.read(run_id))
        assert raw and raw[-1]["type"] == "run.lifecycle", run_id
        assert t2_problems(events) == [], (run_id, join_at)
        assert texts(events) == texts(raw), (run_id, join_at)
        assert r1_excess(events) == [], (run_id, join_at)
        assert [e["seq"] for e in events if e["type"] not in ("reasoning.delta", "text.delta")] == [
            e["seq"] for e in raw if e["type"] not in ("reasoning.delta", "text.delta")
        ]
