"""The edge's uvicorn protocol (edge/http/server.py): what an idle stream holds, and that a client
leaving is still noticed at once — through the ``runwire.disconnect`` extension on the edge's own
protocol, through a task reading ``http.disconnect`` on any other server."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import types
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn

from runwire.bus.base import Bus
from runwire.core.errors import CONN_DISCONNECTED
from runwire.edge import EdgeSettings, create_app
from runwire.edge.fanout.frames import Frame
from runwire.edge.fanout.hub import Hub
from runwire.edge.fanout.transports import DISCONNECT_EXTENSION, HttpSink
from runwire.edge.http.server import LightEvent, edge_config
from runwire.store.base import ReplayLog
from tests.edge.harness import (
    append,
    free_port,
    live_clients,
    run_events,
    start_uvicorn,
    stop_uvicorn,
)
from tests.waiting import until

CLIENTS = 20


def new_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def served(bus: Bus, store: ReplayLog, *, edge_protocol: bool,
                 settings: EdgeSettings | None = None) -> AsyncIterator[tuple[uvicorn.Server, int]]:
    port = free_port()
    app = create_app(bus, store, settings or EdgeSettings())
    options = {"host": "127.0.0.1", "port": port, "log_level": "warning", "lifespan": "on",
               "timeout_graceful_shutdown": 0.5}
    config = edge_config(app, **options) if edge_protocol else uvicorn.Config(app, http="httptools", **options)
    server, task = await start_uvicorn(config)
    try:
        yield server, port
    finally:
        await stop_uvicorn(server, task)


async def open_streams(port: int, run: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    streams = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /v1/runs/{run}/stream?detail=full HTTP/1.1\r\nHost: x\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        streams.append((reader, writer))
    return streams


def disconnects(server: uvicorn.Server) -> float:
    metric = server.config.app.state.edge.metrics.disconnects.labels(CONN_DISCONNECTED)
    return float(metric._value.get())


async def connect_then_leave(bus: Bus, store: ReplayLog, *, edge_protocol: bool,
                             check: Callable[[uvicorn.Server], None]) -> int:
    """``CLIENTS`` streams of a live run: ``check`` runs once all are attached, then the clients
    close their connections and each must be detached and counted as a disconnect; the tasks the
    connected clients added."""
    run = new_id()
    await append(bus, run, run_events(run, 3, end=None))
    async with served(bus, store, edge_protocol=edge_protocol) as (server, port):
        before = len(asyncio.all_tasks())
        streams = await open_streams(port, run, CLIENTS)
        hub = server.config.app.state.edge.hub
        await until(lambda: live_clients(hub, run) == CLIENTS, what="every client attached")
        tasks = len(asyncio.all_tasks()) - before
        check(server)
        for _, writer in streams:
            writer.close()
        await until(lambda: live_clients(hub, run) == 0, what="every client detached")
        await until(lambda: disconnects(server) == CLIENTS, what="each counted as a disconnect")
    return tasks


async def test_an_idle_stream_holds_no_task_of_its_own_and_no_deque(memory_bus: Bus, store: ReplayLog) -> None:
    """On the edge's protocol a connected client costs one task (uvicorn's, running the request),
    its connection's events keep their waiters in lists and its pipelined-request queue is a list;
    when the clients close their connections, each is detached and counted as a disconnect."""
    def light(server: uvicorn.Server) -> None:
        for protocol in server.server_state.connections:
            assert type(protocol.flow._is_writable_event) is LightEvent
            assert type(protocol.cycle.message_event) is LightEvent
            assert not isinstance(protocol.pipeline, collections.deque)

    assert await connect_then_leave(memory_bus, store, edge_protocol=True, check=light) <= CLIENTS + 2


async def test_on_another_server_a_task_watches_for_the_client_leaving(memory_bus: Bus, store: ReplayLog) -> None:
    """Served by uvicorn's own protocol (no ``runwire.disconnect`` extension), a stream watches
    ``receive()`` in a task of its own, and a client closing its connection is detached all the same."""
    tasks = await connect_then_leave(memory_bus, store, edge_protocol=False, check=lambda _: None)
    assert tasks >= 2 * CLIENTS


async def test_pipelined_requests_are_answered_in_order(memory_bus: Bus, store: ReplayLog) -> None:
    """Three requests written at once on one connection get their three answers in order (the
    protocol's queue of pipelined requests is a list standing in for uvicorn's deque)."""
    async with served(memory_bus, store, edge_protocol=True) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        paths = ["/healthz", "/v1/runs/nope/stream?detail=bogus", "/healthz"]
        writer.write(b"".join(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for path in paths))
        await writer.drain()
        statuses = []
        for _ in paths:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            statuses.append(int(head.split()[1]))
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
        writer.close()
    assert statuses == [200, 400, 200]


async def test_a_light_event_wakes_every_waiter_as_an_event_does() -> None:
    event = LightEvent()
    waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(waiter.done() for waiter in waiters) and len(event._waiters) == 3
    event.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert event._waiters == [] and event.is_set()
    event.clear()
    assert not event.is_set()


async def test_a_client_gone_before_its_stream_asks_is_told_at_once(memory_bus: Bus, store: ReplayLog) -> None:
    """A callback registered through ``runwire.disconnect`` after the connection was already lost
    is called at once (else that stream would serve nobody until its run ended)."""
    run = new_id()
    await append(memory_bus, run, run_events(run, 3, end=None))
    async with served(memory_bus, store, edge_protocol=True) as (server, port):
        (reader, writer), = await open_streams(port, run, 1)
        hub = server.config.app.state.edge.hub
        await until(lambda: live_clients(hub, run) == 1, what="the client attached")
        (protocol,) = server.server_state.connections
        register = protocol.cycle.scope["extensions"][DISCONNECT_EXTENSION]["register"]
        told: list[str] = []
        protocol._on_gone(types.SimpleNamespace(disconnected=True), lambda: told.append("late"))
        assert told == ["late"]
        writer.close()
        await until(lambda: live_clients(hub, run) == 0, what="the client detached")
        register(lambda: told.append("after"))
        assert told == ["late", "after"]


async def stream_bodies(port: int, run: str, count: int, started: Callable[[], Awaitable[None]]) -> list[bytes]:
    """The SSE bodies ``count`` clients of ``run`` receive until its end; ``started`` is awaited
    once every client is connected."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        async def one() -> bytes:
            async with http.stream("GET", f"/v1/runs/{run}/stream?detail=full") as response:
                return b"".join([chunk async for chunk in response.aiter_bytes()])
        readers = [asyncio.create_task(one()) for _ in range(count)]
        await started()
        return await asyncio.wait_for(asyncio.gather(*readers), 30)


async def publish_live(bus: Bus, hub: Hub, run: str) -> None:
    """Once every client of ``run`` waits for live frames: seqs 4–43 in ten appends, then the
    terminal event in a batch of its own (a batch that ends the run is the client's task's)."""
    await until(lambda: live_clients(hub, run) == CLIENTS, what="every client attached")
    clients = [client for stream in hub.streams.values() for feed in stream.feeds.values()
               for client in feed.clients]
    await until(lambda: all(c._waiter is not None for c in clients), what="every client waiting")
    for start in range(4, 41, 4):
        await append(bus, run, run_events(run, 4, start=start, end=None))
        await asyncio.sleep(0)
    await until(lambda: hub.streams[(run, "raw")].cursor == 43, what="seq 43 fanned out")
    await append(bus, run, run_events(run, 2, start=43, end="done")[1:])


async def test_live_frames_are_written_by_the_hub_without_waking_each_clients_task(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the edge's protocol (``runwire.write``) a live client's frames are written as the hub
    fans them out: its task, waiting for frames, sends none of them (it still sends the history
    and the terminal frame, which carries its drop count). On uvicorn's own protocol every frame
    goes through the task's ``send``. Both give each client the same bytes, every event once, in
    order."""
    sent: list[int | None] = []
    send = HttpSink.send

    async def counting(self: HttpSink, frames: list[Frame]) -> None:
        sent.extend(frame.seq for frame in frames)
        await send(self, frames)

    monkeypatch.setattr(HttpSink, "send", counting)
    bodies: dict[bool, list[bytes]] = {}
    for edge_protocol in (True, False):
        run = new_id()
        await append(memory_bus, run, run_events(run, 3, end=None))
        sent.clear()
        async with served(memory_bus, store, edge_protocol=edge_protocol) as (server, port):
            publish = functools.partial(publish_live, memory_bus, server.config.app.state.edge.hub, run)
            bodies[edge_protocol] = await stream_bodies(port, run, CLIENTS, publish)
        live = [seq for seq in sent if seq is not None and 4 <= seq <= 43]
        if edge_protocol:
            assert live == [], "live frames went through the task's send"
            assert sent.count(44) == CLIENTS  # the terminal frame: the task's
        else:
            assert len(live) == CLIENTS * 40
    for edge_protocol, received in bodies.items():
        assert len(set(received)) == 1, f"clients got different bytes (edge protocol: {edge_protocol})"
        ids = [int(line[4:]) for line in received[0].split(b"\n") if line.startswith(b"id: ")]
        assert ids == list(range(1, 45))


async def test_a_client_whose_direct_write_fails_gets_its_frames_from_its_task_and_no_other_loses_any(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct write that raises (for one client) queues that client's frames for its task, and
    every other client of the feed still gets the batch (the hub's fan-out goes on)."""
    write_now = HttpSink.write_now
    failing: list[HttpSink] = []

    def flaky(self: HttpSink, frames: list[Frame]) -> bool:
        if not failing:
            failing.append(self)
        if self is failing[0]:
            raise RuntimeError("a transport that refuses")
        return write_now(self, frames)

    monkeypatch.setattr(HttpSink, "write_now", flaky)
    run = new_id()
    await append(memory_bus, run, run_events(run, 3, end=None))
    async with served(memory_bus, store, edge_protocol=True) as (server, port):
        publish = functools.partial(publish_live, memory_bus, server.config.app.state.edge.hub, run)
        received = await stream_bodies(port, run, CLIENTS, publish)
    assert failing, "no direct write was tried"
    for body in received:
        assert [int(line[4:]) for line in body.split(b"\n") if line.startswith(b"id: ")] == list(range(1, 45))


async def two_keepalives(reader: asyncio.StreamReader) -> None:
    """Read a stream until two keepalive comments came."""
    received = b""
    while received.count(b": keepalive") < 2:
        chunk = await reader.read(4096)
        assert chunk, "the stream ended before two keepalives"
        received += chunk


async def test_an_idle_clients_keepalives_are_written_by_the_sweep_without_waking_its_task(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the edge's protocol the keepalive sweep writes an idle client's keepalive comment itself
    (clients that connected together fall due together: no burst of task wake-ups); on uvicorn's
    own protocol each client's task sends them. Either way every idle client gets them."""
    sent: list[str] = []
    keepalive = HttpSink.keepalive

    async def counting(self: HttpSink) -> None:
        sent.append("keepalive")
        await keepalive(self)

    monkeypatch.setattr(HttpSink, "keepalive", counting)
    for edge_protocol in (True, False):
        run = new_id()
        await append(memory_bus, run, run_events(run, 3, end=None))
        sent.clear()
        async with served(memory_bus, store, edge_protocol=edge_protocol,
                          settings=EdgeSettings(keepalive_s=0.2)) as (server, port):
            streams = await open_streams(port, run, CLIENTS)
            await asyncio.wait_for(asyncio.gather(*(two_keepalives(reader) for reader, _ in streams)), 30)
            for _, writer in streams:
                writer.close()
        if edge_protocol:
            assert sent == [], "a keepalive went through a client's task"
        else:
            assert len(sent) >= 2 * CLIENTS
