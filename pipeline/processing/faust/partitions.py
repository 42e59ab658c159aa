"""The Kafka worker's ingest partitions: which it owns, how far each was processed,
the holes faust can leave in what it hands over (see :meth:`PartitionTracker.rewind_over_hole`)
and those the broker has (see :meth:`PartitionTracker.pass_lost_offsets`).

Kept apart from the worker loop (:mod:`runwire.workers.faust_app`): the loop asks
:meth:`PartitionTracker.accept` for each entry and reports assignments; the
tracker decides what is in order, what is stale and when to seek back, also after
the broker lost its state (:meth:`PartitionTracker.check_life`).

Longer than ~400 lines: one idea, where the reading of each partition stands. A
rebalance, a hole faust leaves, a hole the broker has and a broker that lost its
state all move the same few marks per partition (last processed, start, rewound,
hole, life); split apart, each part would reach into the others' state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from faust.types import TP, ConsumerT
from redis.backoff import ConstantBackoff

from ...core.errors import BusUnavailable
from ...core.retry import Outage, Retry

log = logging.getLogger("runwire.faust")

HOLE_IDLE_S = 2.0
"""A partition with unprocessed entries below its high water but nothing processed for
this long is sought back to its first unprocessed entry (see ``rewind_lost_tails``)."""
CHECK_TIMEOUT_S = 30.0
"""How long asking the broker for a partition's first record past a hole may take."""
_LOOKUP_RETRY = Retry(ConstantBackoff(0.5), attempts=3)


class _Hole:
    """Where a partition was first sought back to (``offset``), since when, and the broker's answer."""

    def __init__(self, offset: int, since: float) -> None:
        self.offset = offset
        self.since = since
        self.check: asyncio.Task[int] | None = None
        """Asking the broker for the first offset at or after ``offset`` that holds a record."""


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
        first_offset: Callable[[int, int], Awaitable[int]],
        confirm_s: float,
        life: Callable[[], Awaitable[int]] | None = None,
        losses: Callable[[], int] = lambda: 0,
        outage: Outage | None = None,
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
        """New partitions' start offsets (committed, else beginning), being looked up; seeks."""
        self.owned: set[int] = set()
        self.resync: set[int] = set()
        """Retained partitions waiting for the re-read after a rebalance."""
        self.resync_since = 0.0
        """When the last assignment began the wait for those re-reads (monotonic)."""
        self.rewound: dict[int, float] = {}
        """Partitions sought back over a hole in their entries (when, monotonic)."""
        self.progress: dict[int, float] = {}
        """When each partition last had an entry processed (monotonic)."""
        self.first_offset = first_offset
        """``first_offset(partition, offset)``: the broker's first offset at or after ``offset``
        holding a record (the partition's end offset when none does)."""
        self.confirm_s = confirm_s
        """How long a partition is sought back to the same offset before the broker is asked
        whether it has a record there (longer than a produce request may take)."""
        self.holes: dict[int, _Hole] = {}
        """Partitions being sought back to their first unprocessed offset, and since when."""
        self.lost_by_broker = 0
        """Holes passed because the broker has no record there (:meth:`pass_lost_offsets`)."""
        self.life = life
        """Checks the broker's life marker now; the losses of its state found so far."""
        self.losses = losses
        """The losses of the broker's state found so far (by any check, producing included)."""
        self.lives = losses()
        self.breaks_seen = 0
        """Those closed before the last check of the broker's life that got an answer."""
        self.outage = outage
        """Where a broker that can't be asked pauses the worker (its log line and metric)."""
        """The losses seen here (:meth:`check_life`)."""
        self.life_unknown: float | None = None
        """When a check of the broker's life failed (asked again at a tick), None: it did not."""
        self.reborn_next = False
        """Whether the next assignment follows a loss of the broker's state seen before it: its
        partitions are then read from where this life's reading stands (:meth:`assign`)."""

    async def accept(self, partition: int, offset: int) -> bool:
        """Whether to process an entry now; one that is not is left unacked (read again later)."""
        last = self.offsets.get(partition)
        if (last is not None and offset == last + 1 and partition in self.owned
                and partition not in self.resync and partition not in self.rewound):
            pass  # the next entry of an owned partition, in order (the common case)
        elif self.is_stale(partition, offset):
            passed = await self.rewind_over_hole(partition)
            if not passed or offset != self.offsets[partition] + 1:
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

    async def stop(self) -> None:
        """Cancel the lookups, seeks and broker checks under way, and wait until they have ended
        (:data:`CHECK_TIMEOUT_S` at most): a check reads with a client of its own, closed as it
        ends; left pending as the event loop closed, its connections stayed open."""
        pending: set[asyncio.Task[object]] = {*self.lookups}
        pending |= {hole.check for hole in self.holes.values() if hole.check is not None}
        for partition in list(self.holes):
            self._forget_hole(partition)
        for task in pending:
            task.cancel()
        if pending:
            ended, _ = await asyncio.wait(pending, timeout=CHECK_TIMEOUT_S)
            for task in ended:
                if not task.cancelled():
                    task.exception()  # retrieved: an error of a check no longer needed is moot

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
            self._forget_hole(partition)
        self.resync = retained & set(self.offsets)
        self.resync_since = time.monotonic()
        self.owned = set(owned)
        if self.reborn_next:
            # After a loss of the broker's state: faust seeks each partition to its committed
            # offset, which may be the former life's (committed to the new broker before the loss
            # was seen, past what is there now: faust then drops every record below it, and a
            # partition waiting for that seek is never sought back). Each is read on from what
            # this life's reading processed (from offset 0 for one new here), as any hole.
            self.reborn_next = False
            self._read_from_zero(self.owned, keep=True)
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

    async def check_life(self, ask: bool, assigning: bool = False) -> bool | None:
        """Read each owned partition again from offset 0 if the broker lost its state; True
        if that was just seen, None while it can't be told (the broker can't be asked).

        The broker is asked after one of faust's consumer's connections closed (at the
        next fetch, before what it fetched is handed over, or the next tick), at each
        revoke and assignment (``ask``: a broker that lost its state lost the group too),
        and again every 2 s while it can't be; otherwise only the losses found meanwhile
        (by the bus's producer) are compared. While it can't be asked the worker is
        paused (``outage``: one log line, the metric) and nothing fetched is handed over.
        The broker's topics were made again empty (:mod:`runwire.bus.kafka.life`): every
        record there now is new, and an offset carried over from its former life — this
        tracker's, faust's read offset, a commit faust made to the new broker before the
        loss was seen — would skip the first of them. So each owned partition counts as
        processed up to -1: a record past 0 is a hole (:meth:`rewind_over_hole`) and an
        idle partition a lost tail (:meth:`rewind_lost_tails`), both sought back to 0.
        What is read twice is dropped by seq; what the broker acknowledged and lost
        unread is gone with it.
        """
        now = time.monotonic()
        unknown, breaks = self.life_unknown, int(getattr(self.consumer(), "breaks", 0))
        if unknown is None and breaks != self.breaks_seen:
            ask = True  # the consumer lost a connection since: to a broker that lost its state?
        elif unknown is not None and now - unknown >= HOLE_IDLE_S:
            ask = True
        if self.life is not None and ask:
            try:
                await self.life()
                self.life_unknown = None
                self.breaks_seen = breaks
                if self.outage is not None:
                    self.outage.ended(self, succeeded=True)
            except BusUnavailable as exc:
                if self.outage is not None:  # one line (``paused: bus unavailable``) and the metric
                    self.outage.failed(self, exc)
                elif unknown is None:
                    log.warning("%s: cannot check whether the broker lost its state (%s); "
                                "asking again", self.name, exc)
                self.life_unknown = now
                return None
        if self.losses() == self.lives:
            return False if self.life_unknown is None else None
        self.lives = self.losses()
        log.warning("%s: the broker lost its state; reading ingest partitions %s again from "
                    "offset 0", self.name, sorted(self.owned))
        # those owned now, and those of the next assignment unless this is one (the group
        # was lost with the broker: a rebalance follows, and a partition that comes from a
        # worker yet to see the loss may have an offset of the former life committed)
        self.reborn_next = not assigning
        self._read_from_zero(self.owned)
        return True

    def _read_from_zero(self, partitions: set[int], keep: bool = False) -> None:
        """Count the partitions as processed up to -1 (see :meth:`check_life`), or with ``keep``
        up to what was processed since (-1 for one not read yet), never waiting for faust's seek."""
        now = time.monotonic()
        for partition in partitions:
            self.resync.discard(partition)
            self.rewound.pop(partition, None)
            self._forget_hole(partition)
            self.offsets[partition] = self.offsets.get(partition, -1) if keep else -1
            self.progress[partition] = now

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
            if self.rewound.pop(partition, None) is not None:
                self._forget_hole(partition)
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
        sought back too. A hole the broker has (:meth:`pass_lost_offsets`)
        is passed here too, the partition then sought to the record after it.
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
                passed = await self.rewind_over_hole(partition)
                if passed and highwater > self.offsets[partition] + 1:
                    await self._reread_past_hole(partition)

    async def rewind_over_hole(self, partition: int) -> bool:
        """Seek a partition back to its first unprocessed entry when the fetcher skipped some;
        whether it passed a hole the broker has instead (:meth:`pass_lost_offsets`).

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
        now = time.monotonic()
        if partition not in self.owned:
            return False  # not ours
        if partition in self.resync:
            if now - self.resync_since < HOLE_IDLE_S:
                return False  # faust's own seek after the rebalance re-reads them
            # that re-read has not come (a seek of faust's that its fetch overtook, or one of
            # ours skipped during the rebalance): the partition is sought back as any hole
            log.info("%s: ingest partition %d not read again %.0f s after the rebalance",
                     self.name, partition, now - self.resync_since)
            self.resync.discard(partition)
        offset = self.offsets[partition] + 1
        hole = self.holes.get(partition)
        if hole is None or hole.offset != offset:
            self._forget_hole(partition)
            hole = self.holes[partition] = _Hole(offset, now)
        if hole.check is not None and hole.check.done() and self.pass_lost_offsets(partition):
            return True
        if now - self.rewound.get(partition, -HOLE_IDLE_S) < HOLE_IDLE_S:
            return False
        self.rewound[partition] = now
        if hole.check is None and now - hole.since >= self.confirm_s:
            hole.check = asyncio.create_task(
                asyncio.wait_for(self.first_offset(partition, offset), CHECK_TIMEOUT_S))
        log.warning("%s: entries of ingest partition %d from offset %d were not delivered; "
                    "seeking back to re-read them", self.name, partition, offset)
        self._seek(partition, offset)
        return False

    def pass_lost_offsets(self, partition: int) -> bool:
        """Go on past a hole that is the broker's: it has no record at those offsets.

        The offsets of a Kafka partition can have holes after all: a broker
        that lost records (Tansu 0.6.0 on s3, restarted mid-run, stored two
        producers' batches at one offset), records deleted or past retention
        below a committed offset. Re-reading such a hole returns first an
        entry past it for ever. So once a partition has been sought back to
        the same offset for :attr:`confirm_s` (longer than a produce request
        may take: a record still being stored is not a hole), the broker is
        asked for its first record at or after that offset (a fetch of its
        own, not faust's). One past the hole confirms it: an error is logged
        naming the offsets, the hole is counted (:attr:`lost_by_broker`, the
        worker's ``broker_holes``) and the partition goes on from that
        record. The runs whose events were there see them as an ``x.gap``,
        as any jump in a publisher's seq. An answer of the offset itself
        means the record is there (faust's skip): the partition is sought
        back again, and the broker asked again after another
        :attr:`confirm_s`. Whether it passed the hole.
        """
        hole = self.holes[partition]
        check, hole.check = hole.check, None
        if check is None or not check.done() or check.cancelled():
            return False
        exc = check.exception()
        if exc is not None:
            log.warning("%s: cannot read ingest partition %d from offset %d to check for a hole "
                        "(%s); seeking back again", self.name, partition, hole.offset, exc)
            hole.since = time.monotonic()
            return False
        first = check.result()
        if first <= hole.offset:  # the broker has the record: faust's skip, read it again
            hole.since = time.monotonic()
            return False
        log.error("%s: the broker has no record at offsets %d..%d of ingest partition %d: "
                  "lost by the broker; going on (what its publishers still keep comes again; "
                  "a run still missing events shows an x.gap)", self.name, hole.offset, first - 1, partition)
        self.lost_by_broker += 1
        self.offsets[partition] = first - 1
        self._forget_hole(partition)
        self.rewound.pop(partition, None)
        self.progress[partition] = time.monotonic()
        return True

    async def _reread_past_hole(self, partition: int) -> None:
        """After a hole passed here: its next entries were skipped while it was sought back."""
        offset = self.offsets[partition] + 1
        self.rewound[partition] = time.monotonic()
        log.info("%s: re-reading ingest partition %d from offset %d, past the hole",
                 self.name, partition, offset)
        self._seek(partition, offset)

    def _seek(self, partition: int, offset: int) -> None:
        """Seek in the background, never holding the batch being processed meanwhile.

        A seek waits for faust's consumer thread, which a rebalance holds until every
        message taken is acked or gone: awaited here, it kept the batch's messages alive
        and the rebalance waited for the seek (until its timeout, per partition).
        """
        seek = self.consumer().seek(TP(self.topic, partition), offset)
        self.lookups.add(task := asyncio.create_task(seek))
        task.add_done_callback(self._sought)

    def _sought(self, task: asyncio.Task[None]) -> None:
        self.lookups.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("%s: a seek failed (%r); seeking again if still needed", self.name, exc)

    def _forget_hole(self, partition: int) -> None:
        hole = self.holes.pop(partition, None)
        if hole is not None and hole.check is not None:
            if hole.check.done() and not hole.check.cancelled():
                hole.check.exception()  # retrieved: an error of a check no longer needed is moot
            hole.check.cancel()

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
