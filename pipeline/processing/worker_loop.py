"""The consumer-group worker loop: fetch → :class:`~runwire.processing.stages.Stages` → ack.

One loop for any :class:`~runwire.bus.Consumer` (``memory://``,
``redis://``, and any bus's generic consumer API): fetch a batch of ingest
entries → decode (poison → dead letter) → restore the checkpoints of streams
this process has not seen → process (fan-in, sequencing, shaping) → write →
ack; the ack comes only after the writes are durable.

Whenever the consumer has caught up (a fetch returned less than a full
batch), a tick closes shaping windows whose end has passed and ends silent
runs; ticks also run every ``tick_s`` while idle.

A stop event ends the loop between batches: the batch in flight is finished,
written and acked, then the caller closes the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from operator import attrgetter

from ..bus import Consumer
from ..bus.base import Fetched, event_count
from .processor import Processor, StreamOutput
from .stages import PENDING_BATCHES, EncodedWrite, Stages

log = logging.getLogger("runwire.worker")
_SHARD = attrgetter("shard")


class _Write:
    """A write in flight: its task, whether its replay-log part is done (and went through),
    the streams it writes."""

    __slots__ = ("logged", "logged_ok", "runs", "task")

    def __init__(self, runs: frozenset[str]) -> None:
        self.runs = runs
        self.logged = asyncio.Event()
        self.logged_ok = False
        self.task: asyncio.Task[None] | None = None


class ConsumerLoop:
    """fetch → :class:`Stages` → ack, for any :class:`~runwire.bus.Consumer`."""

    def __init__(self, consumer: Consumer, stages: Stages) -> None:
        self.consumer = consumer
        self.stages = stages
        self._owned: frozenset[int] = frozenset()
        self._state_losses = 0
        self._shard_losses = 0
        self._writes: list[_Write] = []
        """Writes in flight, oldest first (at most two: one in its views, one in its log)."""
        self._pending: dict[str, StreamOutput] = {}
        """Processed batches waiting for the next write (each stream's events in one output, unsealed)."""
        self._pending_acks: list[Fetched] = []
        self._pending_entries = 0
        self._next_adopt = 0.0
        self._adopt_quiet = False
        """Whether the next adoption loads every unfinished run of the owned shards, not only
        silent ones (set whenever this process dropped streams or gained shards)."""

    async def loop(self, *, batch: int, tick_s: float, burst: bool) -> None:
        """Batches are pipelined, and their writes grouped while the store is busy.

        Three things overlap: decoding and processing the next batches (this
        task), the replay-log write of one write (the log's thread), and the
        delivery appends and acks of the write before it (Redis/Kafka). A write
        starts once the previous one's log part is done; until then further
        batches are processed and merged into it (up to ``PENDING_BATCHES``
        batches): one replay-log transaction and one delivery append per
        stream for all of them, so the per-write costs (commit, run
        metadata, round trips) shrink as the backlog grows. A write that is
        full (or flushed) before then is sealed, encoded and queued behind
        that log part, so the log's thread goes on to it at once. Each write's
        views go out after its own log part and after the previous write's
        views, so streams stay in order; each entry is acked after its writes.
        """
        block_ms = max(1, int(tick_s * 1000))
        stop = self.stages.stop
        most = batch * PENDING_BATCHES
        prefetch: asyncio.Task[tuple[Sequence[Fetched], float]] | None = None
        finished = False
        try:
            while not stop.is_set() or prefetch is not None:
                if prefetch is not None:
                    (deliveries, read_at), prefetch = await prefetch, None
                else:
                    deliveries, read_at = await self._fetch_stamped(batch, block_ms)
                fetched = event_count(deliveries)
                await self._check_ownership()
                if not self._owned.issuperset(map(_SHARD, deliveries)):
                    # a lease lost since the fetch: the shard's new owner redoes them
                    deliveries = [d for d in deliveries if d.shard in self._owned]
                if fetched >= batch and not stop.is_set():
                    # a backlog: the next fetch's round trip (which may queue behind this
                    # worker's own appends on the server) overlaps processing this batch
                    prefetch = asyncio.create_task(self._fetch_stamped(batch, block_ms))
                if deliveries:
                    acked, _ = await self.stages.prepare(
                        deliveries, self._drain_for, into=self._pending_outputs)
                    self._pending_acks.extend(acked)
                    self._pending_entries += fetched
                    if self._ready() or self._pending_entries >= most:
                        await self._write_pending()
                if fetched < batch:
                    await self._flush()
                    await self._adopt_silent()
                    # as of the fetch that found the shards read to their end: the flush may have
                    # waited out an outage meanwhile, with new events for these streams unread
                    await self.stages.tick(now=read_at)
                if burst and not fetched:
                    break
            finished = True
        finally:
            if prefetch is not None:  # its entries stay pending: redone by whoever owns them
                prefetch.cancel()
                try:
                    await prefetch
                except BaseException as error:
                    log.debug("prefetch ended with %r", error)
            if finished:
                await self._flush()
            else:
                await self._abandon()

    async def _fetch(self, batch: int, block_ms: int) -> Sequence[Fetched]:
        """One fetch, retried while the bus is unavailable (until a stop)."""
        return await self.stages.retry(lambda: self.consumer.fetch(batch, block_ms=block_ms, whole=True))

    async def _fetch_stamped(self, batch: int, block_ms: int) -> tuple[Sequence[Fetched], float]:
        """One fetch and when it returned (the processor's clock): a fetch of fewer than ``batch``
        entries says the shards were read to their end then, not later."""
        deliveries = await self._fetch(batch, block_ms)
        return deliveries, self.stages.processor.clock()

    async def _abandon(self) -> None:
        """The loop failed: write nothing more, so no checkpoint covers a write that failed.

        Writes in flight are cancelled (each is idempotent and acks only after
        it is complete); what was processed but not written is dropped. All of
        it stays pending on the bus and is redone — by this worker's
        successor, from the stored checkpoints — exactly as after a crash.
        """
        writes, self._writes = self._writes, []
        for write in writes:
            if write.task is not None:
                write.task.cancel()
        for write in writes:
            if write.task is not None:
                try:
                    await write.task
                except BaseException as error:
                    log.debug("write abandoned with %r", error)
        self._pending, self._pending_acks, self._pending_entries = {}, [], 0
        self.stages.processor.forget_all()

    def _pending_outputs(self) -> dict[str, StreamOutput]:
        return self._pending

    def _ready(self) -> bool:
        """Whether a new write may start: none in flight, or one whose log part is done."""
        for write in [w for w in self._writes if w.task is not None and w.task.done()]:
            self._writes.remove(write)
            write.task.result()  # type: ignore[union-attr]  # a failed write fails the loop
        return not self._writes or (len(self._writes) < 2 and self._writes[-1].logged.is_set())

    async def _write_pending(self) -> None:
        """Start writing (then acking) everything pending.

        When the newest write is still in its replay-log part, this write is sealed and
        encoded now and queued behind it: its own log part starts as soon as that one is
        done, without waiting for this task (nor for that write's views, which go after).
        At most two writes are in flight: a third waits for the oldest to finish.
        """
        if not self._pending and not self._pending_acks:
            return
        encoded = None
        if not self._ready():
            encoded = self.stages.encode(self._pending)  # (overlaps the write before's log part)
            while len(self._writes) >= 2:
                assert self._writes[0].task is not None
                await asyncio.wait([self._writes[0].task])
                self._ready()  # (drops what is done; a failed write fails the loop)
        outputs, acked = Processor.seal(self._pending), self._pending_acks
        self._pending, self._pending_acks, self._pending_entries = {}, [], 0
        previous = self._writes[-1] if self._writes else None
        write = _Write(frozenset(outputs))
        write.task = asyncio.create_task(self._write_and_ack(outputs, encoded, acked, previous, write))
        self._writes.append(write)

    async def _flush(self) -> None:
        """Write and ack everything processed so far, and wait for it (the last write starts
        as any does, once the write before has its log part done: its log part overlaps
        that write's views)."""
        await self._write_pending()
        await self._drain()

    async def _adopt_silent(self) -> None:
        now = time.monotonic()
        if now < self._next_adopt:
            return
        self._next_adopt = now + max(1.0, self.stages.processor.silence_s / 2)
        quiet_too, self._adopt_quiet = self._adopt_quiet, False
        owned = self.consumer.owned_shards()
        if owned:
            await self.stages.adopt_silent(owned, self.stages.bus.shards, quiet_too=quiet_too)

    async def _drain_for(self, run_ids: set[str]) -> None:
        """Before loading checkpoints: write what is pending or in flight for any of them first.

        A stream this process does not hold but is writing (it ended in a
        batch not yet durable and was dropped from memory) must be read back
        only after that write; any other stream's stored checkpoint is final.
        """
        if not run_ids.isdisjoint(self._pending):
            await self._flush()
        elif any(not write.runs.isdisjoint(run_ids) for write in self._writes):
            await self._drain()

    async def _drain(self) -> None:
        """Wait for every write in flight (and its acks)."""
        while self._writes:
            write = self._writes.pop(0)
            assert write.task is not None
            await write.task

    async def _write_and_ack(
        self,
        outputs: dict[str, StreamOutput],
        encoded: EncodedWrite | None,
        acked: list[Fetched],
        previous: _Write | None,
        write: _Write,
    ) -> None:
        """Replay log (after the write before's), views (after the write before's), acks."""
        try:
            if previous is not None and not previous.logged.is_set():
                await previous.logged.wait()
            if previous is not None and not previous.logged_ok:  # it failed: so does this one
                assert previous.task is not None
                await previous.task
            if encoded is None:
                encoded = self.stages.encode(outputs)
            await self.stages.write_log(encoded)
            write.logged_ok = True
        finally:
            write.logged.set()
        # a write queued behind this one's log part starts that part before these views run
        await asyncio.sleep(0)
        if previous is not None:  # views in write order (a failed write fails this one too)
            assert previous.task is not None
            await previous.task
        await self.stages.write_views(encoded)
        await self._ack(acked)
        self.stages.busy_until_now()

    async def _ack(self, acked: list[Fetched]) -> None:
        if acked:
            await self.stages.retry(lambda: self.consumer.ack(acked))
            self.stages.stats.acked += len(acked)

    async def _check_ownership(self) -> None:
        owned = self.consumer.owned_shards()
        lost = self._owned - owned
        if self.consumer.shard_losses != self._shard_losses:
            # shards left since the last look, maybe taken back already (a network cut longer than
            # lease_ms): another member had them meanwhile and may have written past this memory
            lost = self._owned
            self._shard_losses = self.consumer.shard_losses
        if self.consumer.state_losses != self._state_losses:
            # the bus lost its delivery streams and checkpoints: each run held here is reloaded when
            # next met, from the replay log's checkpoint, its views dropped and rebuilt from the log
            log.warning("%s: the bus lost its state (delivery streams, checkpoints); each run "
                        "continues from the replay log when next met", self.consumer.name)
            self.stages.rebuild.update(self.stages.processor.stream_ids())
            lost = lost or owned
        if lost:  # their streams may have a new writer: reload checkpoints when needed again
            await self._flush()
            log.info("%s lost shards %s; dropping in-memory state", self.consumer.name, sorted(lost))
            self.stages.processor.forget_all()
        if lost or owned - self._owned:
            # a quiet run of these shards is met again only at its next event: load them all now,
            # so the tick closes the shaping windows they had open (and the silence rule ends them)
            self._adopt_quiet, self._next_adopt = True, 0.0
        if owned - (self._owned - lost):
            log.info("%s owns shards %s", self.consumer.name, sorted(owned))
        self._owned = owned
        self._state_losses = self.consumer.state_losses
        if owned - self._owned:
            log.info("%s owns shards %s", self.consumer.name, sorted(owned))
        self._owned = owned
