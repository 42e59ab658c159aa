"""The whole pipeline for end-to-end tests, on real services.

publisher SDK → Redis bus (a key prefix of its own) → two workers sharing a
consumer group (``run_worker`` tasks, each with its own bus connection) →
delivery streams + replay log → the edge served by uvicorn on a free port →
SSE / NDJSON clients (httpx).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.bus.keys import shard_for
from runwire.core.envelope import is_terminal
from runwire.edge import EdgeSettings
from runwire.sdk.publisher import Publisher
from runwire.store import open_store
from runwire.store.base import ReplayLog
from runwire.workers.runtime import WorkerStats, run_worker
from tests.edge.harness import EdgeServer, SseEvent, decoded, read_sse

GROUP = "e2e"
BUS_OPTIONS = "shards=4&lease_ms=1500&claim_idle_ms=1000"
"""Short leases and claim times, so a crashed worker's shards and entries move within seconds."""


def unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def same_shard(bus: Bus, run_id: str) -> str:
    """A new root run id on the same ingest shard as ``run_id``'s (the worker keeps a shard's order)."""
    candidates = (unique("marker") for _ in range(10_000))
    return next(c for c in candidates if shard_for(c, bus.shards) == shard_for(run_id, bus.shards))


def bus_url(redis_url: str, prefix: str, extra: str = "") -> str:
    sep = "&" if "?" in redis_url else "?"
    return f"{redis_url}{sep}prefix={prefix}&{BUS_OPTIONS}" + (f"&{extra}" if extra else "")


class Worker:
    """One ``run_worker`` task with a bus connection of its own; ``crash()`` cancels it mid-work."""

    def __init__(self, url: str, store: ReplayLog, name: str) -> None:
        self.url = url
        self.store = store
        self.name = name
        self.stop = asyncio.Event()
        self.task: asyncio.Task[WorkerStats] | None = None

    async def _run(self) -> WorkerStats:
        async with open_bus(self.url) as bus:
            return await run_worker(bus, self.store, group=GROUP, name=self.name, stop=self.stop)

    def start(self) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    async def crash(self) -> None:
        """Cancel the task wherever it is (mid-batch included): nothing in flight is acked."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def drain(self) -> WorkerStats | None:
        if self.task is None or self.task.done():
            return None
        self.stop.set()
        return await asyncio.wait_for(self.task, 20)


class Pipeline:
    """Handles on every piece of a running pipeline."""

    def __init__(self, url: str, bus: Bus, store: ReplayLog, edge: EdgeServer,
                 workers: list[Worker], publisher: Publisher) -> None:
        self.url = url
        self.bus = bus
        self.store = store
        self.edge = edge
        self.workers = workers
        self.publisher = publisher


@contextlib.asynccontextmanager
async def pipeline(
    redis_url: str, store_url: str, settings: EdgeSettings | None = None, *, workers: int = 2,
    bus_options: str = "",
) -> AsyncIterator[Pipeline]:
    """Start bus, workers, edge and a publisher; stop them all on exit."""
    url = bus_url(redis_url, unique("e2e"), bus_options)
    async with (
        open_bus(url) as bus,
        open_store(store_url) as worker_store,
        open_store(store_url) as edge_store,
        Publisher.connect(url, linger_ms=1.0) as publisher,
    ):
        pool = [Worker(url, worker_store, f"w{i + 1}") for i in range(workers)]
        for worker in pool:
            worker.start()
        edge = EdgeServer(bus, edge_store, settings or EdgeSettings())
        await edge.start()
        try:
            yield Pipeline(url, bus, edge_store, edge, pool, publisher)
        finally:
            await edge.stop()
            for worker in pool:
                await worker.drain()


async def sse(
    http: httpx.AsyncClient, url: str, *, headers: dict[str, str] | None = None, limit: int = 100_000
) -> list[SseEvent]:
    """Read an SSE stream until the server ends it (or ``limit`` events)."""
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, response.status_code
        events, _ = await read_sse(response, limit=limit)
    return events


async def ndjson(http: httpx.AsyncClient, url: str, *, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Read an NDJSON stream until the server ends it."""
    out: list[dict[str, Any]] = []
    async with http.stream("GET", url, headers={"Accept": "application/x-ndjson", **(headers or {})}) as response:
        assert response.status_code == 200, response.status_code
        async for line in response.aiter_lines():
            if line.strip():
                out.append(msgspec.json.decode(line))
    return out


async def wait_for_terminal(store: ReplayLog, run_id: str, within: float = 30.0) -> None:
    """Wait until the replay log has the run's terminal event."""
    async with asyncio.timeout(within):
        while True:
            info = await store.run(run_id)
            if info is not None and info.terminal:
                return
            await asyncio.sleep(0.05)


async def raw_stream_ids(bus: Bus, run_id: str) -> list[str]:
    """The ids of every event on the run's raw delivery stream (``bus.read`` returns a page)."""
    ids: list[str] = []
    after = 0
    while page := await bus.read((run_id, "raw"), after, 1000):
        ids += [event.id for event in page]
        after = page[-1].seq
    return ids


async def wait_for_stream_end(bus: Bus, run_id: str, within: float = 30.0) -> None:
    """Wait until the run's raw delivery stream has its own terminal event.

    A worker writes the replay log first and the delivery streams after it
    (``Stages.write``), so the log holding the terminal event says nothing
    yet about the stream: a test that reads the hot tier waits for this too.
    """
    async with asyncio.timeout(within):
        while True:
            bounds = await bus.bounds((run_id, "raw"))
            if bounds is not None:
                last = await bus.read((run_id, "raw"), bounds[1] - 1, 1)
                if last and last[-1].child_id is None and is_terminal(last[-1]):
                    return
            await asyncio.sleep(0.05)


__all__ = ["Pipeline", "Worker", "decoded", "ndjson", "pipeline", "sse", "unique", "wait_for_stream_end",
           "wait_for_terminal"]
