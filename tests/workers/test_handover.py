"""Shards leaving a worker take with them what it processed and has not written yet.

A member gives shards up at a rebalance (another member joined) or loses them when a lease
expires (a full or unreachable Redis); either way their next owner redoes the unacked entries
from the stored checkpoints. A worker that still wrote what it held for them numbered the same
runs as the new owner, and whichever appended second lost its events as duplicates by seq —
acknowledged events gone, with no ``x.gap`` (an operator's check: two workers on a Redis full
for 25 s lost thousands of deltas in 4 runs of 6). Real Redis, the worker's own loop and stages.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from runwire.bus import open_bus
from runwire.bus.keys import lease_key
from runwire.core.errors import LeasesLost
from runwire.processing.processor import Processor
from runwire.processing.stages import Stages
from runwire.processing.worker_loop import ConsumerLoop
from runwire.store import ReplayLog
from tests.events import event
from tests.services import RedisServer
from tests.waiting import until
from tests.workers.checks import read_all
from tests.workers.test_bus_full import FULL


async def test_shards_given_up_at_a_rebalance_take_the_unwritten_work_with_them(
    redis_url: str, store: ReplayLog
) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}&shards=1&lease_ms=900&claim_idle_ms=500"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with open_bus(url) as bus:
        mine = bus.consumer("g", "b")  # of two members sorted a, b: shard 0 is a's share
        stages = Stages(bus, store, Processor(), asyncio.Event(), dead_letter=mine.dead_letter)
        loop = ConsumerLoop(mine, stages)
        await bus.publish([event(run_id, s, text=f"t{s} ") for s in range(1, 6)])
        deliveries = await mine.fetch(100, block_ms=100, whole=True)  # alone: it takes shard 0
        assert not await loop._check_ownership() and loop._owned == frozenset({0})
        acked, _ = await stages.prepare(deliveries, loop.writes.drain_for, into=loop._pending_outputs)
        loop.writes.add(acked, len(deliveries))  # processed, not written yet
        assert run_id in loop.writes.pending

        other = bus.consumer("g", "a")
        await other.fetch(10, block_ms=10)  # joins; shard 0 is still leased to b
        assert other.owned_shards() == frozenset()

        async def given_up() -> bool:  # b's next rebalance gives shard 0 up to a's share
            await mine.fetch(10, block_ms=10, whole=True)
            return 0 not in mine.owned_shards()

        await until(given_up, within=10, what="shard 0 given up at a rebalance")
        assert await loop._check_ownership(), "the unwritten work is dropped"
        assert not loop.writes.pending and not loop.writes.pending_acks
        assert await store.read(run_id, 0, None) == []  # nothing written beside the new owner
        admin = Redis.from_url(redis_url)
        try:
            pending = await admin.xpending(f"{{{prefix}:ingest:0}}", "g")
            assert pending["pending"] == len({d.entry_id for d in deliveries})  # left for a to redo
        finally:
            await admin.aclose()
        await other.close()
        await mine.close()


async def test_a_write_held_through_a_pause_longer_than_the_leases_is_not_made(
    own_redis: RedisServer, admin: Redis, store: ReplayLog
) -> None:
    """Redis full while a worker's write waits: renewing the lease is a write too, so the lease
    lapses. Once memory is back the write is tried again only after a renewal, which finds the
    lease gone: the write is dropped (``LeasesLost``) with everything the worker held, and its
    entries stay pending for the shard's next owner, who writes them once. (It used to go
    through at once, beside a new owner that could have loaded the checkpoints before it.)"""
    prefix = f"h{uuid.uuid4().hex[:8]}"
    url = f"{own_redis.url}?prefix={prefix}&shards=1&lease_ms=900&claim_idle_ms=500"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with open_bus(url) as bus:
        mine = bus.consumer("g", "b")
        stages = Stages(bus, store, Processor(), asyncio.Event(), dead_letter=mine.dead_letter)
        loop = ConsumerLoop(mine, stages)
        await bus.publish([event(run_id, s, text=f"t{s} ") for s in range(1, 6)])
        deliveries = await mine.fetch(100, block_ms=100, whole=True)
        assert not await loop._check_ownership() and loop._owned == frozenset({0})
        acked, _ = await stages.prepare(deliveries, loop.writes.drain_for, into=loop._pending_outputs)
        loop.writes.add(acked, len(deliveries))

        await admin.config_set("maxmemory", FULL)  # the views and every renewal refused
        flushing = asyncio.create_task(loop.writes.flush())
        await until(lambda: stages.outage.retried.get("bus full", 0) >= 1, what="the write paused")
        lease = lease_key(prefix, "g", 0)
        await until(lambda: _gone(admin, lease), within=15, what="the lease lapsed")
        await admin.config_set("maxmemory", 0)
        with pytest.raises(LeasesLost):
            await asyncio.wait_for(flushing, 60)
        assert await read_all(bus, run_id) == []  # the views were not written
        assert await loop._check_ownership(), "what it held is dropped"
        assert not loop.writes.pending and 0 not in mine.owned_shards()

        other = bus.consumer("g", "a")  # the next owner: claims the entries once idle, redoes them
        successor = Stages(bus, store, Processor(), asyncio.Event(), dead_letter=other.dead_letter)
        next_loop = ConsumerLoop(other, successor)

        async def redone() -> bool:
            await next_loop._step(100, 100, 1000, burst=False)
            return [e.seq for e in await read_all(bus, run_id)] == [1, 2, 3, 4, 5]

        await until(redone, within=20, what="the next owner wrote the run")
        assert [e.seq for e in await store.read(run_id, 0, None)] == [1, 2, 3, 4, 5]
        await other.close()
        await mine.close()


async def _gone(admin: Redis, key: str) -> bool:
    return not await admin.exists(key)
