"""Threads: thread ids on runs, and AI SDK chat resume over HTTP (``/v1/threads/{id}/stream``).

The AI SDK's ``DefaultChatTransport.reconnectToStream`` GETs ``{api}/{chatId}/stream``;
``204`` means "no active stream" and a body is the UI message stream replayed from
its start (``x-vercel-ai-ui-message-stream: v1``, ``data: [DONE]`` at the end).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from runwire.bus.base import Bus
from runwire.core.envelope import decode, encode
from runwire.edge import EdgeSettings, issue_token
from runwire.store.base import ReplayLog
from tests.events import event
from tests.waiting import until

from .chatnode import resume_mid_run
from .harness import decoded, publish, read_sse, run_events, serve_edge

SECRET = "test-secret-please-rotate-0123456789abcdef"


async def test_http_ingest_stamps_the_thread_header_on_the_runs_own_events(memory_bus: Bus, store: ReplayLog) -> None:
    """``Thread-Id`` (or ``?thread_id=``) gives the posted run its thread; another thread is refused."""
    lines = b"".join(encode(e) + b"\n" for e in run_events("run-ingest", 3, end=None))
    other = event("run-ingest", 4, thread_id="chat-other")
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        ok = await http.post("/v1/runs/run-ingest/events", content=lines, headers={"Thread-Id": "chat-1"})
        bad = await http.post("/v1/runs/run-ingest/events?thread_id=chat-1",
                              content=encode(other) + b"\n")
    assert ok.status_code == 200 and ok.json()["accepted"] == 3
    assert bad.status_code == 422 and bad.json()["rejected"][0]["field"] == "$.thread_id"
    async with memory_bus.consumer("check", "c") as consumer:
        got = [decode(d.data) for d in await consumer.fetch(100, block_ms=100)]
    assert [e.thread_id for e in got] == ["chat-1"] * 3


async def test_runs_are_listed_by_thread(memory_bus: Bus, store: ReplayLog) -> None:
    await publish(memory_bus, store, run_events("run-t1", 3, thread_id="chat-1"))
    await publish(memory_bus, store, run_events("run-t2", 3, thread_id="chat-2"))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        listed = (await http.get("/v1/runs", params={"thread_id": "chat-1"})).json()["runs"]
    assert [(r["run_id"], r["thread_id"]) for r in listed] == [("run-t1", "chat-1")]


async def test_a_thread_without_an_active_run_answers_204(memory_bus: Bus, store: ReplayLog) -> None:
    """No run, or the newest run of the thread has ended: "no active stream" (the client does not resume)."""
    await publish(memory_bus, store, run_events("run-old", 3, end=None, thread_id="chat-1"))
    old = await store.run("run-old")
    assert old is not None and old.created_at is not None
    await until(lambda: time.time() > old.created_at.timestamp(), what="a clock past run-old's creation")
    await publish(memory_bus, store, run_events("run-new", 3, thread_id="chat-1"))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        unknown = await http.get("/v1/threads/chat-nobody/stream")
        finished = await http.get("/v1/threads/chat-1/stream")
    assert unknown.status_code == 204 and unknown.content == b""
    assert finished.status_code == 204


async def test_the_active_run_is_replayed_from_its_start_and_ends_with_done(memory_bus: Bus, store: ReplayLog) -> None:
    """A resume mid-run gets every chunk from ``start`` (messageId = run id), then the live rest."""
    head = run_events("run-live", 4, end=None, thread_id="chat-9")
    await publish(memory_bus, store, head)
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        async with http.stream("GET", "/v1/threads/chat-9/stream") as response:
            assert response.status_code == 200
            assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = asyncio.create_task(read_sse(response))
            await until(lambda: edge.live_clients("run-live") == 1, what="the client attached")
            await publish(memory_bus, store, [event("run-live", 5, "run.lifecycle", {"state": "done"})])
            events, _ = await asyncio.wait_for(reader, 10)
    chunks = decoded(events)
    assert chunks[0] == {"type": "start", "messageId": "run-live"}
    assert [c["delta"] for c in chunks if c["type"] == "text-delta"] == ["t2", "t3", "t4"]
    assert chunks[-1]["type"] == "finish" and events[-1].data == "[DONE]"


async def test_a_thread_is_its_tenants_only(memory_bus: Bus, store: ReplayLog) -> None:
    """Invariant 6 (tenants are isolated): another tenant's token finds no active run in the thread (204, not its stream)."""
    await publish(memory_bus, store, run_events("run-acme", 3, end=None, tenant="acme", thread_id="chat-1"))
    settings = EdgeSettings(secret=SECRET)
    mine = issue_token(SECRET, tenant="acme", scopes=["read"])
    theirs = issue_token(SECRET, tenant="other", scopes=["read"])
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        anonymous = await http.get("/v1/threads/chat-1/stream")
        other = await http.get("/v1/threads/chat-1/stream", headers={"Authorization": f"Bearer {theirs}"})
        async with http.stream("GET", "/v1/threads/chat-1/stream",
                               headers={"Authorization": f"Bearer {mine}"}) as response:
            status = response.status_code
    assert (anonymous.status_code, other.status_code, status) == (401, 204, 200)


async def test_a_run_silent_past_the_limit_is_not_active(memory_bus: Bus, store: ReplayLog) -> None:
    """A run whose agent died without a terminal event is not resumed forever."""
    await publish(memory_bus, store, run_events("run-dead", 3, end=None, thread_id="chat-1"))
    started = time.monotonic()
    await asyncio.sleep(1.1)
    async with serve_edge(memory_bus, store, EdgeSettings(silence_s=1.0)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        response = await http.get("/v1/threads/chat-1/stream")
    assert time.monotonic() - started >= 1.0 and response.status_code == 204


async def test_default_chat_transport_resumes_mid_run_and_finds_nothing_after_the_end(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """``ai``'s ``DefaultChatTransport({api: edge + "/v1/threads"}).reconnectToStream`` unchanged:
    mid-run it gets the whole message (replayed head + live tail); after the end, null (204)."""
    resumed, after_end = await resume_mid_run(memory_bus, store, "run-chat", "chat-5", "http-resume")
    message = resumed["message"]
    assert message["id"] == "run-chat" and message["role"] == "assistant"
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == ["t2t3t4 tail"]
    assert resumed["chunks"][-1]["type"] == "finish"
    assert after_end == {"result": None}
