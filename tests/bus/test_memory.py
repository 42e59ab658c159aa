"""The ``memory://`` bus's consumer groups in detail: what leaves a shard and when (invariant 7,
bounded by live work), and the order of claims, with acks in any order and many entries pending.
The behaviour every backend shares is in test_contract.py."""

from __future__ import annotations

import time

from runwire.bus import Delivery, open_bus
from runwire.bus.base import Consumer
from runwire.bus.memory.bus import MemoryBus
from runwire.core.envelope import decode
from tests.events import event


async def take(consumer: Consumer, want: int, max_count: int = 500) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 10
    while len(got) < want and time.monotonic() < deadline:
        got += await consumer.fetch(max_count=min(max_count, want - len(got)), block_ms=200)
    return got


def kept(bus: MemoryBus) -> int:
    return len(bus.state.shards[0])


async def test_entries_leave_once_every_group_acked_them_whatever_the_ack_order() -> None:
    async with open_bus("memory://?shards=1") as bus:
        assert isinstance(bus, MemoryBus)
        fast, slow = bus.consumer("fast", "a"), bus.consumer("slow", "b")
        for consumer in (fast, slow):
            assert await consumer.fetch(block_ms=0) == []
        await bus.publish([event("run-t", seq) for seq in range(1, 101)])

        got = await take(fast, 100)
        await fast.ack(got[10:][::-1])  # all but the first ten, newest first
        await fast.ack(got[:9])
        assert kept(bus) == 100  # the slow group acked nothing

        await slow.ack(await take(slow, 100))
        assert kept(bus) == 91 and bus.state.backlog == 91  # entry 10 is pending in "fast"

        await fast.dead_letter(got[9], "bad")  # a dead letter is done, too
        assert kept(bus) == 0 and bus.state.backlog == 0

        await bus.publish([event("run-t", seq) for seq in range(101, 111)])
        for consumer in (fast, slow):
            again = await take(consumer, 10)
            assert [decode(d.data).seq for d in again] == list(range(101, 111))
            await consumer.ack(again)
        assert kept(bus) == 0
        await fast.close()
        await slow.close()


async def test_idle_entries_are_claimed_in_entry_order_across_fetches_of_any_size() -> None:
    """Entries a departed member took in several fetches come back in shard order, a few
    per fetch, each counted once more, before any newer entry."""
    async with open_bus("memory://?shards=1&claim_idle_ms=50") as bus:
        await bus.publish([event("run-c", seq) for seq in range(1, 31)])
        gone = bus.consumer("g", "gone")
        for size in (7, 13, 10):  # three deliveries, each later than the one before
            assert len(await gone.fetch(max_count=size, block_ms=0)) == size
        await gone.close()
        await bus.publish([event("run-c", seq) for seq in range(31, 36)])
        async with bus.consumer("g", "heir") as heir:
            got = await take(heir, 35, max_count=4)
            await heir.ack(got)
    assert [decode(d.data).seq for d in got] == list(range(1, 36))
    assert [d.deliveries for d in got] == [2] * 30 + [1] * 5


async def test_a_member_reads_its_own_pending_entries_first_after_a_restart() -> None:
    async with open_bus("memory://?shards=1&claim_idle_ms=60000") as bus:
        await bus.publish([event("run-r", seq) for seq in range(1, 2001)])
        first = bus.consumer("g", "w")
        held = await take(first, 2000, max_count=512)
        await first.ack(held[:1000:2])  # every other one of the first thousand
        await first.close()
        async with bus.consumer("g", "w") as again:
            got = await take(again, 1500, max_count=300)
            await again.ack(got)
        assert isinstance(bus, MemoryBus) and kept(bus) == 0
    assert [decode(d.data).seq for d in got] == list(range(2, 1001, 2)) + list(range(1001, 2001))
    assert {d.deliveries for d in got} == {2}


async def test_a_worker_fetches_a_shards_new_entries_whole_and_acks_them_at_once() -> None:
    """``fetch(whole=True)``: a shard's new entries of one fetch come as one delivery holding
    their lines (``count`` of them); acking it acks each, and after one of them was
    dead-lettered on its own, acking the whole acks the rest. An entry whose bytes hold a
    newline (no publisher writes one) comes on its own, so each line stays one entry."""
    async with open_bus("memory://?shards=1") as bus:
        assert isinstance(bus, MemoryBus)
        events = [event("run-whole", s) for s in range(1, 6)]
        await bus.publish(events)
        async with bus.consumer("g", "c") as consumer:
            (whole,) = await consumer.fetch(100, block_ms=10, whole=True)
            assert whole.count == 5 and [decode(d.data).seq for d in whole.events()] == [1, 2, 3, 4, 5]
            await consumer.dead_letter(whole.events()[1], "bad")
            assert [d.entry_id for d in await bus.dead_letters()] == ["2-0"]
            assert len(bus.state.group("g").shards[0].pending) == 4
            await consumer.ack([whole])
            assert not bus.state.group("g").shards[0].pending and kept(bus) == 0
            bus.state.shards[0].append(b'{"two":\n"lines"}')
            bus.state.backlog += 1
            await bus.publish([event("run-whole", 6)])
            got = await consumer.fetch(100, block_ms=10, whole=True)
            assert [(d.entry_id, d.count) for d in got] == [("6-0", 1), ("7-0", 1)]
