"""The stream endpoint: SSE, NDJSON, WebSocket; T3 resume; keepalive; the stream ends with the run."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httpx
import msgspec
import pytest
import websockets

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.core.envelope import now_ts
from runwire.edge import EdgeSettings
from runwire.edge.service.context import Edge
from runwire.store.base import ReplayLog
from tests.events import event
from tests.services import RedisServer

from .harness import EdgeServer, append, decoded, read_sse, run_events, serve_edge


async def test_sse_serves_the_run_with_seq_ids_and_ends_after_the_terminal_event(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Koder agent stream §5.1: one event per ``data:`` line, ``id:`` = seq; the stream closes after the run's terminal event."""
    await append(bus, run_id, run_events(run_id, 6))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events, _ = await read_sse(response)
    assert [e.id for e in events] == ["1", "2", "3", "4", "5", "6"]
    body = decoded(events)
    assert [e["seq"] for e in body] == [1, 2, 3, 4, 5, 6]
    assert body[-1]["payload"]["state"] == "done"


async def test_t3_reconnect_with_last_event_id_gets_exactly_the_events_after_it(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """T3 — Reconnect: send Last-Event-ID, get events ≥ seq+1 (and nothing before)."""
    await append(bus, run_id, run_events(run_id, 20))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        async with http.stream("GET", url, headers={"Last-Event-ID": "7"}) as response:
            events, _ = await read_sse(response)
        async with http.stream("GET", url + "&after=15") as response:
            by_query, _ = await read_sse(response)
    assert [int(e.id or 0) for e in events] == list(range(8, 21))
    assert [int(e.id or 0) for e in by_query] == list(range(16, 21))


async def test_t3_resume_on_a_second_edge_instance_sharing_the_bus_and_store(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """T3 across instances: a client that read from edge A resumes on edge B at seq+1 (resume needs only shared state)."""
    await append(bus, run_id, run_events(run_id, 10, end=None))
    async with serve_edge(bus, store) as first, serve_edge(bus, store) as second:
        async with httpx.AsyncClient(timeout=10) as http:
            async with http.stream("GET", f"{first.url}/v1/runs/{run_id}/stream?detail=full") as response:
                seen, _ = await read_sse(response, limit=6)
            last_id = seen[-1].id
            assert last_id == "6"
            await append(bus, run_id, run_events(run_id, 3, start=11, end="done"))
            async with http.stream(
                "GET", f"{second.url}/v1/runs/{run_id}/stream?detail=full",
                headers={"Last-Event-ID": last_id},
            ) as response:
                rest, _ = await read_sse(response)
    assert [int(e.id or 0) for e in rest] == list(range(7, 14))


async def test_live_events_reach_a_connected_client_and_the_stream_ends_at_done(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Events appended after the client connected are delivered live, in order; ``done`` closes the stream."""
    await append(bus, run_id, run_events(run_id, 2, end=None))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async def produce() -> None:
            for seq in range(3, 30):
                await asyncio.sleep(0.005)
                await append(bus, run_id, [event(run_id, seq)])
            await append(bus, run_id, [event(run_id, 30, "run.lifecycle", {"state": "done"})])

        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
            producer = asyncio.create_task(produce())
            events, _ = await asyncio.wait_for(read_sse(response), 10)
            await producer
    assert [int(e.id or 0) for e in events] == list(range(1, 31))


async def test_keepalive_comment_on_an_idle_stream(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """Koder agent stream §5.1: ``: keepalive`` on an idle stream (interval shortened for the test)."""
    await append(memory_bus, run_id, run_events(run_id, 2, end=None))
    settings = EdgeSettings(keepalive_s=0.2)
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream") as response:
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line == ": keepalive" and lines.count(": keepalive") >= 2:
                    break
    assert lines.count(": keepalive") == 2


async def test_ndjson_by_accept_header(bus: Bus, store: ReplayLog, run_id: str) -> None:
    """``Accept: application/x-ndjson`` gets one JSON event a line."""
    await append(bus, run_id, run_events(run_id, 5))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.get(
            f"{edge.url}/v1/runs/{run_id}/stream?detail=full",
            headers={"Accept": "application/x-ndjson"},
        )
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    assert [line["seq"] for line in lines] == [1, 2, 3, 4, 5]


async def test_websocket_subprotocol_text_frames_and_detail_header(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Koder agent stream §5.2 / R2: subprotocol koder-agent-stream-v1, text frames only, ``Detail: full`` honoured."""
    events = [event(run_id, 1, "run.lifecycle", {"state": "running"})]
    events += [event(run_id, seq, "text.delta") for seq in range(2, 8)]
    events.append(event(run_id, 8, "run.lifecycle", {"state": "done"}))
    await append(bus, run_id, events)
    shaped = [events[0], msgspec.structs.replace(events[6], span=(2, 7)), events[7]]
    await append(bus, run_id, shaped, view="shaped")
    async with serve_edge(bus, store) as edge:
        ws_url = edge.url.replace("http", "ws") + f"/v1/runs/{run_id}/stream"
        async with websockets.connect(
            ws_url, subprotocols=["koder-agent-stream-v1"], additional_headers={"Detail": "full"}
        ) as ws:
            assert ws.subprotocol == "koder-agent-stream-v1"
            full = [json.loads(m) async for m in ws]
        async with websockets.connect(ws_url, subprotocols=["koder-agent-stream-v1"]) as ws:
            default = [m async for m in ws]
    assert [e["seq"] for e in full] == list(range(1, 9))
    assert all(isinstance(m, str) for m in default)
    assert [json.loads(m)["seq"] for m in default] == [1, 7, 8]
    assert json.loads(default[1])["span"] == [2, 7]


async def test_the_hub_logs_a_lost_bus_once_and_its_return_once(
    own_redis: RedisServer, store: ReplayLog, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While the bus is down the hub retries its read (clients keep their connections); the
    operator reads one warning when reads start failing and one line when they work again,
    not silence and not a line per retry."""
    caplog.set_level(logging.INFO, logger="runwire.edge.fanout.hub")
    async with open_bus(own_redis.url) as bus:
        live = [event(run_id, 1, "run.lifecycle", {"state": "running"}, ts=now_ts()), event(run_id, 2, ts=now_ts())]
        await append(bus, run_id, live)  # stamped now: a live run, not one gone silent
        async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=30) as http:
            async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
                lines: list[str] = []
                client = asyncio.create_task(_read_into(response, lines))  # stays connected throughout
                await _until(lambda: "id: 2" in lines)  # caught up: from here the hub tails the run
                own_redis.stop()
                await _until(lambda: _edge(edge).metrics.bus_errors._value.get() >= 3)  # several failed reads ...
                own_redis.start()
                await _until(lambda: len(_hub_lines(caplog)) >= 2)
                assert not client.done()
                client.cancel()
    lines = _hub_lines(caplog)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines  # ... one line each way
    assert "bus" in lines[0][1] and "retry" in lines[0][1]
    assert "again" in lines[1][1]


def _hub_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "runwire.edge.fanout.hub"]


async def _read_into(response: httpx.Response, lines: list[str]) -> None:
    async for line in response.aiter_lines():
        lines.append(line)


def _edge(server: EdgeServer) -> Edge:
    assert server.server is not None
    app = server.server.config.loaded_app
    while not hasattr(app, "state"):  # uvicorn wraps the app in its middleware
        app = app.app
    edge: Edge = app.state.edge
    return edge


async def _until(condition: Callable[[], bool], within: float = 30.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polls state another task changes, no event to wait on
            await asyncio.sleep(0.05)
