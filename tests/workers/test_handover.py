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

from redis.asyncio import Redis

from runwire.bus import open_bus
from runwire.processing.processor import Processor
from runwire.processing.stages import Stages
from runwire.processing.worker_loop import ConsumerLoop
from runwire.store import ReplayLog
from tests.events import event
from tests.waiting import until


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
