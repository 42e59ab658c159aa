"""The Kafka worker runtime: a faust-streaming app running the same pipeline stages.

* **Source**: the bus's ingest topic (``<prefix>.ingest``, one partition per
  shard, keyed and partitioned by root run id — see :mod:`pipeline.bus.kafka`),
  consumed by the app in consumer group ``--group`` (the app id). Faust's
  consumer fetches; each fetched batch of ingest records is handed to the
  worker whole (:class:`IngestConsumer`) rather than one message at a time
  through faust's conductor, channel and stream, whose per-message tasks
  cost more than all of the pipeline's own work.
* **State**: every delivery stream's checkpoint (sequencer counters, last
  publisher seq per source run, the run's parent chain, terminal flag, open
  shaping windows) lives in the faust table ``streams``, keyed
  ``"<partition>:<run_id>"`` and written to the changelog partition of the
  root run's ingest partition. Faust assigns a changelog partition together
  with the ingest partition of the same number, so a worker that takes over
  a partition first restores that partition's checkpoints from the changelog.
  The bus keeps a copy with each append too; a restore takes whichever is
  further ahead.
* **Output**: delivery events through :class:`~pipeline.bus.kafka.KafkaBus`
  (``<prefix>.delivery``) and the replay log, in the order the consumer-group
  runtime uses (log → shaped → raw with checkpoint), then the table.
* **Pipelining**: as in the consumer-group runtime, batch N+1 is processed
  while batch N is written, and batches processed meanwhile are merged into
  the next write; writes keep batch order.
* **Offsets**: an entry is acked to faust's consumer only after its batch's
  writes; faust commits acked offsets after flushing its producer (table
  changelog), so a committed offset never runs ahead of the checkpoint and
  the writes. A rebalance waits until the entries taken are written and
  acked (``stream_wait_empty``) before the partitions move.
* **Poison** entries go to the bus's dead-letter topic with the reason.

A stop (SIGTERM/SIGINT) writes what was processed, then stops the app;
entries fetched but not processed are not acked and go to the next owner.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import faust
import msgspec
from faust.serializers import codecs
from faust.types import TP, TopicT
from mode.utils.queues import FlowControlQueue

from pipeline.bus import DeadLetter, Delivery, open_bus
from pipeline.bus import keys as bus_keys
from pipeline.bus.kafka import KafkaBus
from pipeline.errors import BusUnavailable
from pipeline.processor import DEFAULT_SILENCE_S, Processor, StreamOutput, newest_checkpoint
from pipeline.stages import BATCH, TICK_S, Stages, WorkerStats
from pipeline.store import ReplayLog, open_store
from workers.faust_seam import Intake, WorkerApp, check_faust_version

log = logging.getLogger("runwire.faust")

TAKE = 4 * BATCH
"""Entries processed in one step (the processor's batch; their writes are merged, see below)."""
PENDING_ENTRIES = 64 * BATCH
"""At most this many entries are processed into the pending write while a write is in flight."""
INTAKE_LIMIT = 16 * BATCH
"""Fetched entries waiting for the worker before faust's consumer stops fetching."""
COMMIT_EVERY = 8 * BATCH
"""Faust commits after this many acks (and every ``broker_commit_interval``)."""
BURST_IDLE_S = 2.0
"""``--burst``: stop after this long with nothing new once partitions are assigned."""
HOLE_IDLE_S = 2.0
"""A partition with unprocessed entries below its high water but nothing processed for
this long is sought back to its first unprocessed entry (see ``_rewind_lost_tails``)."""
_dead_json = msgspec.json.Encoder()
_table_json = msgspec.json.Encoder()
DEFAULT_DATA_DIR = Path(".runwire")
"""runwire's data directory (as ``runwire up --data-dir``); faust's goes in ``faust/<group>``."""
TABLE_CODEC = "runwire-json"
"""The table's key and value codec: JSON text as faust's ``json`` codec writes it, encoded faster."""
_current_partition: contextvars.ContextVar[int] = contextvars.ContextVar("partition", default=0)
"""The ingest partition whose entries are being processed (each runs in its own task)."""


class _JsonText(codecs.Codec):
    """JSON for the table's text keys and values, by msgspec (faust's ``json`` reads it too)."""

    def _dumps(self, obj: Any) -> bytes:
        return _table_json.encode(obj)

    def _loads(self, data: bytes) -> Any:
        return msgspec.json.decode(data)


codecs.register(TABLE_CODEC, _JsonText())


class StreamTable(faust.Table[str, str]):
    """A table whose key names its partition (``"<partition>:<run_id>"``)."""

    def partition_for_key(self, key: Any) -> int | None:
        return int(str(key).split(":", 1)[0])


class FaustWorker:
    """Builds and runs the faust app around :class:`~pipeline.stages.Stages`."""

    def __init__(
        self,
        bus: KafkaBus,
        store: ReplayLog,
        *,
        group: str,
        name: str,
        silence_s: float = DEFAULT_SILENCE_S,
        burst: bool = False,
        stop: asyncio.Event | None = None,
        data_dir: str | Path = DEFAULT_DATA_DIR,
    ) -> None:
        self.bus = bus
        self.data_dir = Path(data_dir)
        self.stop = stop if stop is not None else asyncio.Event()
        self.burst = burst
        self.name = name
        self.group = group
        self.stages = Stages(
            bus, store, Processor(silence_s=silence_s), self.stop,
            dead_letter=self._dead_letter, load_state=self._load_state,
        )
        self.topic_name = bus.topics[bus_keys.KAFKA_INGEST]
        self.intake = Intake(INTAKE_LIMIT)
        self.app = self._build_app(group)
        self.table = self._build_table()
        self._shard_of: dict[str, int] = {}
        self._offsets: dict[int, int] = {}
        """Highest offset processed per ingest partition (before a new partition's first: its
        start offset - 1)."""
        self._starts: dict[int, asyncio.Future[int | None]] = {}
        self._lookups: set[asyncio.Task[None]] = set()
        """New partitions' start offsets (committed, else beginning), being looked up."""
        self._owned: set[int] = set()
        self._resync: set[int] = set()
        """Retained partitions waiting for the re-read after a rebalance."""
        self._rewound: dict[int, float] = {}
        """Partitions sought back over a hole in their entries (when, monotonic)."""
        self._progress: dict[int, float] = {}
        """When each partition last had an entry processed (monotonic)."""
        self._forget = False
        self._assigned = False
        self._last_batch = time.monotonic()
        self._first_taken: float | None = None
        self._last_written: float | None = None
        # the write pipeline (see _consume)
        self._inflight: asyncio.Task[None] | None = None
        self._inflight_runs: frozenset[str] = frozenset()
        self._pending: dict[str, StreamOutput] = {}
        self._pending_shard: dict[str, int] = {}
        self._pending_acks: list[Any] = []
        self._define()

    def _build_app(self, group: str) -> WorkerApp:
        session_s = (self.bus.kafka.session_timeout_ms or self.bus.options.lease_ms) / 1000
        app = WorkerApp(
            group,
            broker=f"kafka://{self.bus.bootstrap}",
            store="memory://",
            web_enabled=False,
            # faust's own files (none with the in-memory table store) go under runwire's data dir
            datadir=str(self.data_dir / "faust" / "{conf.name}"),
            topic_partitions=self.bus.shards,
            topic_replication_factor=1,
            consumer_auto_offset_reset="earliest",
            broker_commit_every=COMMIT_EVERY,
            broker_commit_interval=0.5,
            producer_acks=-1,
            stream_wait_empty=True,
            table_cleanup_interval=3600.0,
            # a dead worker's partitions move after its session times out (the claim idle time)
            broker_session_timeout=session_s,
            broker_heartbeat_interval=max(0.3, session_s / 5),
            broker_rebalance_timeout=max(session_s, 10.0),
            loghandlers=[],
        )
        app.intake = self.intake
        app.ingest_topic = self.topic_name
        # faust only calls clear() on a managed queue (at the start of a rebalance)
        app.flow_control.manage_queue(cast("FlowControlQueue[Any]", self.intake))
        return app

    def _build_table(self) -> StreamTable:
        table = StreamTable(
            self.app,
            name="streams",
            default=None,
            partitions=self.bus.shards,
            # JSON text both ways: faust's changelog recovery decodes values as text,
            # so the msgpack checkpoint is stored base64-encoded.
            schema=faust.Schema(
                key_type=str, value_type=str,
                key_serializer=TABLE_CODEC, value_serializer=TABLE_CODEC,
            ),
        )
        return cast(StreamTable, self.app.tables.add(table))

    def _define(self) -> None:
        topic = self.app.topic(
            self.topic_name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=self.bus.shards,
        )
        # subscribed as an agent's stream would be; IngestConsumer hands its records to the intake
        self.app.topics.add(cast(TopicT, topic.clone(is_iterator=True)))
        # faust calls a receiver as receiver(sender, partitions, signal=...)
        self.app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        self.app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]

    # ---- the worker loop -------------------------------------------------
    async def _consume(self) -> None:
        """Take fetched entries, process them and write them, pipelined, until stop.

        While a batch's writes are in flight the next batches are processed
        and merged into one pending write (up to :data:`PENDING_ENTRIES`
        entries), started when the write in flight is done. Writes keep
        batch order; entries are acked after their writes. Ticks (shaping
        windows, silence) go through the same pipeline, after what was
        processed before them. On stop, what was processed is written.
        """
        intake = self.intake
        next_tick = 0.0
        pending_entries = 0
        try:
            while not self.stop.is_set():
                if intake.messages:
                    messages = intake.take(TAKE)
                    self._last_batch = time.monotonic()
                    if self._first_taken is None:
                        self._first_taken = self._last_batch
                    self._maybe_forget()
                    pending_entries += await self._process(messages)
                    inflight_done = self._inflight is None or self._inflight.done()
                    if inflight_done or pending_entries >= PENDING_ENTRIES:
                        await self._drain()
                        self._start_write()
                        pending_entries = 0
                else:
                    await self._flush()
                    pending_entries = 0
                    idle = time.monotonic() - self._last_batch > BURST_IDLE_S
                    if self.burst and self._assigned and idle:
                        self.stop.set()
                        break
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_S
                    await self._tick()
                if not intake.messages:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(intake.ready.wait(), TICK_S)
        finally:
            await self._flush()

    async def _process(self, messages: list[Any]) -> int:
        """Process a batch into the pending write; returns how many entries it took."""
        by_partition: dict[int, list[Delivery]] = defaultdict(list)
        taken: list[Any] = []
        for partition in {message.partition for message in messages}:
            await self._learn_start(partition)
        for message in messages:
            partition, offset = message.partition, message.offset
            offsets = self._offsets  # (a rebalance may replace these while a seek is awaited)
            last = offsets.get(partition)
            if (last is not None and offset == last + 1 and partition in self._owned
                    and partition not in self._resync and partition not in self._rewound):
                pass  # the next entry of an owned partition, in order (the common case)
            elif self._is_stale(partition, offset):
                await self._rewind_over_hole(partition)
                continue
            taken.append(message)
            if last is None or offset > last:
                offsets[partition] = offset
            by_partition[partition].append(Delivery(
                entry_id=f"{partition}:{offset}", shard=partition, data=message.value,
            ))
        now = time.monotonic()
        for partition in by_partition:
            self._progress[partition] = now
        # Partitions hold disjoint run trees, so their entries are processed concurrently.
        prepared = await asyncio.gather(*(
            self._prepare_partition(partition, deliveries)
            for partition, deliveries in by_partition.items()
        ))
        for partition, outputs in zip(by_partition, prepared, strict=True):
            self._merge(outputs, partition)
        self._pending_acks.extend(taken)
        return len(taken)

    async def _prepare_partition(
        self, partition: int, deliveries: list[Delivery]
    ) -> dict[str, StreamOutput]:
        log.debug("%s: partition %d entries %s..%s", self.name, partition,
                  deliveries[0].entry_id, deliveries[-1].entry_id)
        _current_partition.set(partition)
        _, outputs = await self.stages.prepare(deliveries, self._drain_for)
        return outputs

    def _merge(self, outputs: dict[str, StreamOutput], partition: int | None) -> None:
        pending = self._pending
        for run_id, output in outputs.items():
            shard = partition if partition is not None else self._shard_of.get(run_id)
            if shard is not None:
                self._shard_of[run_id] = shard
                self._pending_shard[run_id] = shard
            earlier = pending.get(run_id)
            if earlier is None:
                pending[run_id] = output
            else:  # later entries of the same stream: its events follow, its checkpoint wins
                earlier.raw.extend(output.raw)
                earlier.shaped.extend(output.shaped)
                earlier.state, earlier.stream = output.state, output.stream

    def _start_write(self) -> None:
        """Start writing (then acking) everything pending; the previous write must be drained."""
        if not self._pending and not self._pending_acks:
            return
        outputs, shards, acks = self._pending, self._pending_shard, self._pending_acks
        self._pending, self._pending_shard, self._pending_acks = {}, {}, []
        self._inflight_runs = frozenset(outputs)
        self._inflight = asyncio.create_task(self._write_and_ack(outputs, shards, acks))

    async def _write_and_ack(
        self, outputs: dict[str, StreamOutput], shards: dict[str, int], acks: list[Any]
    ) -> None:
        await self.stages.write(outputs)
        for run_id, output in outputs.items():
            shard = shards.get(run_id)
            if shard is not None:
                self.table[f"{shard}:{run_id}"] = base64.b64encode(output.state).decode()
        ack = self.app.consumer.ack
        for message in acks:
            ack(message)
        self.stages.stats.acked += len(acks)
        if acks:
            self._last_written = time.monotonic()

    async def _drain(self) -> None:
        """Wait for the write (and acks) in flight.

        Partitions prepare concurrently and each may flush (:meth:`_drain_for`):
        the reference stays until the write is done, so no concurrent flush
        starts the next write while this one is still in flight.
        """
        while self._inflight is not None:
            inflight = self._inflight
            await inflight
            if self._inflight is inflight:
                self._inflight = None

    async def _flush(self) -> None:
        """Write and ack everything processed so far, and wait for it."""
        await self._drain()
        self._start_write()
        await self._drain()

    async def _drain_for(self, run_ids: set[str]) -> None:
        """Before loading checkpoints: write what is pending or in flight for any of them first.

        A stream this process does not hold but is writing (it ended in a
        batch not yet written and was dropped from memory, or a rebalance
        made the worker forget it) must be read back only after that write.
        """
        if not run_ids.isdisjoint(self._pending):
            await self._flush()
        elif self._inflight is not None and not self._inflight_runs.isdisjoint(run_ids):
            await self._drain()

    async def _tick(self) -> None:
        """Seek back lost tails; close due windows and end silent runs (written in order)."""
        self._maybe_forget()
        await self._rewind_lost_tails()
        highwaters: dict[int, int | None] = {}
        outputs = self.stages.processor.tick(
            caught_up=lambda run_id: self._caught_up(run_id, highwaters)
        )
        if outputs:
            self._merge(outputs, None)
            if self._inflight is None or self._inflight.done():
                await self._drain()
                self._start_write()

    # ---- entries out of order -------------------------------------------
    def _is_stale(self, partition: int, offset: int) -> bool:
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
        if partition not in self._owned:  # moved to another owner: never write its runs
            log.info("%s: skipping entry %d:%d of a partition it no longer owns",
                     self.name, partition, offset)
            return True
        last = self._offsets.get(partition)
        if last is None or offset <= last + 1:
            self._resync.discard(partition)
            self._rewound.pop(partition, None)
            return False
        if partition in self._resync:
            log.info("%s: skipping stale entry %d:%d taken before the rebalance",
                     self.name, partition, offset)
        else:
            log.info("%s: skipping entry %d:%d past a hole after %d:%d",
                     self.name, partition, offset, partition, last)
        return True

    async def _rewind_lost_tails(self) -> None:
        """Seek back partitions whose entries past the last processed one never arrive.

        The hole of :meth:`_rewind_over_hole` can also be a partition's
        tail: nothing after it to reveal it. A partition whose high water
        is past ``last + 1`` but that has had nothing processed for
        :data:`HOLE_IDLE_S` is sought back the same way (a busy worker only
        causes a re-read, which the sequencer drops as duplicates). A new
        partition counts from its start offset (see :meth:`_on_assigned`),
        so one that lost every entry before the first was processed is
        sought back too.
        """
        for partition, start in list(self._starts.items()):
            if start.done():  # a new partition none of whose entries arrived yet
                await self._learn_start(partition)
        now = time.monotonic()
        for partition, last in list(self._offsets.items()):
            if now - self._progress.get(partition, now) < HOLE_IDLE_S or self.intake.messages:
                continue
            highwater = self.app.consumer.highwater(TP(self.topic_name, partition))
            if highwater is not None and highwater > last + 1:
                await self._rewind_over_hole(partition)

    async def _rewind_over_hole(self, partition: int) -> None:
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
        if partition in self._resync or partition not in self._owned:
            return  # faust's own seek after the rebalance re-reads them / not ours
        now = time.monotonic()
        if now - self._rewound.get(partition, -HOLE_IDLE_S) < HOLE_IDLE_S:
            return
        self._rewound[partition] = now
        offset = self._offsets[partition] + 1
        log.warning("%s: entries of ingest partition %d from offset %d were not delivered; "
                    "seeking back to re-read them", self.name, partition, offset)
        await self.app.consumer.seek(TP(self.topic_name, partition), offset)

    async def _learn_start(self, partition: int) -> None:
        """Wait for a newly assigned partition's start offset; it counts as ``last + 1``."""
        start = self._starts.get(partition)
        if start is None:
            return
        offset = await start
        if self._starts.get(partition) is start:
            del self._starts[partition]
            if offset is not None and partition in self._owned:
                self._offsets.setdefault(partition, offset - 1)

    async def _lookup_starts(self, partitions: list[int], futures: list[asyncio.Future[int | None]]) -> None:
        try:
            starts: dict[int, int] = {}
            for attempt in range(3):
                try:
                    starts = await self.bus.start_offsets(self.group, partitions)
                    break
                except BusUnavailable as exc:
                    log.warning("%s: cannot read the start offsets of %s (%s)%s", self.name,
                                partitions, exc, "; retrying" if attempt < 2 else "")
                    await asyncio.sleep(0.5)
            for partition, future in zip(partitions, futures, strict=True):
                if not future.done():
                    future.set_result(starts.get(partition))
        finally:
            for future in futures:
                if not future.done():
                    future.set_result(None)

    # ---- faust callbacks ------------------------------------------------
    def _caught_up(self, run_id: str, highwaters: dict[int, int | None]) -> bool:
        """Whether everything in the stream's ingest partition up to its high water was processed."""
        partition = self._shard_of.get(run_id)
        if partition is None:
            return True
        if partition not in highwaters:
            highwaters[partition] = self.app.consumer.highwater(TP(self.topic_name, partition))
        highwater = highwaters[partition]
        return highwater is None or self._offsets.get(partition, -1) + 1 >= highwater

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        self._forget = True
        self.bus.ownership_changed()

    async def _on_assigned(self, sender: Any, assigned: Any, **_: Any) -> None:
        """Record the new assignment; look up where each new partition starts.

        A new partition's start offset (the group's committed offset, else
        its beginning) stands for its last processed offset + 1, so entries
        lost before its first one is processed (see :meth:`_rewind_over_hole`)
        are a hole like any other: the first entry past it is skipped and the
        partition sought back, and a partition that lost all of them is
        sought back on the timer.
        """
        owned = sorted(tp.partition for tp in assigned if tp.topic == self.topic_name)
        log.info("%s owns shards %s", self.name, owned)
        retained = self._owned & set(owned)
        for partition in set(self._offsets) - retained:  # another owner may have moved on
            del self._offsets[partition]
        self._resync = retained & set(self._offsets)
        self._owned = set(owned)
        fresh = [p for p in owned if p not in self._resync]
        now = time.monotonic()
        for partition in fresh:
            self._progress[partition] = now
        if fresh:
            futures: list[asyncio.Future[int | None]] = [
                asyncio.get_running_loop().create_future() for _ in fresh
            ]
            self._starts.update(zip(fresh, futures, strict=True))
            self._lookups.add(task := asyncio.create_task(self._lookup_starts(fresh, futures)))
            task.add_done_callback(self._lookups.discard)
        self.bus.ownership_changed()
        self._assigned = True
        self._last_batch = time.monotonic()

    def _maybe_forget(self) -> None:
        if self._forget:
            self._forget = False
            self.stages.processor.forget_all()
            self._shard_of.clear()

    # ---- stages hooks -----------------------------------------------------
    async def _load_state(self, run_id: str) -> bytes | None:
        shard = self._shard_of.get(run_id, _current_partition.get())
        self._shard_of.setdefault(run_id, shard)
        stored = self.table.get(f"{shard}:{run_id}")
        in_table = base64.b64decode(stored) if stored else None
        on_bus = await self.bus.load_state((run_id, "raw"))
        return newest_checkpoint(in_table, on_bus)

    async def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        dead = DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.app.conf.id,
        )
        await self.bus._dead_letter(dead)

    # ---- running ------------------------------------------------------------
    async def run(self) -> WorkerStats:
        """Start the app, run until stop, write what was processed, stop the app."""
        started = time.monotonic()
        check_faust_version()
        (self.data_dir / "faust").mkdir(parents=True, exist_ok=True)
        await self.app.start()
        consuming = asyncio.create_task(self._consume(), name="runwire-faust-worker")
        stopping = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({consuming, stopping}, return_when=asyncio.FIRST_COMPLETED)
            self.stop.set()
            await consuming  # writes what was processed; raises what stopped it early
        finally:
            stopping.cancel()
            consuming.cancel()
            for lookup in list(self._lookups):
                lookup.cancel()
            self.intake.clear()  # not processed: not acked, read again by the next owner
            await self.app.stop()
            self.stages.stats.seconds = time.monotonic() - started
            if self._first_taken is not None and self._last_written is not None:
                # from the first fetched entries the worker took to the end of the last writes
                self.stages.stats.busy_seconds = self._last_written - self._first_taken
        return self.stages.finish_stats()


def run_faust_worker(
    bus_url: str,
    store_url: str,
    *,
    group: str,
    name: str,
    burst: bool = False,
    silence_s: float = DEFAULT_SILENCE_S,
    data_dir: str | Path = DEFAULT_DATA_DIR,
) -> WorkerStats:
    """``runwire worker --bus kafka://…``: run the faust app until SIGTERM/SIGINT (or idle with burst)."""
    return asyncio.run(_main(bus_url, store_url, group, name, burst, silence_s, Path(data_dir)))


async def _main(
    bus_url: str, store_url: str, group: str, name: str, burst: bool, silence_s: float,
    data_dir: Path,
) -> WorkerStats:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with open_bus(bus_url) as bus, open_store(store_url) as store:
        if not isinstance(bus, KafkaBus):
            raise TypeError(f"the faust worker needs a kafka:// bus, not {bus_url!r}")
        worker = FaustWorker(
            bus, store, group=group, name=name, silence_s=silence_s, burst=burst, stop=stop,
            data_dir=data_dir,
        )
        return await worker.run()
