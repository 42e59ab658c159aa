"""The Kafka worker's ingest partitions: which it owns, how far each was processed,
and the holes faust can leave in what it hands over (see :meth:`PartitionTracker.rewind_over_hole`).

Kept apart from the worker loop (:mod:`runwire.workers.faust_app`): the loop asks
:meth:`PartitionTracker.accept` for each entry and reports assignments; the
tracker decides what is in order, what is stale and when to seek back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from faust.types import TP, ConsumerT
from redis.backoff import ConstantBackoff

from runwire.core.errors import BusUnavailable
from runwire.core.retry import Retry

log = logging.getLogger("runwire.faust")

HOLE_IDLE_S = 2.0
"""A partition with unprocessed entries below its high water but nothing processed for
this long is sought back to its first unprocessed entry (see ``rewind_lost_tails``)."""
_LOOKUP_RETRY = Retry(ConstantBackoff(0.5), attempts=3)


class PartitionTracker:
    """The ingest partitions of one Kafka worker (see the module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        topic: str,
        consumer: Callable[[], ConsumerT],
        start_offsets: Callable[[list[int]], Awaitable[dict[int, int]]],
        busy: Callable[[], bool],
    ) -> None:
        self.name = name
        self.topic = topic
        self.consumer = consumer
        self.start_offsets = start_offsets
        """Where the group resumes each partition (committed offset, else beginning)."""
        self.busy = busy
        """Whether fetched entries are waiting for the worker (then no partition is idle)."""
        self.offsets: dict[int, int] = {}
        """Highest offset processed per ingest partition (before a new partition's first: its
        start offset - 1)."""
        self.starts: dict[int, asyncio.Future[int | None]] = {}
        self.lookups: set[asyncio.Task[None]] = set()
        """New partitions' start offsets (committed, else beginning), being looked up."""
        self.owned: set[int] = set()
        self.resync: set[int] = set()
        """Retained partitions waiting for the re-read after a rebalance."""
        self.rewound: dict[int, float] = {}
        """Partitions sought back over a hole in their entries (when, monotonic)."""
        self.progress: dict[int, float] = {}
        """When each partition last had an entry processed (monotonic)."""

    async def accept(self, partition: int, offset: int) -> bool:
        """Whether to process an entry now; one that is not is left unacked (read again later)."""
        last = self.offsets.get(partition)
        if (last is not None and offset == last + 1 and partition in self.owned
                and partition not in self.resync and partition not in self.rewound):
            pass  # the next entry of an owned partition, in order (the common case)
        elif self.is_stale(partition, offset):
            await self.rewind_over_hole(partition)
            return False
        if last is None or offset > last:
            self.offsets[partition] = offset
        return True

    def processed(self, partitions: list[int]) -> None:
        now = time.monotonic()
        for partition in partitions:
            self.progress[partition] = now

    def caught_up(self, partition: int, highwaters: dict[int, int | None]) -> bool:
        """Whether everything in the partition up to its high water was processed."""
        if partition not in highwaters:
            highwaters[partition] = self.consumer().highwater(TP(self.topic, partition))
        highwater = highwaters[partition]
        return highwater is None or self.offsets.get(partition, -1) + 1 >= highwater

    def stop(self) -> None:
        for lookup in list(self.lookups):
            lookup.cancel()

    def assign(self, owned: list[int]) -> None:
        """Record a new assignment (the ingest partitions owned now); look up where each new partition starts.

        A new partition's start offset (the group's committed offset, else
        its beginning) stands for its last processed offset + 1, so entries
        lost before its first one is processed (see :meth:`rewind_over_hole`)
        are a hole like any other: the first entry past it is skipped and the
        partition sought back, and a partition that lost all of them is
        sought back on the timer.
        """
        retained = self.owned & set(owned)
        for partition in set(self.offsets) - retained:  # another owner may have moved on
            del self.offsets[partition]
        self.resync = retained & set(self.offsets)
        self.owned = set(owned)
        fresh = [p for p in owned if p not in self.resync]
        now = time.monotonic()
        for partition in fresh:
            self.progress[partition] = now
        if fresh:
            futures: list[asyncio.Future[int | None]] = [
                asyncio.get_running_loop().create_future() for _ in fresh
            ]
            self.starts.update(zip(fresh, futures, strict=True))
            self.lookups.add(task := asyncio.create_task(self._lookup_starts(fresh, futures)))
            task.add_done_callback(self.lookups.discard)

    def is_stale(self, partition: int, offset: int) -> bool:
        """An entry taken before a rebalance, now ahead of what the stream resumes from.

        After a rebalance faust seeks every partition back to its committed
        offset and drops what it had queued, but entries already taken
        could still come first; processing them before the re-read
        entries before them would reorder the partition (and the sequencer
        would take the earlier entries for duplicates). Until the re-read
        reaches us, entries past our last processed offset are skipped and
        left unacked; the re-read delivers them again, in order. Entries of
        a partition that moved to another worker are skipped too:
        processing them would give that partition's runs two writers.
        """
        if partition not in self.owned:  # moved to another owner: never write its runs
            log.info("%s: skipping entry %d:%d of a partition it no longer owns",
                     self.name, partition, offset)
            return True
        last = self.offsets.get(partition)
        if last is None or offset <= last + 1:
            self.resync.discard(partition)
            self.rewound.pop(partition, None)
            return False
        if partition in self.resync:
            log.info("%s: skipping stale entry %d:%d taken before the rebalance",
                     self.name, partition, offset)
        else:
            log.info("%s: skipping entry %d:%d past a hole after %d:%d",
                     self.name, partition, offset, partition, last)
        return True

    async def rewind_lost_tails(self) -> None:
        """Seek back partitions whose entries past the last processed one never arrive.

        The hole of :meth:`rewind_over_hole` can also be a partition's
        tail: nothing after it to reveal it. A partition whose high water
        is past ``last + 1`` but that has had nothing processed for
        :data:`HOLE_IDLE_S` is sought back the same way (a busy worker only
        causes a re-read, which the sequencer drops as duplicates). A new
        partition counts from its start offset (see :meth:`assign`),
        so one that lost every entry before the first was processed is
        sought back too.
        """
        for partition, start in list(self.starts.items()):
            if start.done():  # a new partition none of whose entries arrived yet
                await self.learn_start(partition)
        now = time.monotonic()
        for partition, last in list(self.offsets.items()):
            if now - self.progress.get(partition, now) < HOLE_IDLE_S or self.busy():
                continue
            highwater = self.consumer().highwater(TP(self.topic, partition))
            if highwater is not None and highwater > last + 1:
                await self.rewind_over_hole(partition)

    async def rewind_over_hole(self, partition: int) -> None:
        """Seek a partition back to its first unprocessed entry when the fetcher skipped some.

        Faust (0.15) resumes the stream partitions of a new assignment and
        fetches from them while its own seek to the committed offsets is
        still in flight; entries fetched in that window can fail to reach
        the worker while the fetch position moves on past them. The ingest topic is
        neither compacted nor transactional, so its offsets are contiguous
        and an entry past ``last + 1`` of an owned partition means entries
        in between were not delivered: they would be lost (the survivor of
        a takeover recorded them as an ``x.gap``). Seeking back to
        ``last + 1`` re-reads them; entries past the hole are skipped
        unacked until the re-read reaches them (at most one seek per
        :data:`HOLE_IDLE_S` while waiting, in case a seek is itself overtaken).
        """
        if partition in self.resync or partition not in self.owned:
            return  # faust's own seek after the rebalance re-reads them / not ours
        now = time.monotonic()
        if now - self.rewound.get(partition, -HOLE_IDLE_S) < HOLE_IDLE_S:
            return
        self.rewound[partition] = now
        offset = self.offsets[partition] + 1
        log.warning("%s: entries of ingest partition %d from offset %d were not delivered; "
                    "seeking back to re-read them", self.name, partition, offset)
        await self.consumer().seek(TP(self.topic, partition), offset)

    async def learn_start(self, partition: int) -> None:
        """Wait for a newly assigned partition's start offset; it counts as ``last + 1``."""
        start = self.starts.get(partition)
        if start is None:
            return
        offset = await start
        if self.starts.get(partition) is start:
            del self.starts[partition]
            if offset is not None and partition in self.owned:
                self.offsets.setdefault(partition, offset - 1)

    async def _lookup_starts(
        self, partitions: list[int], futures: list[asyncio.Future[int | None]]
    ) -> None:
        def report(exc: Exception, _pause: float) -> None:
            log.warning("%s: cannot read the start offsets of %s (%s); retrying",
                        self.name, partitions, exc)

        try:
            starts: dict[int, int] = {}
            try:
                starts = await _LOOKUP_RETRY.call(
                    lambda: self.start_offsets(partitions), on_retry=report)
            except BusUnavailable as exc:
                log.warning("%s: cannot read the start offsets of %s (%s)", self.name,
                            partitions, exc)
            for partition, future in zip(partitions, futures, strict=True):
                if not future.done():
                    future.set_result(starts.get(partition))
        finally:
            for future in futures:
                if not future.done():
                    future.set_result(None)
