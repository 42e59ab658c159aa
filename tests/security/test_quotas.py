"""Resource exhaustion by one tenant (docs/security.md § Quotas): no socket or token starves the rest.

A token holds at most ``streams_per_token`` streams open on an edge (of every transport, waiting
ones included), a chat socket at most ``requests_per_socket`` responses at once. Past a quota the
caller gets a coded refusal — 429 with ``Retry-After``, WebSocket close 1008, gRPC
``RESOURCE_EXHAUSTED`` — and other tenants notice nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import websockets

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.edge import EdgeSettings, issue_token
from runwire.store.base import ReplayLog
from tests.edge.harness import EdgeServer, append, publish, run_events, serve_edge
from tests.events import event

from .conftest import SECRET, new_id

QUOTA = "KAI-STREAM-REQ-0005"


def token(tenant: str) -> str:
    return issue_token(SECRET, tenant=tenant, scopes=("read", "write"))


def resume(request_id: str, chat_id: str) -> str:
    return json.dumps({"type": "resume", "requestId": request_id, "id": chat_id,
                       "headers": {}, "body": {}, "metadata": None})


async def round_trip(http: httpx.AsyncClient, tenant_token: str) -> float:
    """Another tenant's ingest of a short run, then its export: seconds for both."""
    run = new_id("other")
    started = time.monotonic()
    body = b"".join(envelope.encode(e) + b"\n" for e in run_events(run, 3))
    headers = {"Authorization": f"Bearer {tenant_token}"}
    posted = await http.post(f"/v1/runs/{run}/events", content=body, headers=headers)
    assert posted.status_code == 200, posted.text
    listed = await http.get("/v1/runs", headers=headers)
    assert listed.status_code == 200
    return time.monotonic() - started


async def test_a_socket_flooding_resumes_is_closed_and_other_tenants_do_not_wait(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """3,000 ``resume`` frames on one socket for its own active thread run: the socket is closed
    with 1008 and ``KAI-STREAM-REQ-0005`` once it asks for more responses than it may stream at
    once; then 1,000 events of that run go out, and another tenant's round trip stays under 1 s."""
    run, chat = new_id("flood"), new_id("chat")
    await publish(memory_bus, store, run_events(run, 3, end=None, thread_id=chat, tenant="A"))
    settings = EdgeSettings(secret=SECRET)
    async with serve_edge(memory_bus, store, settings) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=30) as http:
        url = edge.url.replace("http://", "ws://") + f"/v1/threads?access_token={token('A')}"
        async with websockets.connect(url, max_size=None) as ws:
            with contextlib.suppress(websockets.ConnectionClosed):
                for index in range(3000):
                    await ws.send(resume(f"r{index}", chat))
            starts = 0
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    starts += frame["type"] == "start"
            assert ws.close_code == 1008 and QUOTA in (ws.close_reason or "")
        assert starts <= settings.requests_per_socket
        more = [event(run, seq, "text.delta", {"text": "x"}, thread_id=chat, tenant="A")
                for seq in range(4, 1004)]
        await append(memory_bus, run, more)
        await append(memory_bus, run, more, view="shaped")
        assert await round_trip(http, token("B")) < 1.0


FUTURE_RUNS = [new_id("held") for _ in range(10)]
"""Runs nobody has published yet; a token limited to them may wait for them (``unpublished_wait_s``)."""


def waiting_token(tenant: str = "A") -> str:
    return issue_token(SECRET, tenant=tenant, runs=FUTURE_RUNS, scopes=("read",))


@contextlib.asynccontextmanager
async def held_streams(edge: EdgeServer, tenant_token: str, count: int) -> AsyncIterator[list[int]]:
    """``count`` SSE streams of runs nobody has published yet, held open; yields their statuses."""
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=edge.url, timeout=30) as http, contextlib.AsyncExitStack() as stack:
        headers = {"Authorization": f"Bearer {tenant_token}"}
        for index in range(count):
            response = await stack.enter_async_context(
                http.stream("GET", f"/v1/runs/{FUTURE_RUNS[index]}/stream", headers=headers))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["retry-after"].isdigit()
                assert json.loads(await response.aread())["code"] == QUOTA
        yield statuses


async def test_held_streams_stop_at_the_tokens_quota_while_other_tokens_connect(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """A token holding streams of runs that do not exist yet gets 429 past its quota; another
    token (of the same tenant, even) still connects; a stream given back frees a place."""
    settings = EdgeSettings(secret=SECRET, streams_per_token=5)
    greedy = waiting_token()
    other = issue_token(SECRET, tenant="A", runs=FUTURE_RUNS, scopes=("read",), ttl_s=7200)
    async with serve_edge(memory_bus, store, settings) as edge:
        async with held_streams(edge, greedy, 7) as statuses:
            assert statuses == [200] * 5 + [429] * 2
            async with held_streams(edge, other, 1) as others:
                assert others == [200]
            url = edge.url.replace("http://", "ws://") + f"/v1/runs/{FUTURE_RUNS[9]}/stream?access_token={greedy}"
            async with websockets.connect(url) as ws:
                with contextlib.suppress(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                    await asyncio.wait_for(ws.recv(), 10)
                assert ws.close_code == 1008
        async with held_streams(edge, greedy, 1) as again:
            assert again == [200]


async def test_a_flood_of_chat_requests_over_the_token_quota_gets_an_error_frame_each(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """Responses on chat sockets count against the token's streams: past the quota a ``resume``
    gets an ``error`` frame with the code, the socket stays usable."""
    run, chat = new_id("busy"), new_id("chat")
    await publish(memory_bus, store, run_events(run, 3, end=None, thread_id=chat, tenant="A"))
    settings = EdgeSettings(secret=SECRET, streams_per_token=2)
    async with serve_edge(memory_bus, store, settings) as edge:
        url = edge.url.replace("http://", "ws://") + f"/v1/threads?access_token={token('A')}"
        async with websockets.connect(url) as ws:
            for index in range(3):
                await ws.send(resume(f"r{index}", chat))
            seen: dict[str, list[str]] = {}
            while len(seen.get("r2", [])) == 0 or len(seen.get("r1", [])) == 0 or len(seen.get("r0", [])) == 0:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
                seen.setdefault(frame["requestId"], []).append(frame.get("errorText") or frame["type"])
    assert seen["r0"][0] == "start" and seen["r1"][0] == "start"
    assert QUOTA in seen["r2"][0] or "quota" in seen["r2"][0]
