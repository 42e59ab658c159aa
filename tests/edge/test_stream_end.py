"""A stream always ends or waits for a reason: finished runs, cursors past the end, runs nobody published.

Koder agent stream §5.1 (SSE, Last-Event-ID) and the HTML standard's EventSource
rule: a ``204 No Content`` answer stops a browser reconnecting.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings
from runwire.store.base import ReplayLog
from tests.waiting import until

from .harness import append, decoded, event, read_sse, run_events, serve_edge

NDJSON = {"Accept": "application/x-ndjson"}


@pytest.mark.parametrize("cursor", ["6", "9"])
async def test_sse_reconnect_at_or_past_the_terminal_event_gets_204(
    bus: Bus, store: ReplayLog, run_id: str, cursor: str
) -> None:
    """EventSource reconnects with Last-Event-ID = the terminal id after the server closes: 204 stops it."""
    await append(bus, run_id, run_events(run_id, 6))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=5) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        response = await http.get(url, headers={"Last-Event-ID": cursor})
        live = await http.get(url + "&after=live")
    assert response.status_code == 204
    assert response.content == b""
    assert live.status_code == 204


async def test_sse_cursor_before_the_end_of_a_finished_run_replays_the_rest_and_closes(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    await append(bus, run_id, run_events(run_id, 6))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=5) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        async with http.stream("GET", url, headers={"Last-Event-ID": "5"}) as response:
            events, _ = await read_sse(response)
    assert [e.id for e in events] == ["6"]


async def test_a_run_finished_in_the_replay_log_only_is_recognised_as_ended(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """The hot tier has expired; the replay log says the run is done: still 204, not a hang."""
    await store.append(run_events(run_id, 4))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=5) as http:
        response = await http.get(
            f"{edge.url}/v1/runs/{run_id}/stream?detail=full", headers={"Last-Event-ID": "4"}
        )
    assert response.status_code == 204


async def test_ndjson_and_websocket_past_the_end_close_at_once_with_a_final_message(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    await append(bus, run_id, run_events(run_id, 5, end="aborted"))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=5) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full&after=5"
        response = await http.get(url, headers=NDJSON)
        async with websockets.connect(url.replace("http", "ws")) as ws:
            frames = [json.loads(m) async for m in ws]
            close_code = ws.close_code
    assert response.status_code == 200
    (line,) = [json.loads(x) for x in response.text.splitlines() if x]
    assert line["type"] == "end"
    assert (line["state"], line["seq"]) == ("aborted", 5)
    assert "nothing follows" in line["message"]
    assert frames == [line]
    assert close_code == 1000


async def test_a_cursor_past_the_end_of_a_live_run_is_served_from_where_the_run_is(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """A cursor beyond anything published (a client's bug, a reset run) gets the next events, not silence."""
    await append(bus, run_id, run_events(run_id, 5, end=None))
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        async with http.stream("GET", url, headers={"Last-Event-ID": "50"}) as response:
            await append(bus, run_id, [event(run_id, 6), event(run_id, 7, "run.lifecycle", {"state": "done"})])
            events, _ = await asyncio.wait_for(read_sse(response), 10)
    assert [e.id for e in events] == ["6", "7"]


async def test_a_run_nobody_published_is_waited_for_then_answered_run_0003(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Headers go out at once (a client may open the stream and then start its agent); after
    ``unpublished_wait_s`` with no event the stream gets one coded error frame and ends."""
    settings = EdgeSettings(unpublished_wait_s=0.5)
    async with serve_edge(bus, store, settings) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream"
        started = time.monotonic()
        async with http.stream("GET", url) as response:
            events, _ = await asyncio.wait_for(read_sse(response), 5)
        waited = time.monotonic() - started
        ndjson = await http.get(url, headers=NDJSON)
        async with websockets.connect(url.replace("http", "ws")) as ws:
            frames = [json.loads(await ws.recv())]
            with pytest.raises(websockets.ConnectionClosedError):
                await ws.recv()
            close_code = ws.close_code
    assert response.status_code == 200
    (error,) = decoded(events)
    assert error["type"] == "error"
    assert error["code"] == "KAI-STREAM-RUN-0003"
    assert waited >= 0.4
    assert json.loads(ndjson.text)["code"] == "KAI-STREAM-RUN-0003"
    assert frames[0]["code"] == "KAI-STREAM-RUN-0003"
    assert close_code == 4404


async def test_a_run_published_while_its_client_waits_is_streamed_from_its_first_event(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async def publish_later() -> None:
            await until(lambda: edge.live_clients(run_id) == 1, what="the client waiting")
            await append(bus, run_id, run_events(run_id, 4))

        producer = asyncio.create_task(publish_later())
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
            events, _ = await asyncio.wait_for(read_sse(response), 10)
        await producer
    assert response.status_code == 200
    assert [e.id for e in events] == ["1", "2", "3", "4"]


async def test_a_client_arriving_after_a_silent_run_was_ended_gets_the_end_too(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """The silence end is synthesized (no seq): a client joining later gets it at once, and a reconnect
    with the last real id gets 204 — neither waits for events that will never come."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    settings = EdgeSettings(silence_s=0.4)
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        async with http.stream("GET", url) as first:
            seen, _ = await asyncio.wait_for(read_sse(first), 5)  # to the end, once the run is silent
            async with http.stream("GET", url, headers={"Last-Event-ID": "1"}) as second:
                later, _ = await asyncio.wait_for(read_sse(second), 5)
            ended = await asyncio.wait_for(http.get(url, headers={"Last-Event-ID": "3"}), 5)
    assert [e.id for e in seen[:3]] == ["1", "2", "3"]
    assert decoded(seen)[-1]["payload"]["state"] == "error"
    body = decoded(later)
    assert [e["seq"] for e in body[:2]] == [2, 3]
    assert body[-1]["payload"]["state"] == "error"
    assert ended.status_code == 204
