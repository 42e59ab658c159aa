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
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.jobs.demo import publish_runs
from runwire.processing.shaping import DeltaCoalescer, shape
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from runwire.workers.runtime import run_worker
from tests.bus.conftest import serving_redis_cluster_url  # noqa: F401  (the fixture)
from tests.shaped_checks import as_dicts, r1_excess, t2_problems, texts

from .harness import decoded, read_sse, serve_edge

RUNS = 5
JOIN_AT = (0, 45, 90)
"""Raw events of the run already delivered when each client joins (0: before the run starts)."""


async def sse_frames(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """An SSE body's events as they arrive (decoded ``data:`` lines)."""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            yield msgspec.json.decode(line[5:].strip())


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


async def demo_clients(bus: Bus, edge_buses: list[Bus], store: ReplayLog) -> None:
    """The demo's runs through a worker on ``bus`` and one edge per bus of ``edge_buses``; shaped
    SSE clients join each run (turn about on the edges) before it starts and mid-run."""
    prefix = f"d{uuid.uuid4().hex[:8]}"
    run_ids = [f"{prefix}-{n + 1:04d}" for n in range(RUNS)]
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(bus, store, group="demo", name="w1", stop=stop))
    try:
        async with contextlib.AsyncExitStack() as stack:
            edges = [await stack.enter_async_context(serve_edge(b, store)) for b in edge_buses]
            clients = {
                (run_id, join_at): asyncio.create_task(shaped_client(
                    bus, store, edges[index % len(edges)].url, run_id, join_at
                ))
                for index, (run_id, join_at) in enumerate(
                    (run_id, join_at) for run_id in run_ids for join_at in JOIN_AT
                )
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


async def test_shaped_clients_joining_the_demo_runs_get_every_character_once(
    bus: Bus, store: ReplayLog
) -> None:
    """In-process bus and Redis: one worker, one edge."""
    await demo_clients(bus, [bus], store)


@pytest.mark.slow
async def test_shaped_clients_of_two_edges_on_a_redis_cluster_get_every_character_once(
    serving_redis_cluster_url: str, store: ReplayLog,  # noqa: F811  (the imported fixture)
) -> None:
    """A Redis Cluster, the worker and two edges each on a connection of its own (as separate
    processes would be); the clients of each run take turns between the edges."""
    url = f"{serving_redis_cluster_url}?prefix=t{uuid.uuid4().hex[:10]}"
    async with open_bus(url) as bus, open_bus(url) as edge_a, open_bus(url) as edge_b:
        await demo_clients(bus, [edge_a, edge_b], store)


def long_run(run_id: str, count: int) -> list[Event]:
    """A parent's raw view: two children's deltas 25 ms apart (both types), a tool call of the run
    every 40 events, then the end."""
    base = 1_700_000_000_000
    out: list[Event] = []
    for seq in range(1, count + 1):
        ts = envelope.format_ts(datetime.fromtimestamp((base + seq * 25) / 1000, UTC))
        child: str | None = None
        if seq == count:
            kind, payload = "run.lifecycle", {"state": "done"}
        elif seq % 40 == 1:
            kind, payload = "tool.start", {"call_id": f"c{seq}", "tool": "t"}
        else:
            kind = "text.delta" if (seq // 7) % 2 else "reasoning.delta"
            payload, child = {"text": f"{seq};"}, f"{run_id}.c{seq % 2}"
        out.append(envelope.make(kind, payload, id=f"01J{seq:023d}", ts=ts, run_id=run_id, seq=seq,
                                 child_id=child))
    return out


async def test_a_real_hole_is_filled_from_the_log_at_the_cost_of_the_gap(
    store: ReplayLog, run_id: str
) -> None:
    """A burst longer than the hot tier's ``maxlen`` between two reads of the edge trims the shaped
    view past a live client's position. The edge recomputes just that stretch from the replay log
    (from the last control event before it, §4 R3), not the run: the client gets the shaped view
    whole, each event once (T2), and the log is read for about the gap's length."""
    raw = long_run(run_id, 12_000)
    coalescer = DeltaCoalescer()
    live = [[e for event in part for e in coalescer.feed(event)] for part in (raw[:10_000], raw[10_000:11_000])]
    live.append([e for event in raw[11_000:] for e in coalescer.feed(event)] + coalescer.flush())
    assert sum(live, []) == shape(raw)
    read = [0]
    plain_read = store.read

    async def counted(run: str, after: int = 0, limit: int | None = None) -> list[Event]:
        events = await plain_read(run, after, limit)
        read[0] += len(events)
        return events

    plain_iter = store.iter_events

    async def counted_iter(run: str, after: int = 0, batch: int = 5000) -> AsyncIterator[Event]:
        async for event in plain_iter(run, after, batch):
            read[0] += 1
            yield event

    store.read = counted  # type: ignore[method-assign]
    store.iter_events = counted_iter  # type: ignore[method-assign]
    async with open_bus("memory://?maxlen=50") as bus, serve_edge(bus, store) as edge:
        got: list[dict[str, Any]] = []
        arrived = asyncio.Event()

        async def client() -> None:
            async with httpx.AsyncClient(timeout=30) as http, http.stream(
                "GET", f"{edge.url}/v1/runs/{run_id}/stream"
            ) as response:
                async for frame in sse_frames(response):
                    got.append(frame)
                    arrived.set()

        async def until(seq: int) -> None:
            async with asyncio.timeout(20):
                while not got or got[-1]["seq"] < seq:
                    arrived.clear()
                    await arrived.wait()

        for index, (lo, hi) in enumerate(((0, 10_000), (10_000, 11_000), (11_000, 12_000))):
            await store.append(raw[lo:hi])
            await bus.append((run_id, "raw"), raw[lo:hi])
            await bus.append((run_id, "shaped"), live[index])  # one append: the hot tier keeps 50
            if index == 0:
                reader = asyncio.create_task(client())
                await until(live[0][-1].seq)
                read[0] = 0  # what the client's own catch-up read is not the hole's
            if index == 1:
                await until(live[1][-1].seq)
                hole = read[0]
        async with asyncio.timeout(20):
            await reader
    assert got == as_dicts(shape(raw))
    assert t2_problems(got) == []
    assert 0 < hole < 1_500, hole  # the gap is 1,000 raw events; the run before it 10,000


@pytest.mark.parametrize("short", [False, True])
async def test_t2_holds_on_resume_from_any_seq(store: ReplayLog, run_id: str, short: bool) -> None:
    """Koder agent stream §7 T3 and T2 on the shaped view: ``Last-Event-ID: N`` for cursors all
    over the run — shaped seqs and raw seqs inside windows — gets exactly the shaped view after N,
    whose first event starts at or before N + 1 and the rest tile on. With a short hot tier the
    history comes from the replay log, recomputed from the last control event before N."""
    raw = long_run(run_id, 1_200)
    shaped = shape(raw)
    await store.append(raw)
    async with open_bus("memory://?maxlen=40" if short else "memory://") as bus:
        await bus.append((run_id, "raw"), raw)
        await bus.append((run_id, "shaped"), shaped)
        cursors = sorted({*(e.seq for e in shaped[::23]), *range(0, 1_200, 97), 1_199})
        async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=30) as http:
            for cursor in cursors:
                async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream",
                                       headers={"Last-Event-ID": str(cursor)}) as response:
                    got = [frame async for frame in sse_frames(response)]
                assert got == as_dicts([e for e in shaped if e.seq > cursor]), cursor
                assert t2_problems(got, after=cursor) == [], cursor
