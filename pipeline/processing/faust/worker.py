"""The Kafka worker: a faust-streaming app as the source of the one write pipeline.

* **Source**: the bus's ingest topic (``<prefix>.ingest``, one partition per
  shard, keyed and partitioned by root run id — see :mod:`runwire.bus.kafka.bus`),
  consumed by the app in consumer group ``--group`` (the app id). Faust's
  consumer fetches; each fetched batch of ingest records is handed to the
  worker whole (:class:`IngestConsumer`) rather than one message at a time
  through faust's conductor, channel and stream, whose per-message tasks
  cost more than all of the pipeline's own work.
* **State**: every delivery stream's checkpoint (sequencer counters, last
  publisher seq per source run, the run's parent chain, terminal flag, open
  shaping windows) is where the consumer-group runtime keeps it: stored with
  each raw append on the bus (a state record in the delivery topic, which every
  process's delivery tail reads), and with each write in the replay log, the
  checkpoint of record (``docs/workers.md`` § How state survives a crash). A worker that takes
  over a partition loads them as any worker does; no faust table holds a copy.
* **Output**: delivery events through :class:`~runwire.bus.kafka.bus.KafkaBus`
  (``<prefix>.delivery``) and the replay log, in the order the consumer-group
  runtime uses (log → shaped → raw with checkpoint).
* **Offsets**: an entry is acked to faust's consumer only after its batch's
  writes, so a committed offset never runs ahead of the checkpoint and the
  writes. A rebalance waits until the entries taken are written and
  acked (``stream_wait_empty``) before the partitions move.
* **Poison** entries go to the bus's dead-letter topic with the reason.

A stop (SIGTERM/SIGINT) writes what was processed, then stops the app;
entries fetched but not processed are not acked and go to the next owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ...bus import DeadLetter, Delivery
from ...bus import keys as bus_keys
from ...bus.base import Entry, Fetched, event_count
from ...bus.kafka.bus import KafkaBus
from ...bus.kafka.io import ingest_event_count, ingest_events
from ...store.ports import RunHistory
from ..processor import DEFAULT_QUIET_S, DEFAULT_SILENCE_S, Processor, StreamOutput
from ..stages import BATCH, TICK_S, Stages, WorkerStats
from ..writes import WritePipeline
from .partitions import HOLE_IDLE_S, PartitionTracker
from .seam import Intake, check_faust_version, raise_if_crashed
from .setup import build_app, subscribe

log = logging.getLogger("runwire.faust")

TAKE = 4 * BATCH
"""Events processed in one step (the processor's batch; their writes are merged, see below)."""
PENDING_ENTRIES = 64 * BATCH
"""At most this many events are processed into the pending write while a write is in flight."""
INTAKE_LIMIT = 16 * BATCH
"""Fetched events waiting for the worker before faust's consumer stops fetching."""
BURST_IDLE_S = 2.0
"""``--burst``: stop after this long with nothing new once partitions are assigned."""
DEFAULT_DATA_DIR = Path(".runwire")
"""runwire's data directory (as ``runwire up --data-dir``); faust's goes in ``faust/<group>``."""


class FaustWorker:
    """Builds and runs the faust app around :class:`~runwire.processing.stages.Stages`."""

    def __init__(
        self,
        bus: KafkaBus,
        store: RunHistory,
        *,
        group: str,
        name: str,
        silence_s: float = DEFAULT_SILENCE_S,
        burst: bool = False,
        stop: asyncio.Event | None = None,
        data_dir: str | Path = DEFAULT_DATA_DIR,
        quiet_s: float = DEFAULT_QUIET_S,
    ) -> None:
        self.bus = bus
        self.data_dir = Path(data_dir)
        self.stop = stop if stop is not None else asyncio.Event()
        self.burst = burst
        self.name = name
        self.group = group
        self.stages = Stages(
            bus, store, Processor(silence_s=silence_s, quiet_s=quiet_s), self.stop,
            dead_letter=self._dead_letter,
        )
        self.topic_name = bus.topics[bus_keys.KAFKA_INGEST]
        self.intake = Intake(INTAKE_LIMIT)
        self.app = build_app(bus, group, self.intake, self.topic_name, self.data_dir)
        self._shard_of: dict[str, int] = {}
        """The ingest partition of each stream held (whether its partition is caught up, at a tick)."""
        self.partitions = PartitionTracker(
            name=name, topic=self.topic_name, consumer=lambda: self.app.consumer,
            start_offsets=lambda partitions: bus.start_offsets(group, partitions),
            busy=lambda: bool(self.intake.messages),
            first_offset=lambda partition, offset: bus.link.first_offset(
                self.topic_name, partition, offset),
            confirm_s=max(2 * HOLE_IDLE_S, bus.kafka.request_timeout_ms / 1000),
            life=bus.link.check_life, losses=lambda: bus.link.losses, outage=self.stages.outage,
        )
        self.app.broker_check = lambda: self.partitions.check_life(ask=False)
        self._forget = False
        self._assigned = False
        self._last_batch = time.monotonic()
        self._first_taken: float | None = None
        self._last_written: float | None = None
        self.writes: WritePipeline[Any] = WritePipeline(self.stages, self._ack)
        subscribe(self.app, self.topic_name, self.bus.shards)
        # faust calls a receiver as receiver(sender, partitions, signal=...)
        self.app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        self.app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]

    async def _consume(self) -> None:
        """Take fetched entries, process them and write them, pipelined, until stop.

        The writes go through the one write pipeline every runtime drives
        (:class:`~runwire.processing.writes.WritePipeline`): while a write is
        in flight the next batches are processed and merged into the pending
        write (up to :data:`PENDING_ENTRIES` entries). While fetched entries
        keep coming (a backlog), that write starts once the one before is
        wholly done, views and acks too; when the intake runs dry, once the
        one before has its replay-log part done. Fewer, larger writes under a
        backlog: each costs the log an upsert per run it touches, and faust's
        fetches fill while the views go out (``docs/benchmarks.md`` § Workers).
        Writes keep batch order; entries are acked
        after their writes. Ticks (shaping windows, silence) go through the
        same pipeline, after what was processed before them. On stop, what
        was processed is written.
        """
        intake = self.intake
        next_tick = 0.0
        try:
            while not self.stop.is_set():
                if intake.messages:
                    self._last_batch = time.monotonic()
                    if self._first_taken is None:
                        self._first_taken = self._last_batch
                    self._maybe_forget()
                    # no reference kept: a rebalance waits until each message is acked or gone
                    await self._process(intake.take(TAKE))
                    if self.writes.idle() or self.writes.pending_entries >= PENDING_ENTRIES:
                        await self.writes.write_pending()
                elif not self.writes.has_pending or self.writes.ready():
                    await self.writes.flush()
                    idle = time.monotonic() - self._last_batch > BURST_IDLE_S
                    if self.burst and self._assigned and idle:
                        self.stop.set()
                        break
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_S
                    await self._tick()
                if not intake.messages:
                    await self._wait_for_records()
        finally:
            await self.writes.flush()

    async def _wait_for_records(self) -> None:
        """Until records arrive (at most :data:`TICK_S`) — or, while what is pending waits behind
        a write in its replay-log part, until that part is done. What is pending cannot be logged
        before it anyway, so records fetched meanwhile join it: under a backlog the intake runs
        dry between two fetches, and flushing there made writes of a third the size (each costs
        the log an upsert per run it touches)."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.intake.ready.wait())]
        if self.writes.has_pending and not self.writes.ready():
            waits.append(asyncio.ensure_future(self.writes.until_logged()))
        _, waiting = await asyncio.wait(waits, timeout=TICK_S, return_when=asyncio.FIRST_COMPLETED)
        for wait in waiting:
            wait.cancel()

    async def _process(self, messages: list[Any]) -> int:
        """Process a batch into the pending write; returns how many events it took.

        A record of several events (:mod:`runwire.bus.ingest_entries`) is one whole
        :class:`~runwire.bus.base.Entry`, decoded with the batch's others in one pass, as a
        Redis fetch's are; a poison event is dead-lettered alone (its record then split into
        one delivery per event), and the record is acked after its batch's writes like any
        other.
        """
        by_partition: dict[int, list[Fetched]] = defaultdict(list)
        taken: list[Any] = []
        for partition in {message.partition for message in messages}:
            await self.partitions.learn_start(partition)
        life = self.bus.life
        for message in messages:
            partition, offset = message.partition, message.offset
            if not await self.partitions.accept(partition, offset):
                continue
            taken.append(message)
            headers = message.headers
            # stamped in a former life of the broker: its publisher sends it again
            if headers and not life.is_current(headers) and await life.of_former_life(headers):
                continue
            entry_id = f"{partition}:{offset}"
            count = ingest_event_count(message.value, headers) if headers else 1
            if count > 1:  # a record of several events: decoded whole (split only for a poison one)
                by_partition[partition].append(Entry(entry_id, partition, message.value, count))
            else:
                data = ingest_events(message.value, headers)[0] if headers else message.value
                by_partition[partition].append(Delivery(entry_id=entry_id, shard=partition, data=data))
        self.partitions.processed(list(by_partition))
        # Partitions hold disjoint run trees, so their entries are processed concurrently.
        prepared = await asyncio.gather(*(
            self._prepare_partition(partition, deliveries)
            for partition, deliveries in by_partition.items()
        ))
        for partition, outputs in zip(by_partition, prepared, strict=True):
            self._merge(outputs, partition)
        taken_events = sum(map(event_count, by_partition.values()))
        self.writes.add(taken, taken_events)
        return taken_events

    async def _prepare_partition(
        self, partition: int, deliveries: list[Fetched]
    ) -> dict[str, StreamOutput]:
        log.debug("%s: partition %d entries %s..%s", self.name, partition,
                  deliveries[0].entry_id, deliveries[-1].entry_id)
        _, outputs = await self.stages.prepare(deliveries, self.writes.drain_for)
        return outputs

    def _merge(self, outputs: dict[str, StreamOutput], partition: int | None) -> None:
        if partition is not None:
            self._shard_of.update(dict.fromkeys(outputs, partition))
        self.writes.merge(outputs)

    async def _ack(self, messages: list[Any]) -> None:
        ack = self.app.consumer.ack
        for message in messages:
            ack(message)
        self.stages.stats.acked += len(messages)
        if messages:
            self._last_written = time.monotonic()

    async def _tick(self) -> None:
        """Seek back lost tails; close due windows and end silent runs (written in order).

        Raises :class:`~runwire.processing.faust.seam.FaustCrashed` once faust's Fetcher (or the
        app) crashed: the worker ends, writing what it processed, rather than live on fetching
        nothing (docs/workers.md).
        """
        raise_if_crashed(self.app, self.name)
        self._maybe_forget()
        await self.partitions.check_life(ask=False)
        await self.partitions.rewind_lost_tails()
        highwaters: dict[int, int | None] = {}
        outputs = self.stages.processor.tick(
            caught_up=lambda run_id: self._caught_up(run_id, highwaters)
        )
        if outputs:
            self._merge(outputs, None)
            if self.writes.ready():
                await self.writes.write_pending()

    def _caught_up(self, run_id: str, highwaters: dict[int, int | None]) -> bool:
        """Whether everything in the stream's ingest partition up to its high water was processed."""
        partition = self._shard_of.get(run_id)
        return partition is None or self.partitions.caught_up(partition, highwaters)

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        await self.partitions.check_life(ask=True)  # before the recovery reads the changelog
        self._forget = True
        self.bus.ownership_changed()

    async def _on_assigned(self, sender: Any, assigned: Any, **_: Any) -> None:
        """Record the new assignment (see :meth:`PartitionTracker.assign`)."""
        owned = sorted(tp.partition for tp in assigned if tp.topic == self.topic_name)
        log.info("%s owns shards %s", self.name, owned)
        self.partitions.assign(owned)
        await self.partitions.check_life(ask=True, assigning=True)  # a lost broker lost the group
        self.bus.ownership_changed()
        self._assigned = True
        self._last_batch = time.monotonic()

    def _maybe_forget(self) -> None:
        if self._forget:
            self._forget = False
            self.stages.processor.forget_all()
            self._shard_of.clear()

    async def _dead_letter(self, delivery: Fetched, reason: str) -> None:
        dead = DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.app.conf.id,
        )
        await self.bus.send_dead_letter(dead)

    async def run(self) -> WorkerStats:
        """Start the app, run until stop, write what was processed, stop the app."""
        started = time.monotonic()
        check_faust_version()
        (self.data_dir / "faust").mkdir(parents=True, exist_ok=True)
        # faust's start waits for the broker (for ever, the broker gone): a stop ends both
        starting = asyncio.create_task(self.app.start())
        consuming = asyncio.create_task(self._consume(), name="runwire-faust-worker")
        stopping = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({starting, consuming, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():  # started (or raises what failed the start): now until a stop
                starting.result()
                await asyncio.wait({consuming, stopping}, return_when=asyncio.FIRST_COMPLETED)
            self.stop.set()
            await consuming  # writes what was processed; raises what stopped it early
        except Exception:
            raise_if_crashed(self.app, self.name)  # what failed next to a crashed consumer
            raise
        finally:
            stopping.cancel()
            consuming.cancel()
            await self.partitions.stop()
            self.intake.clear()  # not processed: not acked, read again by the next owner
            await self.app.stop()  # a start still waiting for the recovery returns
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(starting, 10.0)
            self.stages.stats.seconds = time.monotonic() - started
            self.stages.stats.broker_holes = self.partitions.lost_by_broker
            self.stages.stats.former_life = self.bus.life.dropped
            if self._first_taken is not None and self._last_written is not None:
                # from the first fetched entries the worker took to the end of the last writes
                self.stages.stats.busy_seconds = self._last_written - self._first_taken
        return self.stages.finish_stats()
