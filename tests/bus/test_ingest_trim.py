"""Invariant 7 (bounded by live work) on the Redis ingest shards: an entry leaves its shard
once every consumer group reading it has acked it (``XTRIM MINID`` to the oldest group's
safe point), never before; ``ingest_maxlen`` stays the cap for a group that lags, and what a
group loses to the cap is counted and exported in the edge's ``/metrics``."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from redis.asyncio import Redis

from runwire.bus import Bus, keys, open_bus
from runwire.bus.base import Consumer, Delivery
from runwire.core.envelope import decode
from runwire.store.base import ReplayLog
from tests.edge.harness import serve_edge
from tests.events import event

NODE = 100
"""Redis trims approximately (``~``): whole stream nodes of up to 100 entries."""


def url_of(redis_url: str, options: str = "") -> str:
    return f"{redis_url}?prefix=t{uuid.uuid4().hex[:10]}&shards=1" + (f"&{options}" if options else "")


async def publish_entries(bus: Bus, run_id: str, first: int, count: int) -> None:
    """``count`` entries, one event each (one publish call per event)."""
    for seq in range(first, first + count):
        await bus.publish([event(run_id, seq)])


async def take(consumer: Consumer, want: int, *, ack: bool = True) -> list[Delivery]:
    got: list[Delivery] = []
    async with asyncio.timeout(20):
        while len(got) < want:
            batch = await consumer.fetch(max_count=min(500, want - len(got)), block_ms=100)
            got += batch
            if ack and batch:
                await consumer.ack(batch)
    return got


async def shard_length(redis: Redis, bus: Bus) -> int:
    return int(await redis.xlen(keys.ingest_key(bus.prefix, 0)))  # type: ignore[attr-defined]


async def test_ingest_entries_leave_the_shard_once_every_group_acked_them(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    async with open_bus(url_of(redis_url)) as bus:
        fast, slow = bus.consumer("fast", "a"), bus.consumer("slow", "b")
        for consumer in (fast, slow):  # both groups exist before anything is published
            assert await consumer.fetch(10, block_ms=10) == []
        await publish_entries(bus, "run-trim", 1, 3 * NODE)

        await take(fast, 3 * NODE)
        assert await shard_length(redis, bus) == 3 * NODE  # "slow" has acked nothing yet

        half = await take(slow, 3 * NODE // 2)
        length = await shard_length(redis, bus)
        assert 3 * NODE // 2 <= length <= 2 * NODE  # trimmed to slow's safe point, ~ a node
        remaining = await take(slow, 3 * NODE // 2, ack=False)  # nothing unacked was trimmed
        assert [decode(d.data).seq for d in half + remaining] == list(range(1, 3 * NODE + 1))
        await slow.ack(remaining)

        async with asyncio.timeout(20):  # live traffic goes on; owners trim as they ack
            seq = 3 * NODE
            while await shard_length(redis, bus) > NODE + 1:
                seq += 1
                await publish_entries(bus, "run-trim", seq, 1)
                await take(fast, 1)
                await take(slow, 1)
                await asyncio.sleep(0.1)
        for consumer in (fast, slow):
            await consumer.close()
    await redis.aclose()


async def test_a_lagging_group_loses_entries_only_to_the_cap_and_the_loss_is_in_metrics(
    redis_url: str, store: ReplayLog
) -> None:
    cap = 50
    redis = Redis.from_url(redis_url)
    async with open_bus(url_of(redis_url, f"ingest_maxlen={cap}")) as bus:
        live, stuck = bus.consumer("live", "a"), bus.consumer("stuck", "b")
        for consumer in (live, stuck):
            assert await consumer.fetch(10, block_ms=10) == []
        published = 0
        for _ in range(30):  # the live group keeps up: each chunk is read before the cap bites
            await publish_entries(bus, "run-cap", published + 1, cap // 2)
            published += cap // 2
            await take(live, cap // 2)
        length = await shard_length(redis, bus)
        assert length <= cap + 2 * NODE  # the cap bounds the shard for the lagging group

        async with asyncio.timeout(20):
            while True:
                lost = await bus.ingest_lost()
                if lost.get("stuck") == published - await shard_length(redis, bus):
                    break
                await publish_entries(bus, "run-cap", published + 1, 1)  # the live group acks on
                published += 1
                await take(live, 1)
                await asyncio.sleep(0.1)
        assert "live" not in lost  # it read everything before the cap removed it
        async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
            metrics = (await http.get(f"{edge.url}/metrics")).text
        assert f'runwire_ingest_lost_entries{{group="stuck"}} {float(lost["stuck"])}' in metrics
        for consumer in (live, stuck):
            await consumer.close()
    await redis.aclose()
