"""The edge's bus, with its short calls bounded: a crowd of requests queues instead of failing.

Every stream request makes a few short bus calls before it goes live — the run's bounds, its
first or last event, its history in batches (:mod:`runwire.edge.fanout.resume`, the gate's run
lookups) — and each holds one pooled connection while it runs. When an edge dies its thousands
of clients reconnect to the others within the same second; uncounted, those calls want a
connection each at once, and redis-py's pool (100 connections unless the URL's
``max_connections`` says otherwise) refuses the 101st at once ("Too many connections", a
retriable ``BusUnavailable``): the resume is answered ``503`` — which a browser's
``EventSource`` takes as final and stops. :class:`GatedBus` lets at most
:data:`SHORT_CALLS` short calls of one edge process run at a time; the others wait their turn
(a resume is a few milliseconds), so a reconnect storm is served in waves, in order, with a
bounded number of Redis connections. The long calls — the hub's one multiplexed ``tail``,
control subscriptions — pass through: they hold a connection for their whole wait and are
counted by what opens them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

from ...bus.base import Bus, Consumer, ControlCommand, DeadLetter, Routed, StreamKey
from ...core.envelope import Event

SHORT_CALLS = 64
"""Short bus calls one edge process runs at once: below redis-py's default pool of 100, leaving
room for the hub's tail, control subscriptions and ingest's publishes."""


class GatedBus(Bus):
    """``bus`` with :data:`SHORT_CALLS` of its short calls at a time (see the module docstring)."""

    def __init__(self, bus: Bus, limit: int = SHORT_CALLS) -> None:
        self.inner = bus
        self.url = bus.url
        self.shards = bus.shards
        self.max_deliveries = bus.max_deliveries
        self.claim_idle_ms = bus.claim_idle_ms
        self.checkpoint_grace_s = bus.checkpoint_grace_s
        self._calls = asyncio.Semaphore(limit)

    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> None:
        async with self._calls:
            await self.inner.ping()

    async def ingest_lost(self) -> dict[str, int]:
        async with self._calls:
            return await self.inner.ingest_lost()

    def shard_of(self, event: Routed) -> int:
        return self.inner.shard_of(event)

    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None:
        async with self._calls:
            await self.inner.publish(events, data)

    def consumer(self, group: str, name: str, *, claim_idle_ms: int | None = None) -> Consumer:
        return self.inner.consumer(group, name, claim_idle_ms=claim_idle_ms)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        async with self._calls:
            return await self.inner.dead_letters(limit)

    async def append(self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None) -> int:
        async with self._calls:
            return await self.inner.append(key, events, state=state)

    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]:
        async with self._calls:
            return await self.inner.load_states(keys)

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        async with self._calls:
            return await self.inner.read(key, after, limit)

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        async with self._calls:
            return await self.inner.bounds(key)

    async def tail(
        self, cursors: Mapping[StreamKey, int], block_ms: int = 1000
    ) -> list[tuple[StreamKey, Event]]:
        return await self.inner.tail(cursors, block_ms)

    async def send_control(self, command: ControlCommand) -> None:
        async with self._calls:
            await self.inner.send_control(command)

    def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        return self.inner.controls(run_id, after=after)
