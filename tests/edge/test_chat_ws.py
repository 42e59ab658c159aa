"""``WS /v1/threads``: the AI SDK ``WebSocketChatTransport`` protocol (client frames send /
resume / abort; server frames start / chunk / end / no-active / error), as ``ai``'s
``websocket-chat-transport.ts`` defines it. Sequences start at 0 and are contiguous."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import websockets

from runwire.bus.base import Bus, ControlCommand
from runwire.bus.requests import AgentRequest, consume_requests, consumer_alive
from runwire.core.envelope import Event
from runwire.edge import EdgeSettings, issue_token
from runwire.store.base import ReplayLog
from tests.events import event
from tests.waiting import until

from .chatnode import (
    chat_result,
    resume_mid_run,
    run_chat_client,
    start_chat_client,
    wait_for_streams,
)
from .harness import EdgeServer, publish, run_events, serve_edge

USER_MESSAGE = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}


def ws_url(edge: EdgeServer, query: str = "") -> str:
    return edge.url.replace("http://", "ws://") + "/v1/threads" + query


async def frames_until(
    ws: Any, request_id: str | None, last: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The server frames of one request (of any, for ``None``) up to the first one ``last`` holds for."""
    got: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if request_id is not None and frame["requestId"] != request_id:
            continue
        got.append(frame)
        if last(frame):
            return got


async def frames_until_done(ws: Any, request_id: str) -> list[dict[str, Any]]:
    """The server frames of one request until its end / error / no-active."""
    return await frames_until(ws, request_id, lambda frame: frame["type"] in ("end", "error", "no-active"))


def delta(text: str) -> Callable[[dict[str, Any]], bool]:
    """The frame carrying the text delta ``text`` (the history's last, before going live)."""
    return lambda frame: frame.get("chunk", {}).get("delta") == text


def resume(request_id: str, chat_id: str, last: int | None = None) -> str:
    frame: dict[str, Any] = {"type": "resume", "requestId": request_id, "id": chat_id,
                             "headers": {}, "body": {}, "metadata": None}
    if last is not None:
        frame["lastSequence"] = last
    return json.dumps(frame)


def send(request_id: str, chat_id: str) -> str:
    return json.dumps({"type": "send", "requestId": request_id, "id": chat_id, "trigger": "submit-message",
                       "messageId": None, "messages": [USER_MESSAGE], "headers": {}, "body": {"k": 1},
                       "metadata": {"m": 2}})


def chunks(frames: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [(f["sequence"], f["chunk"]) for f in frames if f["type"] == "chunk"]


@contextlib.asynccontextmanager
async def agent(bus: Bus, store: ReplayLog, *, deltas: Sequence[str] = ("Hi", " there"),
                finish: bool = True, answer: bool = True) -> AsyncIterator[list[AgentRequest]]:
    """An agent on the ``default`` requests channel; it answers each request with a short run
    (what its publisher and the workers would write)."""
    seen: list[AgentRequest] = []
    ready = asyncio.Event()

    async def serve() -> None:
        requests = consume_requests(bus, "default", ttl_s=3.0)
        first = asyncio.ensure_future(anext(requests))
        while not ready.is_set():
            if await consumer_alive(bus, "default"):
                ready.set()
            await asyncio.sleep(0.02)
        pending = first
        while True:
            request = await pending
            pending = asyncio.ensure_future(anext(requests))
            seen.append(request)
            if not answer:
                continue
            run = request.run_id
            extra = {"thread_id": request.thread_id, "tenant": request.tenant}
            events: list[Event] = [event(run, 1, "run.lifecycle", {"state": "running"}, **extra)]
            events += [event(run, 2 + i, "text.delta", {"text": text}, **extra) for i, text in enumerate(deltas)]
            await publish(bus, store, events)
            if finish:
                await asyncio.sleep(0.2)
                await publish(bus, store, [event(run, 2 + len(deltas), "run.lifecycle", {"state": "done"}, **extra)])

    task = asyncio.create_task(serve())
    await asyncio.wait_for(ready.wait(), 20)
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_resume_without_an_active_run_is_no_active(bus: Bus, store: ReplayLog) -> None:
    async with serve_edge(bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(resume("r1", "chat-none"))
        assert await frames_until_done(ws, "r1") == [{"type": "no-active", "requestId": "r1"}]


async def test_resume_replays_from_sequence_0_then_goes_live_then_ends(bus: Bus, store: ReplayLog) -> None:
    await publish(bus, store, run_events("run-w", 4, end=None, thread_id="chat-w"))
    async with serve_edge(bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(resume("r1", "chat-w"))
        history = await frames_until(ws, "r1", delta("t4"))
        await publish(bus, store, [event("run-w", 5, "run.lifecycle", {"state": "done"})])
        frames = history + await frames_until_done(ws, "r1")
    assert frames[0] == {"type": "start", "requestId": "r1"}
    frames = frames[1:]
    got = chunks(frames)
    assert [s for s, _ in got] == list(range(len(got)))
    assert got[0][1] == {"type": "start", "messageId": "run-w"}
    assert got[-1][1]["type"] == "finish" and frames[-1] == {"type": "end", "requestId": "r1"}


async def test_last_sequence_gives_exactly_the_chunks_after_it_on_another_edge_too(
    bus: Bus, store: ReplayLog
) -> None:
    """Sequences are the run's chunk indices: two edge instances number them alike."""
    await publish(bus, store, run_events("run-live2", 6, end=None, thread_id="chat-l"))
    async with serve_edge(bus, store) as one, serve_edge(bus, store) as two:
        async with websockets.connect(ws_url(one)) as a, websockets.connect(ws_url(two)) as b:
            await a.send(resume("a", "chat-l"))
            await b.send(resume("b", "chat-l", last=3))
            history_a = await frames_until(a, "a", delta("t6"))
            history_b = await frames_until(b, "b", delta("t6"))
            await publish(bus, store, [event("run-live2", 7, "run.lifecycle", {"state": "done"})])
            everything = chunks(history_a + await frames_until_done(a, "a"))
            after_three = chunks(history_b + await frames_until_done(b, "b"))
    assert [s for s, _ in everything] == list(range(len(everything)))
    assert after_three == everything[4:]


async def test_send_without_a_consuming_agent_is_refused_at_once(bus: Bus, store: ReplayLog) -> None:
    async with serve_edge(bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(send("s1", "chat-x"))
        frames = await frames_until_done(ws, "s1")
    assert frames[0]["type"] == "error" and "no agent consumes requests" in frames[0]["errorText"]


async def test_send_hands_the_turn_to_the_agent_and_streams_its_run(bus: Bus, store: ReplayLog) -> None:
    async with agent(bus, store) as seen, serve_edge(bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(send("s1", "chat-s"))
        frames = await frames_until_done(ws, "s1")
        listed = await store.runs(thread_id="chat-s")
    request = seen[0]
    assert (request.thread_id, request.messages, request.body, request.metadata) == (
        "chat-s", [USER_MESSAGE], {"k": 1}, {"m": 2})
    got = chunks(frames)
    assert [s for s, _ in got] == list(range(len(got)))
    assert got[0][1] == {"type": "start", "messageId": request.run_id}
    assert "".join(c["delta"] for _, c in got if c["type"] == "text-delta") == "Hi there"
    assert frames[-1] == {"type": "end", "requestId": "s1"}
    assert [r.run_id for r in listed] == [request.run_id]


async def test_a_turn_the_agent_never_answers_ends_with_an_error(bus: Bus, store: ReplayLog) -> None:
    """No request waits without bound: nothing published within ``unpublished_wait_s`` → ``error``."""
    settings = EdgeSettings(unpublished_wait_s=0.5)
    async with agent(bus, store, answer=False) as seen, serve_edge(bus, store, settings) as edge, \
            websockets.connect(ws_url(edge)) as ws:
        await ws.send(send("s1", "chat-mute"))
        frames = await frames_until_done(ws, "s1")
    assert len(seen) == 1
    assert frames[-1]["type"] == "error" and "were published within 0.5 s" in frames[-1]["errorText"]


async def test_a_second_turn_while_one_is_active_is_refused(bus: Bus, store: ReplayLog) -> None:
    await publish(bus, store, run_events("run-busy", 3, end=None, thread_id="chat-b"))
    async with agent(bus, store), serve_edge(bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(send("s2", "chat-b"))
        frames = await frames_until_done(ws, "s2")
    assert frames == [{"type": "error", "requestId": "s2", "errorText": "a response is already active for this chat"}]


async def test_abort_cancels_the_run_and_a_disconnect_does_not(bus: Bus, store: ReplayLog) -> None:
    """Stop is not disconnect: ``abort`` reaches the run's control channel as ``cancel``;
    closing the socket mid-run cancels nothing."""
    await publish(bus, store, run_events("run-stop", 3, end=None, thread_id="chat-stop"))
    await publish(bus, store, run_events("run-keep", 3, end=None, thread_id="chat-keep"))
    got: dict[str, list[ControlCommand]] = {"run-stop": [], "run-keep": []}

    async def listen(run_id: str) -> None:
        async for command in bus.controls(run_id):
            got[run_id].append(command)

    listeners = [asyncio.create_task(listen(r)) for r in got]
    for run_id in got:  # listening: each has received a marker
        await until(lambda run_id=run_id: marked(bus, run_id, got[run_id]), what=f"{run_id}'s listener")
    async with serve_edge(bus, store, EdgeSettings()) as edge:
        async with websockets.connect(ws_url(edge)) as ws:
            await ws.send(resume("k", "chat-keep"))
            await ws.send(resume("r", "chat-stop"))
            live: set[str] = set()

            def both_live(frame: dict[str, Any]) -> bool:
                if delta("t3")(frame):
                    live.add(frame["requestId"])
                return live == {"k", "r"}

            await frames_until(ws, None, both_live)
            await ws.send(json.dumps({"type": "abort", "requestId": "r"}))
            await until(lambda: unmarked(got["run-stop"]), what="the cancel")
    # the edge has stopped: a cancel on disconnect would be on the channel before this marker
    got["run-keep"].clear()
    await until(lambda: marked(bus, "run-keep", got["run-keep"]), what="the marker after the disconnect")
    for listener in listeners:
        listener.cancel()
    await asyncio.gather(*listeners, return_exceptions=True)
    assert [c.command for c in unmarked(got["run-stop"])] == ["cancel"]
    assert unmarked(got["run-keep"]) == []


MARKER = "marker"


async def marked(bus: Bus, run_id: str, received: list[ControlCommand]) -> bool:
    """Whether a listener has received a marker; sends one if not yet (a live listener's
    start can't be seen from outside, nor what it would have received before a marker)."""
    if any(c.by == MARKER for c in received):
        return True
    await bus.send_control(ControlCommand(command="pause", run_id=run_id, by=MARKER))
    return False


def unmarked(received: list[ControlCommand]) -> list[ControlCommand]:
    return [c for c in received if c.by != MARKER]


@pytest.mark.parametrize("frame", ['{"type": "resume"}', "not json", '{"type": "send", "requestId": "x", "trigger": "nope"}',
                                   b"\x00binary"])
async def test_an_invalid_frame_closes_the_socket_with_1008(
    memory_bus: Bus, store: ReplayLog, frame: str | bytes
) -> None:
    async with serve_edge(memory_bus, store) as edge, websockets.connect(ws_url(edge)) as ws:
        await ws.send(frame)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_websocket_chat_transport_resumes_mid_run_and_finds_nothing_after_the_end(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """``ai``'s ``WebSocketChatTransport.reconnectToStream`` against the edge: mid-run the whole
    message (replayed head + live tail, sequences checked by the transport); after the end, null."""
    resumed, after_end = await resume_mid_run(memory_bus, store, "run-node", "chat-n", "ws-resume")
    message = resumed["message"]
    assert message["id"] == "run-node"
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == ["t2t3t4 tail"]
    assert after_end == {"result": None}


async def test_websocket_chat_transport_sends_a_turn_to_the_agent(memory_bus: Bus, store: ReplayLog) -> None:
    async with agent(memory_bus, store) as seen, serve_edge(memory_bus, store) as edge:
        sent = await run_chat_client(edge=edge.url, chatId="chat-send", mode="ws-send")
    assert "error" not in sent, sent
    assert seen[0].thread_id == "chat-send" and seen[0].messages[0]["parts"][0]["text"] == "hello"
    message = sent["result"]["message"]
    assert message["id"] == seen[0].run_id
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == ["Hi there"]


async def test_websocket_chat_transport_stop_cancels_the_run(memory_bus: Bus, store: ReplayLog) -> None:
    """``stop()`` (the transport's abort signal) on a resumed stream reaches the agent as ``cancel``."""
    await publish(memory_bus, store, run_events("run-halt", 4, end=None, thread_id="chat-h"))
    commands: list[ControlCommand] = []

    async def listen() -> None:
        async for command in memory_bus.controls("run-halt"):
            commands.append(command)

    listener = asyncio.create_task(listen())
    async with serve_edge(memory_bus, store) as edge:
        stopped = await run_chat_client(edge=edge.url, chatId="chat-h", mode="ws-resume", abortAfter=2)
        for _ in range(100):
            if commands:
                break
            await asyncio.sleep(0.05)
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)
    assert "error" not in stopped, stopped
    assert [c.command for c in commands] == ["cancel"]


async def test_the_raw_protocol_resumes_after_last_sequence(memory_bus: Bus, store: ReplayLog) -> None:
    """A ``ws`` client speaking the documented frames: ``resume`` with ``lastSequence`` 2 gets
    ``start``, chunks 3, 4, … and ``end``."""
    await publish(memory_bus, store, run_events("run-raw", 5, end=None, thread_id="chat-raw"))
    async with serve_edge(memory_bus, store) as edge:
        client = await start_chat_client(edge=edge.url, chatId="chat-raw", mode="ws-frames", lastSequence=2)
        await wait_for_streams(edge.url)
        await publish(memory_bus, store, [event("run-raw", 6, "run.lifecycle", {"state": "done"})])
        result = await chat_result(client)
    frames = result["result"]["frames"]
    assert frames[0] == {"type": "start", "requestId": "r1"}
    assert [f["sequence"] for f in frames if f["type"] == "chunk"][:2] == [3, 4]
    assert frames[-1] == {"type": "end", "requestId": "r1"}


async def test_frames_are_held_to_the_tokens_tenant_and_scopes(memory_bus: Bus, store: ReplayLog) -> None:
    """Invariant 6 (tenants are isolated) on the chat socket: another tenant's thread has no active run for you,
    a token without ``write`` can't send a turn, without ``control`` can't stop one; no token, no socket."""
    secret = "test-secret-please-rotate-0123456789abcdef"
    await publish(memory_bus, store, run_events("run-acme", 3, end=None, tenant="acme", thread_id="chat-a"))
    reader = issue_token(secret, tenant="acme", scopes=["read"])
    other = issue_token(secret, tenant="other", scopes=["read", "write", "control"])
    async with serve_edge(memory_bus, store, EdgeSettings(secret=secret)) as edge:
        async with websockets.connect(ws_url(edge)) as refused:  # no token: an error frame, then 4401
            assert json.loads(await refused.recv())["code"] == "KAI-STREAM-AUTH-0001"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await refused.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        async with websockets.connect(ws_url(edge, f"?access_token={other}")) as ws:
            await ws.send(resume("r1", "chat-a"))
            not_theirs = await frames_until_done(ws, "r1")
        async with websockets.connect(ws_url(edge, f"?access_token={reader}")) as ws:
            await ws.send(send("s1", "chat-a2"))
            no_write = await frames_until_done(ws, "s1")
            await ws.send(resume("r2", "chat-a"))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "start"
            await ws.send(json.dumps({"type": "abort", "requestId": "r2"}))
            no_control = await frames_until_done(ws, "r2")
    assert not_theirs == [{"type": "no-active", "requestId": "r1"}]
    assert no_write[0]["type"] == "error" and "write" in no_write[0]["errorText"]
    assert no_control[-1]["type"] == "error" and "control" in no_control[-1]["errorText"]
