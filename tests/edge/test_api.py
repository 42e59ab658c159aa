"""Auth matrix, HTTP ingest, control round trip, runs listing, export, health and metrics."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator

import httpx
import jwt
import pytest
import websockets

from runwire import protocols
from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.edge import EdgeSettings, issue_token
from runwire.jobs.replay import export_run
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from tests.events import event

from .harness import (
    RUN_A,
    RUN_B,
    SECRET,
    EdgeServer,
    append,
    controls_received,
    read_sse,
    run_events,
    serve_edge,
    token,
    two_tenants_runs,
)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


@pytest.fixture
async def secured(memory_bus: Bus, store: ReplayLog) -> AsyncIterator[EdgeServer]:
    """An edge with a secret, and one finished run for each of tenants A and B."""
    await two_tenants_runs(memory_bus, store)
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        yield edge


async def _stream_status(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int:
    async with http.stream("GET", url, headers=headers) as response:
        if response.status_code == 200:
            await read_sse(response)
        return response.status_code


async def test_auth_matrix_a_tenant_cannot_touch_another_tenants_run(secured: EdgeServer) -> None:
    """Invariant 6 (tenants are isolated): a token of tenant A can't read, list, export, ingest into or control B's runs."""
    a = bearer(token("A", "read", "write", "control"))
    line = envelope.encode(event(RUN_B, 9, "text.delta")) + b"\n"
    async with httpx.AsyncClient(base_url=secured.url, timeout=10) as http:
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream", a) == 200
        assert await _stream_status(http, f"/v1/runs/{RUN_B}/stream", a) == 404
        assert (await http.get(f"/v1/runs/{RUN_A}/events.jsonl", headers=a)).status_code == 200
        assert (await http.get(f"/v1/runs/{RUN_B}/events.jsonl", headers=a)).status_code == 404
        assert (await http.get(f"/v1/runs/{RUN_A}/spans", headers=a)).status_code == 200
        assert (await http.get(f"/v1/runs/{RUN_B}/spans", headers=a)).status_code == 404
        ingest = await http.post(f"/v1/runs/{RUN_B}/events", content=line, headers=a)
        assert (ingest.status_code, ingest.json()["code"]) == (403, "KAI-STREAM-AUTH-0003")
        control = {"command": "cancel"}
        assert (await http.post(f"/v1/runs/{RUN_B}/control", json=control, headers=a)).status_code == 404
        own = await http.post(f"/v1/runs/{RUN_A}/control", json=control, headers=a)
        assert (own.status_code, own.json()["code"]) == (409, "KAI-STREAM-RUN-0002")  # A's run has ended
        listed = (await http.get("/v1/runs", headers=a)).json()["runs"]
        assert [r["run_id"] for r in listed] == [RUN_A]
    ws_url = secured.url.replace("http", "ws") + f"/v1/runs/{RUN_B}/stream"
    async with websockets.connect(ws_url, additional_headers=a) as ws:
        assert json.loads(await ws.recv())["code"] == "KAI-STREAM-RUN-0001"
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
    async with websockets.connect(ws_url.replace(RUN_B, RUN_A), additional_headers=a) as ws:
        assert json.loads(await ws.recv())["run_id"] == RUN_A


async def test_auth_scopes_expiry_query_token_and_open_health(secured: EdgeServer) -> None:
    """Scopes gate write/control; expired or missing tokens get 401; ``?access_token=`` works for
    EventSource; /healthz and /readyz stay open."""
    read_only = token("A", "read")
    expired = jwt.encode(
        {"tenant": "A", "runs": "*", "scopes": ["read"], "exp": int(time.time()) - 5}, SECRET, "HS256"
    )
    forged = issue_token("another-secret-of-at-least-32-bytes!!", tenant="A", scopes=["read"])
    only_b_run = token("A", "read", runs=[RUN_B])
    async with httpx.AsyncClient(base_url=secured.url, timeout=10) as http:
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream", {}) == 401
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream", bearer(expired)) == 401
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream", bearer(forged)) == 401
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream?access_token={read_only}", {}) == 200
        assert await _stream_status(http, f"/v1/runs/{RUN_A}/stream", bearer(only_b_run)) == 404
        post = await http.post(f"/v1/runs/{RUN_A}/control", json={"command": "pause"}, headers=bearer(read_only))
        assert post.status_code == 403
        ingest = await http.post(f"/v1/runs/{RUN_A}/events", content=b"", headers=bearer(read_only))
        assert ingest.status_code == 403
        assert (await http.get("/v1/runs")).status_code == 401
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/")).status_code == 401
        assert (await http.get(f"/?access_token={read_only}")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).json() == {"ok": True}


async def test_ingest_reports_each_bad_line_and_publishes_every_valid_one(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Partial acceptance: valid lines are published in order; each bad line comes back with its
    line number and KAI-STREAM code (4xx); nothing valid is lost."""
    good = [event(run_id, seq, "text.delta") for seq in (1, 2, 3)]
    body = b"\n".join(
        [
            envelope.encode(good[0]),
            b"{not json",
            envelope.encode(good[1]),
            b'{"id":"x","ts":"2024-01-01T00:00:00Z","type":"nope.nope","run_id":"%s","seq":4,"payload":{}}'
            % run_id.encode(),
            envelope.encode(good[2]),
            envelope.encode(event("someone-else", 5, "text.delta")),
        ]
    )
    consumer = memory_bus.consumer("test-ingest", "c1")
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{edge.url}/v1/runs/{run_id}/events", content=body)
    assert response.status_code == 422
    result = response.json()
    assert result["accepted"] == 3 and result["format"] == "koder"
    assert [(r["line"], r["code"]) for r in result["rejected"]] == [
        (2, "KAI-STREAM-PROTO-0001"),
        (4, "KAI-STREAM-PROTO-0002"),
        (6, "KAI-STREAM-PROTO-0001"),
    ]
    delivered = await consumer.fetch(100, block_ms=500)
    assert [envelope.decode(d.data).seq for d in delivered] == [1, 2, 3]
    await consumer.close()


async def test_ingest_detects_the_format_and_stamps_the_tenant(memory_bus: Bus, store: ReplayLog) -> None:
    """``?format=`` may be left out (detected); with auth the token's tenant is stamped on every event."""
    lines = b'{"type":"run_start","run_id":"loom-1","message":"go","agent":"a"}\n{"type":"message_chunk","content":"hi"}\n'
    consumer = memory_bus.consumer("test-ingest-2", "c1")
    writer = token("T", "write", "read")
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{edge.url}/v1/runs/loom-1/events", content=lines, headers=bearer(writer))
    assert response.status_code == 200, response.text
    assert response.json()["format"] == "loom"
    delivered = [envelope.decode(d.data) for d in await consumer.fetch(100, block_ms=500)]
    assert delivered and {e.tenant for e in delivered} == {"T"}
    await consumer.close()


async def test_control_round_trip_to_the_publisher_sdk(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """POST /control → the run's control channel → ``async for cmd in run.controls()`` in the agent;
    closing a stream is a disconnect, not a cancel (the run goes on)."""
    publisher = Publisher(memory_bus)
    await publisher.start()
    run = publisher.run(run_id)
    await run.emit("run.lifecycle", {"state": "running"})
    await publisher.flush()
    received, listener = controls_received(run, 2)
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
            await read_sse(response, limit=1)  # then the client goes away: not a cancel
        bad = await http.post(f"{edge.url}/v1/runs/{run_id}/control", json={"command": "explode"})
        assert bad.status_code == 400
        for body in ({"command": "pause"}, {"command": "redirect", "args": {"prompt": "shorter"}}):
            response = await http.post(f"{edge.url}/v1/runs/{run_id}/control", json=body)
            assert response.status_code == 202
    await asyncio.wait_for(listener, 5)
    await publisher.close()
    assert received == [("pause", {}), ("redirect", {"prompt": "shorter"})]


async def test_runs_listing_filters_and_jsonl_export(memory_bus: Bus, store: ReplayLog) -> None:
    """GET /v1/runs filters by state; events.jsonl exports the replay log in any format."""
    await store.append(run_events("r-done", 4, end="done"))
    await store.append(run_events("r-error", 3, end="error"))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        done = (await http.get(f"{edge.url}/v1/runs?state=done")).json()["runs"]
        every = (await http.get(f"{edge.url}/v1/runs")).json()["runs"]
        export = await http.get(f"{edge.url}/v1/runs/r-done/events.jsonl")
        agui = await http.get(f"{edge.url}/v1/runs/r-done/events.jsonl?format=agui")
        missing = await http.get(f"{edge.url}/v1/runs/nope/events.jsonl")
    assert [r["run_id"] for r in done] == ["r-done"]
    assert {r["run_id"] for r in every} == {"r-done", "r-error"}
    assert [json.loads(line)["seq"] for line in export.text.splitlines()] == [1, 2, 3, 4]
    assert json.loads(agui.text.splitlines()[0])["type"] == "RUN_STARTED"
    assert missing.status_code == 404


@pytest.mark.parametrize("format_name", sorted(protocols.EGRESS))
async def test_the_edge_exports_what_runwire_replay_export_writes(
    memory_bus: Bus, store: ReplayLog, format_name: str
) -> None:
    """One export path: ``events.jsonl`` of a finished run, of an unfinished one (which the
    format's closing frames end) and of a run with a child is byte for byte the CLI's export."""
    await store.append(run_events("r-ended", 5, end="done"))
    await store.append(run_events("r-open", 4, end=None))
    await store.append([*run_events("r-tree", 3, end=None),
                        event("r-tree", 4, "text.delta", child_id="kid"),
                        event("r-tree", 5, "run.lifecycle", {"state": "done"}, child_id="kid")])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        for run_id in ("r-ended", "r-open", "r-tree"):
            served = await http.get(f"{edge.url}/v1/runs/{run_id}/events.jsonl?format={format_name}")
            written = io.BytesIO()
            await export_run(store, run_id, written.write, format=format_name)
            assert served.content == written.getvalue() != b"", (run_id, format_name)
