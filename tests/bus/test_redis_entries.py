"""Redis streams hold several events per entry: delivery streams (resume stays exact to
the seq) and ingest streams (an entry is acked once every event of it is done).

Invariants 2 (no loss, no duplicates) and 3 (contiguous seq) for the
hot tier a client resumes from (Koder agent stream §5.1 and §7 T3: resume after a seq),
and for the ingest entries workers ack.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from runwire.bus import open_bus
from runwire.bus.base import Delivery, StreamKey
from runwire.bus.keys import delivery_key, ingest_key, meta_key
from runwire.bus.redis import bus as redis_bus
from runwire.bus.redis import entries as redis_entries
from runwire.bus.redis.entries import ENTRY_EVENTS
from runwire.bus.redis.link import resp_evalsha
from runwire.core.envelope import decode, encode
from runwire.core.lines import encode_lines
from tests.events import event


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


# ---- ingest entries of several events ---------------------------------------------


async def test_a_published_batch_is_one_ingest_entry_per_shard_and_64_events(
    redis_url: str, prefix: str,
) -> None:
    async with open_bus(f"{redis_url}?prefix={prefix}&shards=1") as bus:
        await bus.publish([event("run-in", s) for s in range(1, 101)])
        await bus.publish([event("run-in", 101)])
        client = Redis.from_url(redis_url)
        try:
            entries = await client.xrange(ingest_key(prefix, 0))
        finally:
            await client.aclose()
        assert [sorted(fields) for _, fields in entries] == [[b"m"], [b"m"], [b"e"]]
        async with bus.consumer("g", "c") as consumer:
            got = []
            while len(got) < 101:
                got += await consumer.fetch(1000, block_ms=100)
        assert [decode(d.data).seq for d in got] == list(range(1, 102))
        assert len({d.entry_id for d in got}) == 3


async def test_an_entry_of_several_events_is_acked_once_all_of_them_are(
    redis_url: str, prefix: str,
) -> None:
    """Acking some events of an entry leaves it pending; dead-lettering one event keeps
    the others pending until they are acked; an entry all of whose events are poison is
    acked by the last dead letter."""
    url = f"{redis_url}?prefix={prefix}&shards=1&claim_idle_ms=100000"
    async with open_bus(url) as bus:
        await bus.publish([event("run-ack", s) for s in range(1, 4)])
        await bus.publish([event("run-ack", s) for s in range(4, 6)])
        client = Redis.from_url(redis_url)

        async def pending() -> int:
            return int((await client.xpending(ingest_key(prefix, 0), "g"))["pending"])

        try:
            async with bus.consumer("g", "c") as consumer:
                first, second = [], []
                while len(first) + len(second) < 5:
                    for d in await consumer.fetch(100, block_ms=100):
                        (first if decode(d.data).seq <= 3 else second).append(d)
                assert await pending() == 2
                await consumer.ack(first[:2])
                await consumer.dead_letter(second[0], "bad")
                assert await pending() == 2
                await consumer.ack(first[2:])
                assert await pending() == 1
                await consumer.dead_letter(second[1], "bad too")
                assert await pending() == 0
        finally:
            await client.aclose()
        assert [d.reason for d in await bus.dead_letters()] == ["bad too", "bad"]


async def test_a_worker_fetches_an_entry_of_several_events_whole_and_acks_it_once(
    redis_url: str, prefix: str,
) -> None:
    """``fetch(whole=True)`` hands an entry out as one delivery holding its events' lines
    (``count`` of them, ``max_count`` still counting events); acking it acks the entry,
    and after one of its events was dead-lettered on its own, acking the rest does."""
    url = f"{redis_url}?prefix={prefix}&shards=1&claim_idle_ms=100000"
    async with open_bus(url) as bus:
        first = [event("run-whole", s) for s in range(1, 4)]
        second = [event("run-whole", s) for s in range(4, 6)]
        await bus.publish(first)
        await bus.publish(second)
        await bus.publish([event("run-whole", 6)])
        client = Redis.from_url(redis_url)

        async def pending() -> int:
            return int((await client.xpending(ingest_key(prefix, 0), "g"))["pending"])

        try:
            async with bus.consumer("g", "c") as consumer:
                got: list[Delivery] = []
                async with asyncio.timeout(10):
                    while sum(d.count for d in got) < 6:
                        got += await consumer.fetch(100, block_ms=100, whole=True)
                assert [d.count for d in got] == [3, 2, 1]
                assert got[0].data == b"\n".join(map(encode, first))
                assert [decode(p.data).seq for p in got[1].events()] == [4, 5]
                assert await pending() == 3
                await consumer.ack([got[0]])
                assert await pending() == 2
                await consumer.dead_letter(got[1].events()[0], "bad")
                assert await pending() == 2  # its other event is not done yet
                await consumer.ack([got[1], got[2]])
                assert await pending() == 0
        finally:
            await client.aclose()
        assert [d.data for d in await bus.dead_letters()] == [encode(second[0])]


async def test_entries_with_one_id_on_two_shards_are_acked_each_on_its_own(
    redis_url: str, prefix: str,
) -> None:
    """Invariant 2: entry ids are per shard, and a publish writes every shard in the same
    millisecond, so two shards often hold an entry with the same id. Acking one shard's
    entry must neither leave it pending (claimed and redone 30 s later) nor count as an
    event of the other shard's entry (acked before all its events are durable)."""
    url = f"{redis_url}?prefix={prefix}&shards=2&claim_idle_ms=100000"
    client = Redis.from_url(redis_url)
    several = b"\n".join(encode(event("run-many", s)) for s in (1, 2))
    try:
        async with open_bus(url) as bus, bus.consumer("g", "c") as consumer:
            assert await consumer.fetch(10, block_ms=10) == []  # the groups exist
            await client.xadd(ingest_key(prefix, 0), {"m": several}, id="7-0")
            await client.xadd(ingest_key(prefix, 1), {"e": encode(event("run-one", 1))}, id="7-0")

            async def pending(shard: int) -> int:
                return int((await client.xpending(ingest_key(prefix, shard), "g"))["pending"])

            got: list[Delivery] = []
            async with asyncio.timeout(10):
                while len(got) < 3:
                    got += await consumer.fetch(10, block_ms=100)
            lone = next(d for d in got if d.shard == 1)
            first, second = sorted((d for d in got if d.shard == 0), key=lambda d: d.part)
            await consumer.ack([lone])
            assert (await pending(1), await pending(0)) == (0, 1)
            await consumer.ack([first])
            assert await pending(0) == 1
            await consumer.ack([second])
            assert await pending(0) == 0
    finally:
        await client.aclose()


async def test_ingest_maxlen_bounds_the_events_of_multi_event_entries(
    redis_url: str, prefix: str,
) -> None:
    """Invariant 4 (bounded memory): ``ingest_maxlen`` counts events, also when an entry
    holds 64 of them (it trims to ``ingest_maxlen / 64`` entries, approximately)."""
    async with open_bus(f"{redis_url}?prefix={prefix}&shards=1&ingest_maxlen=256") as bus:
        for start in range(1, 2561, 64):
            await bus.publish([event("run-max", s) for s in range(start, start + 64)])
        client = Redis.from_url(redis_url)
        try:
            entries = await client.xrange(ingest_key(prefix, 0))
        finally:
            await client.aclose()
    held = sum(fields[b"m"].count(b"\n") + 1 for _, fields in entries)
    assert 256 <= held <= 1024, held
    last = decode(entries[-1][1][b"m"].rsplit(b"\n", 1)[1])
    assert last.seq == 2560


async def test_a_fetch_returns_max_count_events_while_more_are_ready(
    redis_url: str, prefix: str,
) -> None:
    """A worker takes a fetch of fewer than it asked for as "caught up" (then it closes quiet
    shaping windows): so a fetch returns at least ``max_count`` events while more are ready
    (an entry whole, so the last may take it past), and fewer only when none are."""
    async with open_bus(f"{redis_url}?prefix={prefix}&shards=1") as bus:
        for start in range(1, 201, 20):  # entries of 20 events
            await bus.publish([event("run-fetch", s) for s in range(start, start + 20)])
        await bus.publish([event("run-fetch", s) for s in range(201, 301)])  # 64 + 36
        async with bus.consumer("g", "c") as consumer:
            sizes, seqs = [], []
            while len(seqs) < 300:
                got = await consumer.fetch(50, block_ms=100)
                sizes.append(len(got))
                seqs += [decode(d.data).seq for d in got]
                await consumer.ack(got)
            assert seqs == list(range(1, 301))
            assert all(size >= 50 for size in sizes[:-1]), sizes
            assert await consumer.fetch(50, block_ms=100) == []


def test_a_write_to_many_streams_is_packed_exactly_as_its_script_call(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's write is one ``APPEND_MANY`` call whose RESP is built directly, with each
    stream's keys framed once and kept: byte for byte the command of the call it stands for
    (state or none, a run's end, several entries, a seq gap, names with ``{``), also after
    the kept keys were dropped for being too many."""
    monkeypatch.setattr(redis_entries, "FRAMED_KEYS", 3)
    bus = redis_bus.RedisBus(f"{redis_url}?prefix=pk")
    ended = [event("run-c", 1), event("run-c", 2, "run.lifecycle", {"state": "done"})]
    long = [event("run-d", s) for s in range(1, ENTRY_EVENTS + 8)]
    gap = [event("run-e", s) for s in (4, 5, 9)]
    writes = [
        [(("run-a", "raw"), [event("run-a", 1)], encode_lines([event("run-a", 1)]), b"st")],
        [(("run-a", "raw"), [], encode_lines([]), b"only-state"),
         (("r{u}n%b", "shaped"), gap, encode_lines(gap), None),
         (("run-c", "raw"), ended, encode_lines(ended), b"s" * 300),
         (("run-d", "raw"), long, [encode(e) for e in long], None),
         (("run-a", "shaped"), gap, encode_lines(gap), b"")],
    ]
    for appends in writes * 2:
        assert bus._append_many_packed(appends) == resp_evalsha(*bus._append_many_call(appends))
    assert len(bus._framed_keys) <= 3
