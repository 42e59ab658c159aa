"""Invariant 2 at Redis ``maxmemory``: a publish's entries on one ingest shard land all or none.

A publish of many events is several ingest entries per shard (64 events each). Were they
separate ``XADD``s, Redis at ``maxmemory`` could take one and refuse the next; were memory
freed in between (a worker acking and trimming), a later entry could even land after an
earlier one was refused. The publisher retries the whole batch, so the run's later events
would reach a worker before its earlier ones, which it then drops as duplicates of seqs it
has passed: acknowledged events lost. Here Redis is set just above its used memory, so a
first entry fits and a second does not; whatever the outcome, the shard holds none of the
batch or all of it, in order.
"""

from __future__ import annotations

from redis.asyncio import Redis

from runwire.bus import keys, open_bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.core.errors import BusFull
from tests.services import RedisServer

ENTRIES = 4
EVENTS = 64 * ENTRIES




def deltas(run_id: str) -> list[Event]:
    return [
        envelope.make("text.delta", {"text": f"{seq:05d}" + "x" * 2000}, id=f"evt_{seq:026d}",
                      ts="2026-01-01T00:00:00.000Z", run_id=run_id, seq=seq)
        for seq in range(1, EVENTS + 1)
    ]


async def test_a_publish_at_maxmemory_lands_on_its_shard_whole_or_not_at_all(
    own_redis: RedisServer, admin: Redis
) -> None:
    key = keys.ingest_key("rw", 0)
    async with open_bus(f"{own_redis.url}?shards=1") as bus:
        await bus.ping()
        outcomes = []
        for margin in (8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20):
            await admin.config_set("maxmemory", 0)
            await admin.delete(key)
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory", used + margin)
            try:
                await bus.publish(deltas(f"whole-{margin}"))
                landed = True
            except BusFull:
                landed = False
            await admin.config_set("maxmemory", 0)
            length = await admin.xlen(key)
            outcomes.append((margin, landed, length))
            assert length == (ENTRIES if landed else 0), outcomes
            if landed:
                break
        assert outcomes[-1][1], f"no margin let the publish land: {outcomes}"
        entries = await admin.xrange(key)
        seqs = [envelope.decode(line).seq for _id, fields in entries
                for line in fields[b"m"].split(b"\n")]
        assert seqs == list(range(1, EVENTS + 1))
