"""What the Kafka worker's partition tracker does with an ingest partition kept through a rebalance.

The tracker is driven here as the faust app drives it (assign, then each fetched entry through
``accept``), with a stand-in for faust's consumer that records the seeks asked of it: the rule
under test is the tracker's, and which offsets it asks to read again is all it tells the consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from faust.types import TP

from runwire.processing.faust.partitions import HOLE_IDLE_S, PartitionTracker


class _Consumer:
    """Faust's consumer as the tracker sees it: seeks, and each partition's high water."""

    def __init__(self) -> None:
        self.seeks: list[tuple[int, int]] = []

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp.partition, offset))

    def highwater(self, tp: TP) -> int:
        return 100


async def _answer_at_once(partition: int, offset: int) -> int:
    return offset


async def _tracker(consumer: _Consumer, first_offset: Callable[[int, int], Awaitable[int]] = _answer_at_once,
                   confirm_s: float = 60.0) -> PartitionTracker:
    async def start_offsets(partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    tracker = PartitionTracker(
        name="w1", topic="ingest", consumer=lambda: consumer,  # type: ignore[arg-type,return-value]
        start_offsets=start_offsets, busy=lambda: False, first_offset=first_offset,
        confirm_s=confirm_s,
    )
    tracker.assign([0])
    await tracker.learn_start(0)
    for offset in range(5):  # offsets 0..4 processed
        assert await tracker.accept(0, offset)
    tracker.processed([0])
    return tracker


async def _settle() -> None:
    for _ in range(3):  # the tracker seeks in the background
        await asyncio.sleep(0)


async def test_a_partition_kept_through_a_rebalance_waits_for_fausts_own_re_read() -> None:
    """Right after a rebalance that kept the partition, an entry past the last processed one was
    taken before the rebalance: it is skipped unacked, and the tracker does not seek (faust seeks
    the partition to its committed offset itself, and the re-read comes in order)."""
    consumer = _Consumer()
    tracker = await _tracker(consumer)
    tracker.assign([0])
    assert not await tracker.accept(0, 8)
    await _settle()
    assert consumer.seeks == []
    assert await tracker.accept(0, 5)  # faust's re-read, from the commit: in order again


async def test_a_partition_kept_through_a_rebalance_and_never_read_again_is_sought_back() -> None:
    """When faust's re-read does not come (its fetch overtook its seek, or the worker's own seek
    was skipped during the rebalance), the partition is not left waiting for ever: once the
    rebalance is ``HOLE_IDLE_S`` old it is sought back to its first unprocessed entry, as any
    hole, and the entries from there are processed."""
    consumer = _Consumer()
    tracker = await _tracker(consumer)
    tracker.assign([0])
    tracker.resync_since -= HOLE_IDLE_S  # the rebalance is that old, and nothing came
    assert not await tracker.accept(0, 8)
    await _settle()
    assert consumer.seeks == [(0, 5)]
    for offset in range(5, 9):
        assert await tracker.accept(0, offset)


async def test_a_partition_kept_through_a_rebalance_with_a_lost_tail_is_sought_back() -> None:
    """Nothing fetched for it at all after the rebalance: the timer's check of lost tails seeks it
    back once the rebalance and its last progress are ``HOLE_IDLE_S`` old (not before)."""
    consumer = _Consumer()
    tracker = await _tracker(consumer)
    tracker.assign([0])
    tracker.progress[0] -= HOLE_IDLE_S
    await tracker.rewind_lost_tails()
    await _settle()
    assert consumer.seeks == []  # the rebalance is new: faust's re-read may still come
    tracker.resync_since -= HOLE_IDLE_S
    await tracker.rewind_lost_tails()
    await _settle()
    assert consumer.seeks == [(0, 5)]


async def test_a_stopped_tracker_waits_for_its_broker_check_to_close_its_reader() -> None:
    """A hole's check asks the broker with a reader of its own, closed as the check ends. A worker
    stopping meanwhile cancels the check and waits until it has ended: a check left pending as
    the event loop closes never closed its reader (an open connection the collector found later,
    failing whichever test it ran in)."""
    asked, closed = asyncio.Event(), asyncio.Event()

    async def first_offset(partition: int, offset: int) -> int:
        asked.set()
        try:
            await asyncio.Event().wait()  # a broker slow to answer
        finally:
            for _ in range(3):  # closing the reader takes a round trip
                await asyncio.sleep(0)
            closed.set()
        return offset

    consumer = _Consumer()
    tracker = await _tracker(consumer, first_offset, confirm_s=0.0)
    assert not await tracker.accept(0, 7)  # past a hole after 4: sought back, the broker asked
    await asyncio.wait_for(asked.wait(), 5)
    await tracker.stop()
    assert closed.is_set()
    assert tracker.holes == {} and tracker.lookups == set()
