"""The consumer-group worker runtime (memory://, redis://, and any bus's generic consumer API).

One loop: fetch a batch of ingest entries → decode (poison → dead letter) →
restore the checkpoints of streams this process has not seen → process
(fan-in, sequencing, shaping: :class:`pipeline.processor.Processor`) →
write → ack. Writes go replay log first, then each stream's shaped events,
then its raw events with its checkpoint; the ack comes only after all of them
are durable (PITFALLS 1), so a crash anywhere replays the batch to the same
result and idempotent appends drop what was already written.

Whenever the consumer has caught up (a fetch returned less than a full
batch), a tick closes shaping windows whose end has passed and ends silent
runs; ticks also run every ``tick_s`` while idle.

A stop event ends the loop between batches: the batch in flight is finished,
written and acked, then the consumer leaves its group.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import msgspec

from pipeline.bus import Bus, Consumer, Delivery, EncodedAppend
from pipeline.bus.keys import shard_for
from pipeline.envelope import Event, decode_many, encode
from pipeline.errors import ProtocolError, RunwireError
from pipeline.processor import DEFAULT_SILENCE_S, Processor, StreamOutput, validate
from pipeline.store import ReplayLog

log = logging.getLogger("runwire.worker")

BATCH = 512
"""The faust app's unit of work (its take and merge sizes are multiples of it)."""
FETCH = 2048
"""Entries a consumer-group worker fetches at once. A fetch returns what is there,
up to this, without waiting for more, so a larger batch costs no latency; with a
backlog it is ~30 % more events/s than 512 (fewer round trips and writes)."""
TICK_S = 0.05
RETRY_MAX_S = 2.0
APPEND_CONCURRENCY = 32
"""Checkpoint loads in flight at once (bounds the bus client's connections)."""
PENDING_BATCHES = 8
"""At most this many fetched batches are merged into one write while the previous one is in flight."""
APPEND_CHUNK = 256
"""Delivery appends sent together (one pipeline on Redis)."""
T = TypeVar("T")


class EncodedWrite:
    """One write, encoded (see :meth:`Stages.encode`)."""

    __slots__ = ("log", "raw", "shaped")

    def __init__(self) -> None:
        self.log: list[tuple[str, Sequence[Event], Sequence[bytes]]] = []
        self.raw: list[EncodedAppend] = []
        self.shaped: list[EncodedAppend] = []


class WorkerStats(msgspec.Struct, kw_only=True):
    """What one worker did (returned by :func:`run_worker`)."""

    batches: int = 0
    entries: int = 0
    acked: int = 0
    raw: int = 0
    shaped: int = 0
    duplicates: int = 0
    gaps: int = 0
    dead_lettered: int = 0
    silenced: int = 0
    seconds: float = 0.0
    busy_seconds: float = 0.0
    """From the first fetched batch to the end of the last batch's writes."""
    log_seconds: float = 0.0
    """Time spent waiting for replay log appends (part of ``busy_seconds``)."""


async def run_worker(
    bus: Bus,
    store: ReplayLog,
    *,
    group: str,
    name: str,
    stop: asyncio.Event | None = None,
    burst: bool = False,
    silence_s: float = DEFAULT_SILENCE_S,
    batch: int = FETCH,
    tick_s: float = TICK_S,
    claim_idle_ms: int | None = None,
) -> WorkerStats:
    """Consume ``group`` as ``name`` until ``stop`` is set (or, with ``burst``, until idle)."""
    stop = stop if stop is not None else asyncio.Event()
    consumer = (
        bus.consumer(group, name)
        if claim_idle_ms is None
        else bus.consumer(group, name, claim_idle_ms=claim_idle_ms)
    )
    stages = Stages(
        bus, store, Processor(silence_s=silence_s), stop, dead_letter=consumer.dead_letter
    )
    worker = ConsumerLoop(consumer, stages)
    started = time.monotonic()
    try:
        await worker.loop(batch=batch, tick_s=tick_s, burst=burst)
    finally:
        await consumer.close()
        stages.stats.seconds = time.monotonic() - started
    return stages.finish_stats()


class Stages:
    """Decode → restore → process → write for one batch; shared by both runtimes.

    ``dead_letter`` moves a poison entry aside (the consumer's, or the faust
    app's dead-letter topic); ``load_state`` finds a stream's checkpoint
    (the bus's; the faust app also looks in its table).
    """

    def __init__(
        self,
        bus: Bus,
        store: ReplayLog,
        processor: Processor,
        stop: asyncio.Event,
        *,
        dead_letter: Callable[[Delivery, str], Awaitable[None]],
        load_state: Callable[[str], Awaitable[bytes | None]] | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.processor = processor
        self.stop = stop
        self.stats = WorkerStats()
        self._dead_letter_to = dead_letter
        self._load = load_state or self._bus_state
        self._first_batch_at: float | None = None
        self._appends = asyncio.Semaphore(APPEND_CONCURRENCY)

    async def handle(
        self, deliveries: Sequence[Delivery]
    ) -> tuple[list[Delivery], dict[str, StreamOutput]]:
        """Decode, process and write one batch; returns the entries to ack and what was written."""
        acked, outputs = await self.prepare(deliveries)
        await self.write(outputs)
        self.busy_until_now()
        return acked, outputs

    async def prepare(
        self,
        deliveries: Sequence[Delivery],
        before_restore: Callable[[set[str]], Awaitable[None]] | None = None,
        *,
        seal: bool = True,
    ) -> tuple[list[Delivery], dict[str, StreamOutput]]:
        """Decode (dead-lettering poison), restore checkpoints and process; no delivery writes.

        ``before_restore(run_ids)`` runs before the checkpoints of ``run_ids``
        are loaded from the bus (a runtime whose writes to some of those
        streams are still in flight waits for them there). ``seal=False``
        leaves the checkpoints to :meth:`write` (see :meth:`Processor.process`).
        """
        if self._first_batch_at is None:
            self._first_batch_at = time.monotonic()
        self.stats.batches += 1
        self.stats.entries += len(deliveries)
        good: list[Delivery] = []
        events: list[Event] = []
        for delivery, result in zip(
            deliveries, decode_many([d.data for d in deliveries]), strict=True
        ):
            if not isinstance(result, ProtocolError):
                try:
                    validate(result)
                except ProtocolError as invalid:
                    result = invalid
            if isinstance(result, ProtocolError):
                await self._dead_letter(delivery, f"undecodable: {result}")
            else:
                good.append(delivery)
                events.append(result)
        await self._restore(events, before_restore)
        outputs, failures = self.processor.process_each(events, seal=seal)
        for index, error in failures:
            await self._dead_letter(good[index], f"processing failed: {error!r}")
        failed = {index for index, _ in failures}
        return [d for i, d in enumerate(good) if i not in failed], outputs

    async def adopt_silent(self, owned: frozenset[int], shards: int) -> None:
        """Load unfinished runs of owned shards that went silent, so the silence rule ends them.

        A worker only knows the runs whose events it has seen; a run that was
        already silent when its previous owner died is found in the replay log.
        """
        cutoff = datetime.now(UTC) - timedelta(seconds=self.processor.silence_s)
        for info in await self.retry(lambda: self.store.runs(until=cutoff, limit=1000)):
            run_id = info.run_id
            if info.terminal or self.processor.holds(run_id):
                continue
            if shard_for(info.root_id or run_id, shards) not in owned:
                continue
            state = await self._load_state(run_id)
            seen = info.updated_at.timestamp() if info.updated_at else None
            self.processor.restore(run_id, state, last_activity=seen)

    def busy_until_now(self) -> None:
        if self._first_batch_at is not None:
            self.stats.busy_seconds = time.monotonic() - self._first_batch_at

    async def tick(
        self, caught_up: Callable[[str], bool] | None = None
    ) -> dict[str, StreamOutput]:
        """Close due shaping windows and end silent runs; write what that produced."""
        outputs = self.processor.tick(caught_up=caught_up)
        if outputs:
            await self.write(outputs)
        return outputs

    async def write(self, outputs: dict[str, StreamOutput]) -> None:
        """Replay log, then shaped views, then raw views with checkpoints; retried until durable.

        The log goes first, so anything a client can see on either view (the
        terminal event included) is already in the replay log — an export or a
        resume from the log right after the end is complete — and a stream's
        checkpoint (stored with its raw append) never runs ahead of the log: a
        batch redone after a crash would otherwise drop the events as
        duplicates before they reached the log. Shaped appends go before the
        raw checkpoints, which record the shaping windows as closed.
        """
        if outputs:
            encoded = self.encode(outputs)
            await self.write_log(encoded)
            await self.write_views(encoded)

    def encode(self, outputs: dict[str, StreamOutput]) -> EncodedWrite:
        """Take the checkpoints and encode every event once, for the log and the views alike."""
        Processor.seal(outputs)
        write = EncodedWrite()
        for output in outputs.values():
            encoded = list(map(encode, output.raw))
            write.log.append((output.run_id, output.raw, encoded))
            write.raw.append(((output.run_id, "raw"), output.raw, encoded, output.state))
            if output.shaped:
                write.shaped.append(((output.run_id, "shaped"), output.shaped,
                                     list(map(encode, output.shaped)), None))
        return write

    async def write_log(self, write: EncodedWrite) -> None:
        """The replay-log part of :meth:`write` (first)."""
        await self._append_log(write.log)

    async def write_views(self, write: EncodedWrite) -> None:
        """The delivery-stream part of :meth:`write`: shaped views, then raw views with checkpoints."""
        await self._append_many(write.shaped)
        await self._append_many(write.raw)
        self.stats.raw += sum(len(events) for _, events, _ in write.log)
        self.stats.shaped += sum(len(events) for _, events, _, _ in write.shaped)

    async def _append_log(self, rows: list[tuple[str, Sequence[Event], Sequence[bytes]]]) -> None:
        if any(events for _, events, _ in rows):
            started = time.monotonic()
            await self.retry(lambda: self.store.append_streams(rows))
            self.stats.log_seconds += time.monotonic() - started

    async def _append_many(self, appends: list[EncodedAppend]) -> None:
        """Each key appears once here, so the appends may be sent together.

        Chunks go through ``bus.append_many_encoded``: one pipeline on Redis,
        one produce per partition on Kafka, plain calls in memory.
        """
        for start in range(0, len(appends), APPEND_CHUNK):
            chunk = appends[start : start + APPEND_CHUNK]
            await self.retry(functools.partial(self.bus.append_many_encoded, chunk))

    async def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        log.warning("dead-lettering %s (shard %d): %s", delivery.entry_id, delivery.shard, reason)
        await self.retry(lambda: self._dead_letter_to(delivery, reason))
        self.stats.dead_lettered += 1

    async def _restore(
        self,
        events: Sequence[Event],
        before_restore: Callable[[set[str]], Awaitable[None]] | None = None,
    ) -> None:
        missing = self.processor.missing(events)
        while missing:
            if before_restore is not None:
                await before_restore(missing)
            ordered = sorted(missing)
            states = await asyncio.gather(*(self._load_state(run_id) for run_id in ordered))
            for run_id, state in zip(ordered, states, strict=True):
                self.processor.restore(run_id, state)
            missing = self.processor.missing(events)

    async def _load_state(self, run_id: str) -> bytes | None:
        async with self._appends:
            return await self.retry(lambda: self._load(run_id))

    async def _bus_state(self, run_id: str) -> bytes | None:
        return await self.bus.load_state((run_id, "raw"))

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        delay = 0.05
        while True:
            try:
                return await call()
            except RunwireError as error:
                if not error.retriable or self.stop.is_set():
                    raise
                log.warning("retrying after %s (in %.2fs)", error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    def finish_stats(self) -> WorkerStats:
        stats = self.stats
        stats.duplicates = self.processor.stats.duplicates
        stats.gaps = self.processor.stats.gaps
        stats.silenced = self.processor.stats.silenced
        return stats


class _Write:
    """A write in flight: its task, whether its replay-log part is done, the streams it writes."""

    __slots__ = ("logged", "runs", "task")

    def __init__(self, runs: frozenset[str]) -> None:
        self.runs = runs
        self.logged = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class ConsumerLoop:
    """fetch → :class:`Stages` → ack, for any :class:`~pipeline.bus.Consumer`."""

    def __init__(self, consumer: Consumer, stages: Stages) -> None:
        self.consumer = consumer
        self.stages = stages
        self._owned: frozenset[int] = frozenset()
        self._writes: list[_Write] = []
        """Writes in flight, oldest first (at most two: one in its views, one in its log)."""
        self._pending: dict[str, StreamOutput] = {}
        """Processed batches waiting for the next write (merged per stream)."""
        self._pending_acks: list[Delivery] = []
        self._pending_entries = 0
        self._next_adopt = 0.0

    async def loop(self, *, batch: int, tick_s: float, burst: bool) -> None:
        """Batches are pipelined, and their writes grouped while the store is busy.

        Three things overlap: decoding and processing the next batches (this
        task), the replay-log write of one write (the log's thread), and the
        delivery appends and acks of the write before it (Redis/Kafka). A write
        starts once the previous one's log part is done; until then further
        batches are processed and merged into it (up to ``PENDING_BATCHES``
        batches): one replay-log transaction and one delivery append per
        stream for all of them, so the per-write costs (commit, run
        metadata, round trips) shrink as the backlog grows. Each write's
        views go out after its own log part and after the previous write's
        views, so streams stay in order; each entry is acked after its writes.
        """
        block_ms = max(1, int(tick_s * 1000))
        stop = self.stages.stop
        most = batch * PENDING_BATCHES
        prefetch: asyncio.Task[list[Delivery]] | None = None
        finished = False
        try:
            while not stop.is_set() or prefetch is not None:
                if prefetch is not None:
                    deliveries, prefetch = await prefetch, None
                else:
                    deliveries = await self._fetch(batch, block_ms)
                fetched = len(deliveries)
                await self._check_ownership()
                if any(delivery.shard not in self._owned for delivery in deliveries):
                    # a lease lost since the fetch: the shard's new owner redoes them
                    deliveries = [d for d in deliveries if d.shard in self._owned]
                if fetched == batch and not stop.is_set():
                    # a backlog: the next fetch's round trip (which may queue behind this
                    # worker's own appends on the server) overlaps processing this batch
                    prefetch = asyncio.create_task(self._fetch(batch, block_ms))
                if deliveries:
                    acked, outputs = await self.stages.prepare(
                        deliveries, self._drain_for, seal=False)
                    self._merge(outputs, acked, len(deliveries))
                    if self._ready() or self._pending_entries >= most:
                        await self._wait_ready()
                        self._start_write()
                if fetched < batch:
                    await self._flush()
                    await self._adopt_silent()
                    await self.stages.tick()
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

    async def _fetch(self, batch: int, block_ms: int) -> list[Delivery]:
        """One fetch, retried while the bus is unavailable (until a stop)."""
        return await self.stages.retry(lambda: self.consumer.fetch(batch, block_ms=block_ms))

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

    def _merge(self, outputs: dict[str, StreamOutput], acked: list[Delivery], entries: int) -> None:
        pending = self._pending
        for run_id, output in outputs.items():
            earlier = pending.get(run_id)
            if earlier is None:
                pending[run_id] = output
            else:  # a later batch of the same stream: its events follow, its checkpoint wins
                earlier.raw.extend(output.raw)
                earlier.shaped.extend(output.shaped)
                earlier.state, earlier.stream = output.state, output.stream
        self._pending_acks.extend(acked)
        self._pending_entries += entries

    def _ready(self) -> bool:
        """Whether a new write may start: none in flight, or one whose log part is done."""
        for write in [w for w in self._writes if w.task is not None and w.task.done()]:
            self._writes.remove(write)
            write.task.result()  # type: ignore[union-attr]  # a failed write fails the loop
        return not self._writes or (len(self._writes) < 2 and self._writes[-1].logged.is_set())

    async def _wait_ready(self) -> None:
        while not self._ready():
            newest = self._writes[-1]
            if not newest.logged.is_set():
                await newest.logged.wait()
            else:
                assert self._writes[0].task is not None
                await asyncio.wait([self._writes[0].task])

    def _start_write(self) -> None:
        """Start writing (then acking) everything pending; call only when :meth:`_ready`."""
        if not self._pending and not self._pending_acks:
            return
        outputs, acked = Processor.seal(self._pending), self._pending_acks
        self._pending, self._pending_acks, self._pending_entries = {}, [], 0
        previous = self._writes[-1].task if self._writes else None
        write = _Write(frozenset(outputs))
        write.task = asyncio.create_task(self._write_and_ack(outputs, acked, previous, write.logged))
        self._writes.append(write)

    async def _flush(self) -> None:
        """Write and ack everything processed so far, and wait for it."""
        await self._drain()
        self._start_write()
        await self._drain()

    async def _adopt_silent(self) -> None:
        now = time.monotonic()
        if now < self._next_adopt:
            return
        self._next_adopt = now + max(1.0, self.stages.processor.silence_s / 2)
        owned = self.consumer.owned_shards()
        if owned:
            await self.stages.adopt_silent(owned, self.stages.bus.shards)

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
        acked: list[Delivery],
        previous: asyncio.Task[None] | None,
        logged: asyncio.Event,
    ) -> None:
        try:
            encoded = self.stages.encode(outputs)
            await self.stages.write_log(encoded)
        finally:
            logged.set()
        if previous is not None:  # views in write order (a failed write fails this one too)
            await previous
        await self.stages.write_views(encoded)
        await self._ack(acked)
        self.stages.busy_until_now()

    async def _ack(self, acked: list[Delivery]) -> None:
        if acked:
            await self.stages.retry(lambda: self.consumer.ack(acked))
            self.stages.stats.acked += len(acked)

    async def _check_ownership(self) -> None:
        owned = self.consumer.owned_shards()
        lost = self._owned - owned
        if lost:  # their streams may have a new writer: reload checkpoints when needed again
            await self._flush()
            log.info("%s lost shards %s; dropping in-memory state", self.consumer.name, sorted(lost))
            self.stages.processor.forget_all()
        if owned - self._owned:
            log.info("%s owns shards %s", self.consumer.name, sorted(owned))
        self._owned = owned
