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
from runwire.edge import EdgeSettings, create_app
from runwire.edge.hub import Hub
from runwire.store.base import ReplayLog
from tests.events import event as event  # the one test event factory, also importable from here
from tests.services import free_port as free_port  # restartable on the same port


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
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
            ws_ping_interval=None, timeout_graceful_shutdown=0.5,
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve())
        for _ in range(200):
            if self.server.started:
                return
            await asyncio.sleep(0.02)
        raise RuntimeError("edge did not start")

    def live_clients(self, run_id: str) -> int:
        """Clients attached to the run's streams in this edge's hub (live, in every view and format)."""
        assert self.server is not None
        return live_clients(self.server.config.app.state.edge.hub, run_id)

    async def stop(self) -> None:
        if self.server is None or self.task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)
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
