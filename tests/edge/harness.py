"""Serve the edge for real: uvicorn on a free loopback port, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import msgspec
import uvicorn

from runwire.bus.base import Bus
from runwire.core.envelope import Event
from runwire.edge import EdgeSettings, create_app, issue_token
from runwire.edge.fanout.hub import Hub
from runwire.edge.http.server import edge_config
from runwire.sdk.publisher import Run
from runwire.store.base import ReplayLog
from tests.events import event as event  # the one test event factory, also importable from here
from tests.services import free_port as free_port  # restartable on the same port
from tests.waiting import until

SECRET = "test-secret-please-rotate-0123456789abcdef"
RUN_A = "run-tenant-a"
RUN_B = "run-tenant-b"


def loopback_config(app: Any, port: int) -> uvicorn.Config:
    """uvicorn serving ``app`` on a loopback port as ``runwire edge`` serves it (its protocol,
    ``edge_config``), and as tests want it: quiet, no pings, quick to stop."""
    return edge_config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                       ws_ping_interval=None, timeout_graceful_shutdown=0.5)


class LoopbackServer(uvicorn.Server):
    """uvicorn's server, stopping as soon as a test asks.

    uvicorn's serve loop looks at ``should_exit`` every 0.1 s, and its shutdown
    pauses a fixed 0.1 s after telling the connections to close: ~0.15 s for
    each of the several hundred edges the suite starts. Here the loop wakes on
    the stop itself and shutdown waits for the connections to close (what the
    pause is for), up to ``timeout_graceful_shutdown`` as uvicorn does, then
    cancels what is left and runs the app's lifespan shutdown.
    ``runwire up`` (tests/ops) runs uvicorn's own server.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stop_requested = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self.stop_requested.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # (the date header, once a second)
            counter += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self.stop_requested.wait()

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        state = self.server_state
        with contextlib.suppress(AssertionError):  # (past the grace: cancelled below, as uvicorn does)
            await until(lambda: not (state.connections or state.tasks),
                        within=self.config.timeout_graceful_shutdown or 0.0)
        for task in state.tasks:
            task.cancel(msg="the test server stopped")
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


async def start_uvicorn(config: uvicorn.Config) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """``config``'s server running in this loop, once it listens, and its task."""
    server = LoopbackServer(config)
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), within=10, what="the edge listening")
    if not server.started:
        raise RuntimeError(f"the edge did not start: {task.exception()}")
    return server, task


async def stop_uvicorn(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    server.should_exit = True
    if isinstance(server, LoopbackServer):
        server.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


class EdgeServer:
    """A running edge: ``url`` to talk to it, ``stop()`` / ``start()`` to restart it on the same port."""

    def __init__(self, bus: Bus, store: ReplayLog, settings: EdgeSettings, port: int | None = None) -> None:
        self.bus = bus
        self.store = store
        self.settings = settings
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = create_app(self.bus, self.store, self.settings)
        self.server, self.task = await start_uvicorn(loopback_config(app, self.port))

    @property
    def edge(self) -> Any:
        """The running app's :class:`~runwire.edge.service.context.Edge` (its hub, quotas, throttles)."""
        assert self.server is not None
        return self.server.config.app.state.edge

    def live_clients(self, run_id: str) -> int:
        """Clients attached to the run's streams in this edge's hub (live, in every view and format)."""
        return live_clients(self.edge.hub, run_id)

    async def stop(self) -> None:
        if self.server is None or self.task is None:
            return
        await stop_uvicorn(self.server, self.task)
        self.server = None


def live_clients(hub: Hub, run_id: str) -> int:
    """Clients ``hub`` queues the run's live frames for (every view): a test waits for this
    before it publishes what a client must receive live."""
    return sum(len(feed.clients) for (run, _view), stream in hub.streams.items() if run == run_id
               for feed in stream.feeds.values())


@contextlib.asynccontextmanager
async def serve_edge(
    bus: Bus, store: ReplayLog, settings: EdgeSettings | None = None
) -> AsyncIterator[EdgeServer]:
    server = EdgeServer(bus, store, settings or EdgeSettings())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def run_events(run_id: str, count: int, *, end: str | None = "done", start: int = 1, **extra: Any) -> list[Event]:
    """``count`` events: running, deltas and a tool call, then (optionally) a terminal lifecycle."""
    out: list[Event] = []
    for seq in range(start, start + count):
        if seq == 1:
            out.append(event(run_id, seq, "run.lifecycle", {"state": "running"}, **extra))
        elif seq == start + count - 1 and end:
            out.append(event(run_id, seq, "run.lifecycle", {"state": end}, **extra))
        else:
            out.append(event(run_id, seq, "text.delta", **extra))
    return out


async def append(bus: Bus, run_id: str, events: Sequence[Event], view: str = "raw") -> None:
    await bus.append((run_id, view), list(events))  # type: ignore[arg-type]


class SseEvent(msgspec.Struct):
    data: str
    id: str | None = None
    event: str | None = None


async def two_tenants_runs(bus: Bus, store: ReplayLog) -> None:
    """One finished run (``run_events``, four events) of each tenant, ``RUN_A`` of A and
    ``RUN_B`` of B, in the replay log and in their delivery streams."""
    for run_id, tenant in ((RUN_A, "A"), (RUN_B, "B")):
        events = run_events(run_id, 4, tenant=tenant)
        await store.append(events)
        await append(bus, run_id, events)


def token(tenant: str, *scopes: str, runs: list[str] | None = None, ttl: float = 600) -> str:
    """A token of ``SECRET`` for ``tenant`` (scope ``read`` unless others are named)."""
    return issue_token(SECRET, tenant=tenant, runs=runs, scopes=scopes or ("read",), ttl_s=ttl)


def controls_received(
    run: Run, count: int
) -> tuple[list[tuple[str, dict[str, Any]]], asyncio.Task[None]]:
    """An agent reading ``run``'s control channel from its start: what it received
    (command, args), filled in until ``count`` came, and its task (done then)."""
    received: list[tuple[str, dict[str, Any]]] = []

    async def agent() -> None:
        async for command in run.controls(after="0"):
            received.append((command.command, command.args))
            if len(received) == count:
                return

    return received, asyncio.create_task(agent())


async def publish(bus: Bus, store: ReplayLog, events: Sequence[Event]) -> None:
    """What a worker writes: the replay log, the raw and the shaped delivery stream."""
    await store.append(events)
    await bus.append((events[0].run_id, "raw"), list(events))
    await bus.append((events[0].run_id, "shaped"), list(events))


async def read_sse(
    response: httpx.Response, *, until_terminal: bool = True, limit: int = 100_000
) -> tuple[list[SseEvent], list[str]]:
    """Parse an SSE body as it streams: (events, comment lines)."""
    events: list[SseEvent] = []
    comments: list[str] = []
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            comments.append(line)
            continue
        if line == "":
            if "data" in fields or "id" in fields:
                events.append(SseEvent(data=fields.get("data", ""), id=fields.get("id"), event=fields.get("event")))
            fields = {}
            if len(events) >= limit:
                break
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value
    return events, comments


def decoded(events: list[SseEvent]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in events:
        if e.data and e.data != "[DONE]":
            out.append(msgspec.json.decode(e.data))
    return out
