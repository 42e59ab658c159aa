"""``kafka://host:port[,host:port]`` — the bus on Kafka (aiokafka).

The consumer is :mod:`runwire.bus.kafka.consumer`, the delivery tail
:mod:`runwire.bus.kafka.tail`, the shared clients and record format
:mod:`runwire.bus.kafka.io`.

Topics (``<prefix>.<kind>``, created at connect; see ``docs/bus.md``):

=====================  ==========  =============  ============================
topic                  partitions  record key     value
=====================  ==========  =============  ============================
``rw.ingest``          shards      root run id    event JSON, or events of
                                                  one root run, one per line
                                                  with header ``n`` = count
``rw.delivery``        shards      run id         events' JSON, one per line;
                                                  headers ``v`` = view, ``q``
                                                  = last seq, ``n`` = count;
                                                  writer state records carry
                                                  header ``k=s``
``rw.control``         shards      run id         ControlCommand JSON
``rw.deadletter``      1           —              DeadLetter JSON
``rw.marks.<group>``   shards      —              a group's delivery marks
``rw.life``            1           —              the broker's life marker
                                                  (:mod:`runwire.bus.kafka.life`)
=====================  ==========  =============  ============================

A record's partition is ``shard_for(key, shards)``, chosen here rather than
by the client's hash, so a run's shard is the same number on every backend.

* **Ingest** records hold one event, or up to 64 events of one root run
  published together (:mod:`runwire.bus.ingest_entries`, the encoding of
  Redis's multi-event ingest entries); a consumer hands out one delivery per
  event and acks a record once each of its events is acked or dead-lettered.
  It is consumed in Kafka consumer groups (id ``<prefix>.<group>``);
  offsets are committed explicitly after the caller's ``ack`` (only the
  contiguous acked prefix of a partition, at most every
  ``commit_interval_ms``), and always in the rebalance listener's
  ``on_partitions_revoked`` before a partition moves and on
  close. A restarted or successor consumer starts at the last commit, so
  unacked entries are redelivered. Claim of a dead consumer's entries is the
  group rebalance after its session times out (``session_timeout_ms``,
  default ``lease_ms`` but at least 6 s). Delivery counts survive crashes through the marks
  topic (see :class:`KafkaConsumer`).
* **Delivery** streams are read from :class:`~runwire.bus.kafka.hot.HotStreams`,
  fed by one tail of the delivery topic per process; older history is the
  replay log's. An append writes the new events and the writer state as one
  record batch to one partition, which Kafka stores atomically; the state
  record comes last, so a state is never ahead of its events. A stream's
  new events go as few records (consecutive events, one per line), each
  naming its last seq in header ``q``, so the tail skips records it already
  holds (a writer's own appends, written through) without decoding them.
  Records of one event without header ``n`` (the earlier format) are read too.
* The brokers used in tests (Tansu) have no idempotent or transactional
  producer, so nothing relies on them: duplicates from producer retries are
  dropped by seq wherever records are read.

Longer than ~400 lines because of this description of the topics and their
records; the code is the bus alone (its consumer, tail and clients are the
modules named above).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ...core.envelope import Event, encode
from ...core.errors import BusUnavailable, ConfigError
from .. import keys
from ..base import (
    Append,
    Bus,
    Consumer,
    ControlCommand,
    DeadLetter,
    Routed,
    StreamKey,
    ascending_past,
    encoded,
)
from ..options import split_url
from .consumer import KafkaConsumer
from .hot import HotStreams
from .io import (
    KIND_HEADER,
    STATE_KIND,
    VIEW_HEADER,
    KafkaLink,
    KafkaOptions,
    Record,
    event_records,
    guard,
    ingest_records,
    json_encoder,
    started,
)
from .life import LIFE_KIND, LifeMarker
from .retain import Kept
from .tail import DeliveryTail

ACCEPTED_OPTIONS = (
    "shards", "maxlen", "ttl", "grace", "claim_idle_ms", "lease_ms", "max_deliveries", "prefix",
    "retain_bytes", "close_wait_ms",
)
PASSTHROUGH = (
    "session_timeout_ms", "hot_events", "request_timeout_ms", "linger_ms", "commit_interval_ms",
)
_control_json = msgspec.json.Decoder(ControlCommand)
_dead_json = msgspec.json.Decoder(DeadLetter)

_OWN_STATES_MAX = 100_000
"""Own appended states remembered per epoch (then the tail is caught up on again)."""

__all__ = ["KafkaBus", "KafkaConsumer", "KafkaOptions"]


def _past(
    events: Sequence[Event], encoded: Sequence[bytes] | None, last: int
) -> tuple[list[Event], Sequence[bytes], int]:
    """The events of one append past seq ``last`` (appended already: the rest), their bytes,
    and the new last seq."""
    if encoded is not None and ascending_past(events, last):  # a worker's append: all new, in order
        return list(events), encoded, events[-1].seq
    fresh: list[Event] = []
    values: list[bytes] = []
    for index, event in enumerate(events):
        if event.seq > last:
            fresh.append(event)
            values.append(encode(event) if encoded is None else encoded[index])
            last = event.seq
    return fresh, values, last


class KafkaBus(Bus):
    """The bus on Kafka topics (see the module docstring)."""

    def __init__(self, url: str, **overrides: Any) -> None:
        options, _bare, kept = split_url(url, ACCEPTED_OPTIONS, PASSTHROUGH)
        if overrides:
            options = msgspec.structs.replace(options, **overrides)
        try:
            self.kafka = msgspec.convert(kept, KafkaOptions, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"bad kafka option in {url!r}: {exc}") from None
        self.bootstrap = urlsplit(url).netloc
        if not self.bootstrap:
            raise ConfigError(f"kafka URL {url!r} names no broker (kafka://host:port[,host:port])")
        self.url = url
        self.options = options
        self.shards = options.shards
        self.max_deliveries = options.max_deliveries
        self.claim_idle_ms = options.claim_idle_ms
        prefix = options.prefix
        self.topics = {kind: keys.kafka_topic(prefix, kind) for kind in (
            keys.KAFKA_INGEST, keys.KAFKA_DELIVERY, keys.KAFKA_CONTROL, keys.KAFKA_DEAD_LETTER)}
        self.link = KafkaLink(self.bootstrap, self.kafka)
        self.kept = Kept(self.link, self.topics[keys.KAFKA_INGEST], self.shards, options.retain_bytes)
        self._hot: DeliveryTail | None = None
        self._hot_lock = asyncio.Lock()
        self._consumers: set[KafkaConsumer] = set()
        self._epoch = 0
        """Ownership epoch: 0 until a consumer of this process reports its partitions."""
        self._synced: dict[int, int] = {}
        """Delivery partition → the epoch in which the tail last caught up on it."""
        self._sync_lock = asyncio.Lock()
        self._own_states: dict[StreamKey, bytes] = {}
        self._misshapen: list[str] = []
        """Topics whose partition count is not the bus's (found by the last check)."""
        """States this process appended in the current epoch (newer than the tail may show)."""

    # ---- connection --------------------------------------------------
    async def connect(self) -> None:
        await self._create_topics()
        await self.link.start()
        self.life = LifeMarker(self.link, keys.kafka_topic(self.options.prefix, LIFE_KIND),
                               self._recreate_topics)
        await self.life.start()
        self.link.lost = self.life.lost

    async def _create_topics(self) -> None:
        retention = {"retention.ms": str(self.options.ttl * 1000)}
        await self.link.ensure_topics([
            NewTopic(self.topics[keys.KAFKA_INGEST], self.shards, 1),
            NewTopic(self.topics[keys.KAFKA_DELIVERY], self.shards, 1, topic_configs=retention),
            NewTopic(self.topics[keys.KAFKA_CONTROL], self.shards, 1, topic_configs=retention),
            NewTopic(self.topics[keys.KAFKA_DEAD_LETTER], 1, 1),
        ], check=self._check_partitions)

    async def _recreate_topics(self) -> None:
        """The topics again on a broker that lost its state (see :mod:`runwire.bus.kafka.life`).

        A client's metadata request for a topic the broker no longer has makes some brokers
        (Tansu) create it with their default partition count; such a topic, made since the
        loss, is deleted and created again with the bus's.
        """
        for attempt in range(5):
            try:
                await self._create_topics()
                return
            except ConfigError as exc:
                if attempt == 4:
                    raise BusUnavailable(f"kafka: {exc}") from exc
            admin = self.link.admin()
            await started("connect", admin)
            try:
                await guard("delete topics", admin.delete_topics(self._misshapen))
            finally:
                await admin.close()

    async def _check_partitions(self, admin: AIOKafkaAdminClient) -> None:
        names = [self.topics[k] for k in (keys.KAFKA_INGEST, keys.KAFKA_DELIVERY, keys.KAFKA_CONTROL)]
        self._misshapen = []
        for topic in await guard("describe topics", admin.describe_topics(names)):
            count = len(topic["partitions"])
            if count != self.shards:
                self._misshapen.append(topic["topic"])
                shape, wrong = f"{topic['topic']} has {count} partitions", count
        if self._misshapen:
            raise ConfigError(
                f"kafka topic {shape} but the bus is configured with shards={self.shards}; "
                f"use ?shards={wrong} or another prefix"
            )

    async def close(self) -> None:
        """Wait (``close_wait_ms``) for the groups to commit what this process published, close
        its consumers and clients."""
        if self.kept.bytes:
            await self.kept.drain(self.options.close_wait_ms / 1000)
        await self.kept.close()
        for consumer in list(self._consumers):
            await consumer.close()
        if self._hot is not None:
            await self._hot.stop()
            self._hot = None
        await self.link.stop()

    async def ping(self) -> None:
        await guard("ping", self.link.producer.client.fetch_all_metadata())

    # ---- ingest -------------------------------------------------------
    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None:
        """The events onto their shards' partitions (``data``: their canonical JSON, when the
        caller has it: the publisher's).

        Each root run's events go as few records (:func:`~runwire.bus.kafka.io.ingest_records`),
        keyed by the root run id, in its shard's partition. They are kept until every group
        reading the topic committed past them, and sent again if the broker loses them
        (:mod:`runwire.bus.kafka.retain`).
        """
        if not events:
            return
        by_root: dict[str, list[bytes]] = {}
        for event, value in zip(events, encoded(events, data), strict=True):
            root = event.root_id or event.run_id
            found = by_root.get(root)
            if found is None:
                by_root[root] = [value]
            else:
                found.append(value)
        shards = self.shards
        records: list[Record] = []
        for root, values in by_root.items():
            records += ingest_records(keys.shard_for(root, shards), root.encode(), values)
        self.kept.add(await self.link.send(self.topics[keys.KAFKA_INGEST], records, self.kept.resend_lost,
                                           stamp=self.kept.enabled))

    def consumer(self, group: str, name: str, *, claim_idle_ms: int | None = None) -> Consumer:
        idle = self.claim_idle_ms if claim_idle_ms is None else claim_idle_ms
        consumer = KafkaConsumer(
            self.link, self.options, self.topics[keys.KAFKA_INGEST], group, name,
            claim_idle_ms=idle, dead_letter=self.send_dead_letter, life=self.life,
            ownership_changed=self.ownership_changed, closed=self._consumers.discard,
        )
        self._consumers.add(consumer)
        return consumer

    async def send_dead_letter(self, dead: DeadLetter) -> None:
        """Write a dead letter to the dead-letter topic (a consumer of this bus acks the entry)."""
        await self.link.send(self.topics[keys.KAFKA_DEAD_LETTER], [(0, None, json_encoder.encode(dead), [])])

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        tp = TopicPartition(self.topics[keys.KAFKA_DEAD_LETTER], 0)
        records = await self.link.read_partition(tp, lambda end, start: max(start, end - limit))
        out = [_dead_json.decode(r.value) for r in records[-limit:]]
        return out[::-1]

    async def start_offsets(self, group_id: str, partitions: Sequence[int]) -> dict[int, int]:
        """Where consumer group ``group_id`` resumes each ingest partition.

        Its committed offset, or without one offset 0 (not the broker's answer for the
        earliest offset, see :meth:`~runwire.bus.kafka.consumer.KafkaConsumer._from_commit`): the
        next offset the group's new owner of the partition is to read.
        """
        tps = [TopicPartition(self.topics[keys.KAFKA_INGEST], p) for p in partitions]
        if not tps:
            return {}
        admin = self.link.admin()
        await started("connect", admin)
        try:
            committed = await guard(
                "committed offsets", admin.list_consumer_group_offsets(group_id, partitions=tps)
            )
        finally:
            await admin.close()
        out = {
            tp.partition: meta.offset for tp, meta in committed.items()
            if meta is not None and meta.offset >= 0
        }
        return {tp.partition: out.get(tp.partition, 0) for tp in tps}

    # ---- delivery ----------------------------------------------------
    async def _delivery(self) -> DeliveryTail:
        if self._hot is None:
            async with self._hot_lock:
                if self._hot is None:
                    streams = HotStreams(maxlen=self.options.maxlen,
                                         max_events=self.kafka.hot_events, ttl_s=self.options.ttl,
                                         grace_s=self.options.grace)
                    hot = DeliveryTail(self.link, self.topics[keys.KAFKA_DELIVERY], self.shards,
                                       streams)
                    await hot.start()
                    self._hot = hot
        return self._hot

    def _delivery_partition(self, run_id: str) -> int:
        return keys.shard_for(run_id, self.shards)

    def ownership_changed(self) -> None:
        """A consumer of this process gained or lost ingest partitions (a rebalance).

        From the first call on, a delivery partition is caught up on once per
        ownership epoch rather than before every append: a run is written
        only by the owner of its root's ingest partition, so once this process
        owns it and has read its stream's records, every later record of that
        stream is one of its own appends, which are written through to the
        hot tier. Each call starts a new epoch (every partition is caught up
        on again at its next write).
        """
        self._epoch += 1
        self._own_states.clear()

    async def _caught_up(self, partitions: Collection[int]) -> DeliveryTail:
        """The delivery tail, once it holds each of ``partitions`` as of this epoch's first write.

        The first catch-up of an epoch takes every partition not caught up on yet, not only
        those asked for: one fetch answers for all of them in the time it takes for one (the
        tail reads them all anyway), where partitions first written one after another would
        each wait for a fetch of their own.
        """
        tail = await self._delivery()
        epoch = self._epoch
        if not epoch:  # no ownership reports: another writer may append at any time
            if partitions:
                await tail.sync(*sorted(partitions))
            return tail
        if all(self._synced.get(p) == epoch for p in partitions):
            return tail
        async with self._sync_lock:  # concurrent first writes share one catch-up
            missing = [p for p in range(self.shards) if self._synced.get(p) != epoch]
            if any(p in missing for p in partitions):
                await tail.sync(*missing)
                if self._epoch == epoch:
                    self._synced.update(dict.fromkeys(missing, epoch))
        return tail

    async def append(
        self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None
    ) -> int:
        return (await self.append_many([(key, events, None, state)]))[0]

    async def append_many(self, appends: Sequence[Append]) -> list[int]:
        """All appends' records in one send: one record batch per delivery partition, the given
        encodings (``encode(event)``) as the record values.

        Each stream's new events and its state are consecutive records of one
        partition, state last, so a stored state never runs ahead of its stream.
        """
        if not appends:
            return []
        partitions = {self._delivery_partition(append[0][0]) for append in appends}
        tail = await self._caught_up(partitions)
        last_of: dict[StreamKey, int] = {}
        records: list[Record] = []
        planned: list[tuple[StreamKey, list[Event], bytes | None]] = []
        for key, events, lines, state in appends:
            run_id, view = key
            last = last_of[key] if key in last_of else tail.streams.last_seq(key)
            fresh, values, last = _past(events, lines, last)
            last_of[key] = last
            planned.append((key, fresh, state))
            if not fresh and state is None:
                continue
            partition = self._delivery_partition(run_id)
            view_header = (VIEW_HEADER, view.encode())
            headers = [view_header]
            key_bytes = run_id.encode()
            records.extend(event_records(partition, key_bytes, view_header, fresh, values))
            if state is not None:
                records.append((partition, key_bytes, state, [*headers, (KIND_HEADER, STATE_KIND)]))
        if records:
            try:
                await self.link.send(self.topics[keys.KAFKA_DELIVERY], records)
            except BaseException:  # some records may be stored: catch up again before the retry
                for partition in partitions:
                    self._synced.pop(partition, None)
                raise
        counts: list[int] = []
        for key, fresh, state in planned:
            if not fresh and state is None:
                counts.append(0)
                continue
            counts.append(tail.streams.add(key, fresh, ascending=True))  # (_past's: in order)
            if state is not None:
                tail.streams.set_state(key, state)
                if self._epoch:
                    self._remember_state(key, state)
        return counts

    def _remember_state(self, key: StreamKey, state: bytes) -> None:
        if len(self._own_states) >= _OWN_STATES_MAX and key not in self._own_states:
            # forgetting them means the tail must be read to its end again first
            self._own_states.clear()
            self._synced.clear()
        self._own_states[key] = state

    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]:
        """Each delivery partition the streams are on caught up once (all at once), then
        every stream's state (this process's own last one first)."""
        partitions = {self._delivery_partition(key[0]) for key in keys if key not in self._own_states}
        streams = (await self._caught_up(partitions)).streams
        return [own if (own := self._own_states.get(key)) is not None else streams.state(key)
                for key in keys]

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        return (await self._delivery()).streams.read(key, after, limit)

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        return (await self._delivery()).streams.bounds(key)

    async def tail(
        self, cursors: Mapping[StreamKey, int], block_ms: int = 1000
    ) -> list[tuple[StreamKey, Event]]:
        streams = (await self._delivery()).streams
        deadline = time.monotonic() + block_ms / 1000
        while True:
            found = streams.collect(cursors)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            await streams.changed(remaining)

    # ---- control -----------------------------------------------------
    async def send_control(self, command: ControlCommand) -> None:
        partition = keys.shard_for(command.run_id, self.shards)
        record: Record = (partition, command.run_id.encode(), json_encoder.encode(command), [])
        await self.link.send(self.topics[keys.KAFKA_CONTROL], [record])

    async def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """Commands for one run: one partition read by a consumer of this iterator's own.

        ``after``: ``"$"`` from now, ``"0"`` from the start of the retained
        channel, else a partition offset (``"<offset>"`` or ``"<offset>-0"``).
        """
        tp = TopicPartition(self.topics[keys.KAFKA_CONTROL], keys.shard_for(run_id, self.shards))
        reader = self.link.reader()
        await started("controls", reader)
        wanted = run_id.encode()
        try:
            reader.assign([tp])
            if after == "$":
                await reader.seek_to_end(tp)
            elif after == "0":
                await reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, int(after.split("-", 1)[0]) + 1)
            await reader.position(tp)
            while True:
                batch = await guard("controls", reader.getmany(tp, timeout_ms=1000))
                for record in batch.get(tp, []):
                    if record.key == wanted:
                        yield _control_json.decode(record.value)
        finally:
            await reader.stop()
