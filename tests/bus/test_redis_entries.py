"""Redis delivery streams hold several events per entry; resume stays exact to the seq.

DESIGN invariants 2 (no loss, no duplicates) and 3 (contiguous seq) for the
hot tier a client resumes from (Koder agent stream §4, resume after a seq).
"""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from pipeline.bus import open_bus
from pipeline.bus.base import StreamKey
from pipeline.bus.keys import delivery_key, meta_key
from pipeline.bus.redis_entries import ENTRY_EVENTS
from pipeline.envelope import Event, encode, make


def event(run_id: str, seq: int) -> Event:
    return make("text.delta", {"text": f"{run_id}:{seq}"}, id=f"evt_{run_id}_{seq:06d}",
                ts="2026-01-01T00:00:00.000Z", run_id=run_id, seq=seq)


@pytest.fixture
def prefix() -> str:
    return "e" + uuid.uuid4().hex[:10]


async def test_an_append_is_one_entry_per_512_events(redis_url: str, prefix: str) -> None:
    key: StreamKey = ("run-one", "raw")
    async with open_bus(f"{redis_url}?prefix={prefix}") as bus:
        assert await bus.append(key, [event("run-one", s) for s in range(1, 601)]) == 600
        client = Redis.from_url(redis_url)
        try:
            entries = await client.xrange(delivery_key(prefix, *key))
        finally:
            await client.aclose()
        assert [entry_id for entry_id, _ in entries] == [b"%d-0" % ENTRY_EVENTS, b"600-0"]
        assert [e.seq for e in await bus.read(key, 0)] == list(range(1, 601))


async def test_reading_after_any_seq_is_exact_inside_an_entry(redis_url: str, prefix: str) -> None:
    """Every resume point, also in the middle of an entry, yields exactly the events after it."""
    raw: StreamKey = ("run-mid", "raw")
    shaped: StreamKey = ("run-mid", "shaped")
    events = [event("run-mid", s) for s in range(1, 41)]
    sparse = [event("run-mid", s) for s in (3, 7, 8, 20, 31, 40)]
    async with open_bus(f"{redis_url}?prefix={prefix}") as bus:
        for start in range(0, 40, 10):
            await bus.append(raw, events[start:start + 10])
        await bus.append(shaped, sparse[:3])
        await bus.append(shaped, sparse[3:])
        for after in range(0, 41):
            assert await bus.read(raw, after) == events[after:]
            assert await bus.read(raw, after, limit=3) == events[after:after + 3]
            assert await bus.read(shaped, after) == [e for e in sparse if e.seq > after]
            tailed = await bus.tail({raw: after, shaped: after}, block_ms=10)
            assert [e for k, e in tailed if k == raw] == events[after:]
            assert [e for k, e in tailed if k == shaped] == [e for e in sparse if e.seq > after]
        assert await bus.bounds(raw) == (1, 40)
        assert await bus.bounds(shaped) == (3, 40)


async def test_single_event_entries_of_the_earlier_format_are_still_read(
    redis_url: str, prefix: str,
) -> None:
    """A stream written before multi-event entries (one event per entry, id = its seq) reads
    as before, and appends continue after it without a duplicate."""
    key: StreamKey = ("run-old", "raw")
    old = [event("run-old", s) for s in range(1, 6)]
    client = Redis.from_url(redis_url)
    try:
        for e in old:
            await client.xadd(delivery_key(prefix, *key), {"e": encode(e)}, id=f"{e.seq}-0")
        await client.hset(meta_key(prefix, *key), "last", 5)
    finally:
        await client.aclose()
    new = [event("run-old", s) for s in range(4, 11)]
    async with open_bus(f"{redis_url}?prefix={prefix}") as bus:
        assert await bus.append(key, new) == 5
        assert await bus.read(key, 0) == old + new[2:]
        assert await bus.read(key, 3, limit=4) == [*old[3:], *new[2:4]]
        assert await bus.bounds(key) == (1, 10)
        assert [e.seq for _, e in await bus.tail({key: 2}, block_ms=10)] == list(range(3, 11))


async def test_an_append_after_the_meta_was_lost_adds_no_duplicate(
    redis_url: str, prefix: str,
) -> None:
    """Should the meta hash (the stream's last seq) vanish, e.g. evicted, the stream's own
    last entry still keeps a retried append from doubling events."""
    key: StreamKey = ("run-lost", "raw")
    async with open_bus(f"{redis_url}?prefix={prefix}") as bus:
        await bus.append(key, [event("run-lost", s) for s in range(1, 11)])
        client = Redis.from_url(redis_url)
        try:
            await client.delete(meta_key(prefix, *key))
        finally:
            await client.aclose()
        assert await bus.append(key, [event("run-lost", s) for s in range(6, 16)]) == 5
        assert await bus.append(key, [event("run-lost", s) for s in range(1, 9)]) == 0
        assert [e.seq for e in await bus.read(key, 0)] == list(range(1, 16))
