"""The Kafka worker runtime: a faust-streaming app running the same pipeline stages.

* **Source**: the bus's ingest topic (``<prefix>.ingest``, one partition per
  shard, keyed and partitioned by root run id — see :mod:`pipeline.bus.kafka`),
  consumed by one faust agent in consumer group ``--group`` (the app id).
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
* **Offsets**: faust acks an event when the agent has finished its batch and
  commits acked offsets after flushing its producer (table changelog), so a
  committed offset never runs ahead of the checkpoint and the writes.
* **Poison** entries go to the bus's dead-letter topic with the reason.

A stop (SIGTERM/SIGINT) waits for the batch in flight, then stops the app;
entries taken but not processed are not acked and go to the next owner.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
import time
from collections import defaultdict
from typing import Any

import faust
import msgspec
from faust.types import TP

from pipeline.bus import DeadLetter, Delivery, open_bus
from pipeline.bus import keys as bus_keys
from pipeline.bus.kafka import KafkaBus
from pipeline.processor import DEFAULT_SILENCE_S, Processor, StreamOutput, newest_checkpoint
from pipeline.store import ReplayLog, open_store
from workers.runtime import BATCH, TICK_S, Stages, WorkerStats

log = logging.getLogger("runwire.faust")

TAKE = 8 * BATCH
"""Entries per agent batch: each batch is one replay-log transaction and one produce
per delivery partition, whose costs barely grow with the batch."""
TAKE_WITHIN_S = 0.25
"""How long the agent waits to fill a batch (per-batch writes cost round trips to Kafka)."""
BURST_IDLE_S = 2.0
"""``--burst``: stop after this long with nothing new once partitions are assigned."""
HOLE_IDLE_S = 2.0
"""A partition with unprocessed entries below its high water but nothing processed for
this long is sought back to its first unprocessed entry (see ``_rewind_lost_tails``)."""
_dead_json = msgspec.json.Encoder()
_current_partition: contextvars.ContextVar[int] = contextvars.ContextVar("partition", default=0)
"""The ingest partition whose batch is being handled (each runs in its own task)."""


class StreamTable(faust.Table):  # type: ignore[misc]
    """A table whose key names its partition (``"<partition>:<run_id>"``)."""

    def partition_for_key(self, key: Any) -> int | None:
        return int(str(key).split(":", 1)[0])


class FaustWorker:
    """Builds and runs the faust app around :class:`~workers.runtime.Stages`."""

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
    ) -> None:
        self.bus = bus
        self.stop = stop if stop is not None else asyncio.Event()
        self.burst = burst
        self.name = name
        self.stages = Stages(
            bus, store, Processor(silence_s=silence_s), self.stop,
            dead_letter=self._dead_letter, load_state=self._load_state,
        )
        self.app = self._build_app(group)
        self.table = self._build_table()
        self._lock = asyncio.Lock()
        self._shard_of: dict[str, int] = {}
        self._offsets: dict[int, int] = {}
        """Highest offset processed per ingest partition."""
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
        self._define()

    def _build_app(self, group: str) -> faust.App:
        session_s = (self.bus.kafka.session_timeout_ms or self.bus.options.lease_ms) / 1000
        return faust.App(
            group,
            broker=f"kafka://{self.bus.bootstrap}",
            store="memory://",
            web_enabled=False,
            topic_partitions=self.bus.shards,
            topic_replication_factor=1,
            consumer_auto_offset_reset="earliest",
            broker_commit_every=TAKE,
            broker_commit_interval=0.5,
            producer_acks=-1,
            stream_buffer_maxsize=2 * TAKE,
            table_cleanup_interval=3600.0,
            # a dead worker's partitions move after its session times out (the claim idle time)
            broker_session_timeout=session_s,
            broker_heartbeat_interval=max(0.3, session_s / 5),
            broker_rebalance_timeout=max(session_s, 10.0),
            loghandlers=[],
        )

    def _build_table(self) -> StreamTable:
        table = StreamTable(
            self.app,
            name="streams",
            default=None,
            partitions=self.bus.shards,
            # JSON text both ways: faust's changelog recovery decodes values as text,
            # so the msgpack checkpoint is stored base64-encoded.
            schema=faust.Schema(
                key_type=str, value_type=str, key_serializer="json", value_serializer="json"
            ),
        )
        added: StreamTable = self.app.tables.add(table)
        return added

    def _define(self) -> None:
        topic = self.app.topic(
            self.bus.topics[bus_keys.KAFKA_INGEST],
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=self.bus.shards,
        )
        self.app.agent(topic, name="runwire-pipeline", concurrency=1)(self._agent)
        self.app.timer(TICK_S)(self._tick)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        self.app.on_partitions_assigned.connect(self._on_assigned)

    # ---- faust callbacks ------------------------------------------------
    async def _agent(self, stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(TAKE, within=TAKE_WITHIN_S):
            self._last_batch = time.monotonic()
            # Hold each message: take_events acks the batch when the next one is asked
            # for, and also when the agent is cancelled mid-batch (on stop). Our hold is
            # released only after the writes, so a batch cut short is never committed.
            for event in events:
                event.message.incref()
            async with self._lock:
                self._maybe_forget()
                taken = await self._handle(events)
            self._last_batch = time.monotonic()
            for event in taken:
                event.message.decref()

    async def _handle(self, events: list[Any]) -> list[Any]:
        """Process a batch; returns the events processed (stale ones are left unacked)."""
        by_partition: dict[int, list[Delivery]] = defaultdict(list)
        taken: list[Any] = []
        for event in events:
            message = event.message
            if self._is_stale(message.partition, message.offset):
                await self._rewind_over_hole(message.partition)
                continue
            taken.append(event)
            self._offsets[message.partition] = max(
                self._offsets.get(message.partition, -1), message.offset
            )
            self._progress[message.partition] = time.monotonic()
            by_partition[message.partition].append(Delivery(
                entry_id=f"{message.partition}:{message.offset}",
                shard=message.partition,
                data=event.value,
            ))
        # Partitions hold disjoint run trees, so their batches are processed concurrently
        # and written together: one replay-log transaction and one produce per delivery
        # partition for the whole batch.
        prepared = await asyncio.gather(*(
            self._prepare_partition(partition, deliveries)
            for partition, deliveries in by_partition.items()
        ))
        merged: dict[str, StreamOutput] = {}
        for outputs in prepared:
            for run_id, output in outputs.items():
                earlier = merged.setdefault(run_id, output)
                if earlier is not output:  # a run fed from two partitions (bad input): keep order
                    earlier.raw.extend(output.raw)
                    earlier.shaped.extend(output.shaped)
                    earlier.state = output.state
        await self.stages.write(merged)
        self.stages.busy_until_now()
        for (partition, deliveries), outputs in zip(by_partition.items(), prepared, strict=True):
            self._record(outputs, partition)
            self.stages.stats.acked += len(deliveries)
        return taken

    def _is_stale(self, partition: int, offset: int) -> bool:
        """An entry taken before a rebalance, now ahead of what the stream resumes from.

        After a rebalance faust seeks every partition back to its committed
        offset and drops what it had queued, but entries already in the take
        buffer still come out first; processing them before the re-read
        entries before them would reorder the partition (and the sequencer
        would take the earlier entries for duplicates). Until the re-read
        reaches us, entries past our last processed offset are skipped and
        left unacked; the re-read delivers them again, in order. Buffered
        entries of a partition that moved to another worker are skipped too:
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
        :data:`HOLE_IDLE_S` is sought back the same way (a busy agent only
        causes a re-read, which the sequencer drops as duplicates).
        """
        now = time.monotonic()
        topic = self.bus.topics[bus_keys.KAFKA_INGEST]
        for partition, last in list(self._offsets.items()):
            if now - self._progress.get(partition, now) < HOLE_IDLE_S:
                continue
            highwater = self.app.consumer.highwater(TP(topic, partition))
            if highwater is not None and highwater > last + 1:
                await self._rewind_over_hole(partition)

    async def _rewind_over_hole(self, partition: int) -> None:
        """Seek a partition back to its first unprocessed entry when the fetcher skipped some.

        Faust (0.15) resumes the stream partitions of a new assignment and
        fetches from them while its own seek to the committed offsets is
        still in flight; entries fetched in that window can fail to reach
        the agent while the fetch position moves on past them. The ingest topic is
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
        await self.app.consumer.seek(TP(self.bus.topics[bus_keys.KAFKA_INGEST], partition), offset)

    async def _prepare_partition(
        self, partition: int, deliveries: list[Delivery]
    ) -> dict[str, StreamOutput]:
        log.debug("%s: partition %d entries %s..%s", self.name, partition,
                  deliveries[0].entry_id, deliveries[-1].entry_id)
        _current_partition.set(partition)
        _, outputs = await self.stages.prepare(deliveries)
        return outputs

    def _record(self, outputs: dict[str, StreamOutput], partition: int | None = None) -> None:
        for run_id, output in outputs.items():
            shard = partition if partition is not None else self._shard_of.get(run_id)
            if shard is None:
                continue
            self._shard_of[run_id] = shard
            self.table[f"{shard}:{run_id}"] = base64.b64encode(output.state).decode()

    async def _tick(self) -> None:
        idle = not self._lock.locked() and time.monotonic() - self._last_batch > BURST_IDLE_S
        if self.burst and self._assigned and idle:
            self.stop.set()
        async with self._lock:
            self._maybe_forget()
            await self._rewind_lost_tails()
            self._record(await self.stages.tick(self._caught_up))

    def _caught_up(self, run_id: str) -> bool:
        """Whether everything in the stream's ingest partition up to its high water was processed."""
        partition = self._shard_of.get(run_id)
        if partition is None:
            return True
        tp = TP(self.bus.topics[bus_keys.KAFKA_INGEST], partition)
        highwater = self.app.consumer.highwater(tp)
        return highwater is None or self._offsets.get(partition, -1) + 1 >= highwater

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        self._forget = True
        self.bus.ownership_changed()

    async def _on_assigned(self, sender: Any, assigned: Any, **_: Any) -> None:
        topic = self.bus.topics[bus_keys.KAFKA_INGEST]
        owned = sorted(tp.partition for tp in assigned if tp.topic == topic)
        log.info("%s owns shards %s", self.name, owned)
        retained = self._owned & set(owned)
        for partition in set(self._offsets) - retained:  # another owner may have moved on
            del self._offsets[partition]
        self._resync = retained & set(self._offsets)
        self._owned = set(owned)
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
        """Start the app, run until stop, drain the batch in flight, stop the app."""
        started = time.monotonic()
        await self.app.start()
        try:
            await self.stop.wait()
            async with self._lock:  # the batch in flight is written before we leave
                pass
        finally:
            await self.app.stop()
            self.stages.stats.seconds = time.monotonic() - started
        return self.stages.finish_stats()


def run_faust_worker(
    bus_url: str,
    store_url: str,
    *,
    group: str,
    name: str,
    burst: bool = False,
    silence_s: float = DEFAULT_SILENCE_S,
) -> WorkerStats:
    """``runwire worker --bus kafka://…``: run the faust app until SIGTERM/SIGINT (or idle with burst)."""
    return asyncio.run(_main(bus_url, store_url, group, name, burst, silence_s))


async def _main(
    bus_url: str, store_url: str, group: str, name: str, burst: bool, silence_s: float
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
            bus, store, group=group, name=name, silence_s=silence_s, burst=burst, stop=stop
        )
        return await worker.run()
