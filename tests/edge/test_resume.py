"""Exact resume: hot tier, replay log, the seam race, and a cursor older than retention (CONN-0002)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.store.base import ReplayLog
from tests.events import event
from tests.waiting import until

from .harness import append, decoded, read_sse, run_events, serve_edge


@pytest.fixture(params=["memory", "redis"])
async def short_bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """A bus whose delivery streams keep only their last few events (a trimmed hot tier);
    Redis trims approximately (whole stream nodes of 100 entries)."""
    base = "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")
    async with open_bus(base + ("&" if "?" in base else "?") + "maxlen=5") as opened:
        yield opened


async def test_resume_from_the_replay_log_after_the_hot_tier_was_trimmed(
    short_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Koder agent stream §7 T3 when the hot tier no longer has seq+1: history comes from the replay log, then live."""
    events = run_events(run_id, 1000)
    await store.append(events)
    await append(short_bus, run_id, events)
    bounds = await short_bus.bounds((run_id, "raw"))
    assert bounds is not None and bounds[0] > 11 and bounds[1] == 1000
    async with serve_edge(short_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream(
            "GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full", headers={"Last-Event-ID": "10"}
        ) as response:
            got, _ = await read_sse(response)
        metrics = (await http.get(f"{edge.url}/metrics")).text
    assert [int(e.id or 0) for e in got] == list(range(11, 1001))
    assert 'runwire_edge_resumes_total{source="log"} 1.0' in metrics


async def test_a_cursor_older_than_retention_gets_conn_0002_then_the_stream_closes(
    short_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """KAI-STREAM-CONN-0002 — an explicit error, never a silent hang, never a partial replay."""
    await append(short_bus, run_id, run_events(run_id, 1000, end=None))
    async with serve_edge(short_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream(
            "GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full", headers={"Last-Event-ID": "3"}
        ) as response:
            got, _ = await asyncio.wait_for(read_sse(response), 5)
    body = decoded(got)
    assert body == [
        {"type": "error", "code": "KAI-STREAM-CONN-0002", "message": body[0]["message"]}
    ]
    assert "seq 3" in body[0]["message"]


async def test_the_seam_race_events_appended_during_catch_up_are_neither_lost_nor_duplicated(
    short_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """The seam between history and live: capture the position, buffer live events while history is read, dedupe on seq."""
    history = run_events(run_id, 3000, end=None)
    await store.append(history)
    await append(short_bus, run_id, history)
    total = 3400

    async def produce() -> None:
        for seq in range(3001, total):
            batch = [event(run_id, seq)]
            await store.append(batch)
            await append(short_bus, run_id, batch)
            if seq % 10 == 0:
                await asyncio.sleep(0)
        end = [event(run_id, total, "run.lifecycle", {"state": "done"})]
        await store.append(end)
        await append(short_bus, run_id, end)

    async with serve_edge(short_bus, store) as edge, httpx.AsyncClient(timeout=30) as http:
        clients = []
        for _ in range(3):
            request = http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full")
            clients.append(request)
        producer = asyncio.create_task(produce())

        async def one(request: object) -> list[int]:
            async with request as response:  # type: ignore[attr-defined]
                got, _ = await read_sse(response)
            return [int(e.id or 0) for e in got]

        results = await asyncio.wait_for(asyncio.gather(*(one(r) for r in clients)), 30)
        await producer
    for seqs in results:
        assert seqs == list(range(1, total + 1))


@pytest.mark.slow
async def test_t3_on_kafka_resume_on_another_edge_instance(
    kafka_url: str, store: ReplayLog, run_id: str
) -> None:
    """T3 on Kafka: each edge process has its own hot cache of the delivery topic; a client of
    edge A resumes on edge B at seq+1, with what B's cache lacks coming from the replay log."""
    first, rest = run_events(run_id, 13)[:10], run_events(run_id, 13)[10:]
    async with open_bus(kafka_url) as writer, open_bus(kafka_url) as bus_a, open_bus(kafka_url) as bus_b:
        await store.append(first)
        await append(writer, run_id, first)
        async with serve_edge(bus_a, store) as edge_a, serve_edge(bus_b, store) as edge_b:
            async with httpx.AsyncClient(timeout=20) as http:
                url = f"/v1/runs/{run_id}/stream?detail=full"
                async with http.stream("GET", edge_a.url + url) as response:
                    seen, _ = await asyncio.wait_for(read_sse(response, limit=6), 20)
                assert [e.id for e in seen] == ["1", "2", "3", "4", "5", "6"]

                async def produce() -> None:
                    await until(lambda: edge_b.live_clients(run_id) == 1, what="the client on edge B")
                    await store.append(rest)
                    await append(writer, run_id, rest)

                producer = asyncio.create_task(produce())
                async with http.stream("GET", edge_b.url + url, headers={"Last-Event-ID": "6"}) as response:
                    resumed, _ = await asyncio.wait_for(read_sse(response), 20)
                await producer
    assert [int(e.id or 0) for e in resumed] == list(range(7, 14))


async def test_a_shaped_client_joining_before_the_shaped_stream_exists_sees_spans_that_tile(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Koder agent stream §7 T2 on the shaped view: a worker may write a write's replay-log rows before
    its delivery streams, so a client can arrive while the log has raw seqs 1..2 and the shaped
    stream does not exist yet. The raw log's last seq is no window boundary of a live run: starting
    there would send a shaped delta ``[2, 2]`` recomputed from the log, and then the worker's own
    window ``[2, 4]`` — two events claiming seq 2."""
    raw = [
        event(run_id, 1, "run.lifecycle", {"state": "running"}),
        *(event(run_id, seq, "text.delta", second=1 + seq / 1000) for seq in (2, 3, 4)),
        event(run_id, 5, "run.lifecycle", {"state": "done"}, second=2),
    ]
    await store.append(raw[:2])
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream") as response:
            await store.append(raw[2:])
            window = event(run_id, 4, "text.delta", {"text": "t2t3t4"}, second=1.004, span=(2, 4))
            await append(bus, run_id, raw, "raw")
            await append(bus, run_id, [raw[0], window, raw[4]], "shaped")
            got, _ = await asyncio.wait_for(read_sse(response), 5)
    body = decoded(got)
    assert [(e["seq"], e.get("span")) for e in body] == [(1, None), (4, [2, 4]), (5, None)]
