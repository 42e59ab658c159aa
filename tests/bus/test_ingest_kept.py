"""Invariant 2 when Redis loses what it acknowledged: the publishing process publishes it again.

Redis restarted without persistence (or flushed, or failed over to a replica that missed the
last writes) no longer has ingest entries it acknowledged, and a worker that had not read them
never will. A publishing process keeps each entry until every consumer group has read it
(``runwire.bus.redis.retain``): its next publish to the shard, or its confirming task, finds the
newest kept entry gone and publishes what Redis lost again, before anything newer — so a run's
events reach the worker all, in order. What a group has read is let go.
"""

from __future__ import annotations

import functools
import logging

import pytest
from redis.asyncio import Redis

from runwire.bus import keys, open_bus
from runwire.bus.base import Consumer, Delivery
from runwire.bus.redis.bus import RedisBus
from runwire.core.envelope import decode
from tests.bus.test_contract import _retry, drain
from tests.events import event
from tests.services import RedisServer
from tests.waiting import until

ONE_SHARD = "?shards=1&claim_idle_ms=500&lease_ms=1000"


def seqs(deliveries: list[Delivery]) -> list[int]:
    return [decode(d.data).seq for d in deliveries]


async def fetch_all(consumer: Consumer, want: int) -> list[Delivery]:
    got: list[Delivery] = []
    for _ in range(30):
        got += await _retry(functools.partial(drain, consumer, want - len(got), within=1))  # type: ignore[misc]
        if len(got) >= want:
            break
    return got


async def test_entries_redis_lost_in_a_restart_are_published_again_before_the_next(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwire.bus")
    async with open_bus(own_redis.url + ONE_SHARD) as bus:
        reader = bus.consumer("g", "c")
        await reader.fetch(10, block_ms=10)  # the group exists; it has read nothing
        await bus.publish([event("run-k", s) for s in range(1, 6)])
        own_redis.restart()  # acknowledged, unread, gone

        async def publish_more() -> None:
            await bus.publish([event("run-k", s) for s in range(6, 9)])

        await _retry(publish_more)
        got = await fetch_all(reader, 8)
        await reader.close()
    assert seqs(got) == list(range(1, 9))
    assert any("published them again" in r.getMessage() for r in caplog.records)


async def test_a_publisher_that_sends_nothing_more_still_publishes_again_what_redis_lost(
    own_redis: RedisServer,
) -> None:
    """A run's last events, then silence: the confirming task finds them lost."""
    async with open_bus(own_redis.url + ONE_SHARD) as bus:
        assert isinstance(bus, RedisBus)
        reader = bus.consumer("g", "c")
        await reader.fetch(10, block_ms=10)
        for s in range(1, 4):  # three entries
            await bus.publish([event("run-q", s)])
        own_redis.restart()
        got = await fetch_all(reader, 3)
        await reader.close()
        assert bus.kept.republished == 3
    assert seqs(got) == [1, 2, 3]


async def test_what_a_group_read_is_let_go_and_never_published_again(own_redis: RedisServer) -> None:
    async with open_bus(own_redis.url + ONE_SHARD) as bus:
        assert isinstance(bus, RedisBus)
        reader = bus.consumer("g", "c")
        await bus.publish([event("run-r", s) for s in range(1, 6)])
        assert bus.kept.bytes > 0
        assert seqs(await drain(reader, 5)) == [1, 2, 3, 4, 5]
        await until(lambda: bus.kept.bytes == 0, within=5, what="kept entries let go once read")
        own_redis.restart()

        async def publish_more() -> None:
            await bus.publish([event("run-r", s) for s in range(6, 8)])

        await _retry(publish_more)
        got = await fetch_all(reader, 2)
        await reader.close()
        assert bus.kept.republished == 0
    assert seqs(got) == [6, 7]


async def test_a_lost_tail_is_found_in_the_same_life_and_a_trimmed_head_is_not_taken_for_lost(
    own_redis: RedisServer,
) -> None:
    """A replica promoted without the last writes loses a suffix of the stream while the
    shard's life marker stays (here: the suffix deleted); a prefix trimmed after every group
    read it is not a loss."""
    key = keys.ingest_key("rw", 0)
    admin = Redis.from_url(own_redis.url)
    try:
        async with open_bus(own_redis.url + ONE_SHARD + "&retain_bytes=1000000") as bus:
            assert isinstance(bus, RedisBus)
            reader = bus.consumer("g", "c")
            await reader.fetch(10, block_ms=10)
            for s in range(1, 5):  # four entries
                await bus.publish([event("run-t", s)])
            entries = await admin.xrange(key)
            await admin.xdel(key, *[entry_id for entry_id, _ in entries[2:]])  # the tail: 3, 4
            await bus.publish([event("run-t", 5)])
            assert bus.kept.republished == 2
            got = await drain(reader, 5)
            assert seqs(got) == [1, 2, 3, 4, 5]
            newest = (await admin.xrange(key))[-1][0]
            await admin.xtrim(key, minid=newest)  # every entry read; all but the newest trimmed
            await bus.publish([event("run-t", 6)])
            assert seqs(await drain(reader, 1)) == [6]
            assert bus.kept.republished == 2
            await reader.close()
    finally:
        await admin.aclose()


async def test_past_retain_bytes_the_oldest_are_let_go_and_counted(own_redis: RedisServer) -> None:
    async with open_bus(own_redis.url + ONE_SHARD + "&retain_bytes=4000") as bus:
        assert isinstance(bus, RedisBus)
        for s in range(1, 41):
            await bus.publish([event("run-b", s, text="x" * 200)])
        assert 0 < bus.kept.bytes <= 4000
        assert bus.kept.unprotected > 0
