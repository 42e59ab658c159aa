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
from ..core.errors import LeasesLost
from .processor import StreamOutput
from .stages import PENDING_BATCHES, Stages
from .writes import WritePipeline

log = logging.getLogger("runwire.worker")
_SHARD = attrgetter("shard")


class ConsumerLoop:
    """fetch → :class:`Stages` → ack, for any :class:`~runwire.bus.Consumer`."""

    def __init__(self, consumer: Consumer, stages: Stages) -> None:
        self.consumer = consumer
        self.stages = stages
        self._owned: frozenset[int] = frozenset()
        self._state_losses = 0
        self._shard_losses = 0
        self.writes: WritePipeline[Fetched] = WritePipeline(stages, self._ack)
        stages.fence = self._fence
        self._prefetch: asyncio.Task[tuple[Sequence[Fetched], float]] | None = None
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
        finished = False
        try:
            while not stop.is_set() or self._prefetch is not None:
                try:
                    await self._step(batch, block_ms, most, burst)
                except _Burst:
                    break
                except LeasesLost:
                    # a write waited out a pause past this member's leases: it is not made, and
                    # what was processed and not written goes with it (as when shards leave)
                    await self._cancel_prefetch()
                    await self._check_ownership()
            finished = True
        finally:
            await self._cancel_prefetch()
            try:
                if finished:
                    await self.writes.flush()
            except LeasesLost:  # (stopping: what was not written stays pending, as it is)
                finished = False
            if not finished:
                await self.writes.abandon()

    async def _step(self, batch: int, block_ms: int, most: int, burst: bool) -> None:
        """One fetched batch through the stages (starting the next fetch on a backlog)."""
        if self._prefetch is not None:
            prefetch, self._prefetch = self._prefetch, None
            deliveries, read_at = await prefetch
        else:
            deliveries, read_at = await self._fetch_stamped(batch, block_ms)
        fetched = event_count(deliveries)
        if await self._check_ownership():
            return  # what was fetched comes again, in order, from the consumer
        if not self._owned.issuperset(map(_SHARD, deliveries)):
            # a lease lost since the fetch: the shard's new owner redoes them
            deliveries = [d for d in deliveries if d.shard in self._owned]
        if fetched >= batch and not self.stages.stop.is_set():
            # a backlog: the next fetch's round trip (which may queue behind this
            # worker's own appends on the server) overlaps processing this batch
            self._prefetch = asyncio.create_task(self._fetch_stamped(batch, block_ms))
        if deliveries:
            acked, _ = await self.stages.prepare(
                deliveries, self.writes.drain_for, into=self._pending_outputs)
            self.writes.add(acked, fetched)
            if self.writes.ready() or self.writes.pending_entries >= most:
                await self.writes.write_pending()
        if fetched < batch:
            await self.writes.flush()
            await self._adopt_silent()
            # as of the fetch that found the shards read to their end: the flush may have
            # waited out an outage meanwhile, with new events for these streams unread
            await self.stages.tick(now=read_at)
        if burst and not fetched:
            raise _Burst

    async def _cancel_prefetch(self) -> None:
        """Cancel a fetch started ahead: its entries stay pending, redone by whoever owns them."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            prefetch.cancel()
            try:
                await prefetch
            except BaseException as error:
                log.debug("prefetch ended with %r", error)

    async def _fetch(self, batch: int, block_ms: int) -> Sequence[Fetched]:
        """One fetch, retried while the bus is unavailable (until a stop)."""
        return await self.stages.retry(lambda: self.consumer.fetch(batch, block_ms=block_ms, whole=True))

    async def _fetch_stamped(self, batch: int, block_ms: int) -> tuple[Sequence[Fetched], float]:
        """One fetch and when it returned (the processor's clock): a fetch of fewer than ``batch``
        entries says the shards were read to their end then, not later."""
        deliveries = await self._fetch(batch, block_ms)
        return deliveries, self.stages.processor.clock()

    def _pending_outputs(self) -> dict[str, StreamOutput]:
        return self.writes.pending

    async def _adopt_silent(self) -> None:
        now = time.monotonic()
        if now < self._next_adopt:
            return
        self._next_adopt = now + max(1.0, self.stages.processor.silence_s / 2)
        quiet_too, self._adopt_quiet = self._adopt_quiet, False
        owned = self.consumer.owned_shards()
        if owned:
            await self.stages.adopt_silent(owned, self.stages.bus.shards, quiet_too=quiet_too)

    async def _ack(self, acked: list[Fetched]) -> None:
        if acked:
            await self.stages.retry(lambda: self.consumer.ack(acked))
            self.stages.stats.acked += len(acked)

    async def _fence(self) -> None:
        """Before a write is tried again after a failure (a pause): renew the leases, and raise
        LeasesLost if shards left since the last look — a write held through a pause longer than
        the leases is not made beside their new owner, who redoes it from the checkpoints."""
        await self.consumer.renew_leases()
        if self.consumer.shard_losses != self._shard_losses:
            raise LeasesLost(f"{self.consumer.name}: shards left while a write waited")

    async def _check_ownership(self) -> bool:
        """Follow the consumer's shards; True when what was processed and not written was
        dropped (shards left: the caller drops the batch it fetched too, and the consumer hands
        this member's unacked entries out again, in order)."""
        owned = self.consumer.owned_shards()
        lost = self._owned - owned
        dropped = False
        if self.consumer.state_losses != self._state_losses:
            # the bus lost its delivery streams and checkpoints: each run held here is reloaded when
            # next met, from the replay log's checkpoint, its views dropped and rebuilt from the log
            log.warning("%s: the bus lost its state (delivery streams, checkpoints); each run "
                        "continues from the replay log when next met", self.consumer.name)
            self.stages.rebuild.update(self.stages.processor.stream_ids())
            self._state_losses = self.consumer.state_losses
            lost = lost or owned
        if self.consumer.shard_losses != self._shard_losses:
            # shards left since the last look — given up at a rebalance (a member joined) or a
            # lease expired (a full or unreachable bus), maybe taken back already: another member
            # may be writing their runs now, from their stored checkpoints and these same
            # entries. Nothing processed and not yet written is written here (it was: two
            # writers numbered the same runs, and the one whose appends came second lost its
            # events as duplicates of seqs the other had taken); this member's unacked entries
            # of the shards it keeps come again, for it to redo in order.
            lost = self._owned
            self._shard_losses = self.consumer.shard_losses
            log.info("%s lost shards %s; dropping what it processed and has not written",
                     self.consumer.name, sorted(self._owned - owned) or "(and took them back)")
            await self.writes.abandon()
            self.consumer.redeliver()
            dropped = True
        elif lost:  # the bus lost its state: reload checkpoints when needed again
            await self.writes.flush()
            log.info("%s: dropping in-memory state", self.consumer.name)
            self.stages.processor.forget_all()
        if lost or owned - self._owned:
            # a quiet run of these shards is met again only at its next event: load them all now,
            # so the tick closes the shaping windows they had open (and the silence rule ends them)
            self._adopt_quiet, self._next_adopt = True, 0.0
        if owned - (self._owned - lost):
            log.info("%s owns shards %s", self.consumer.name, sorted(owned))
        self._owned = owned
        return dropped


class _Burst(Exception):
    """A burst worker found nothing more to fetch."""

