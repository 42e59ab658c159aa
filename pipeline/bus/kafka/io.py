"""What the Kafka bus, its delivery tail and its consumers share: the record
format, the URL options, and :class:`KafkaLink` — the producer and the
short-lived admin/reader clients, with Kafka's errors turned into
:class:`~runwire.core.errors.BusUnavailable`.

The layout of the topics and their records is described in
:mod:`runwire.bus.kafka.bus`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from ...core.envelope import Event
from ...core.errors import BusUnavailable
from ...core.lines import Lines
from ..ingest_entries import chunks, cuts, join, split

VIEW_HEADER = "v"
KIND_HEADER = "k"
SEQ_HEADER = "q"
COUNT_HEADER = "n"
LIFE_HEADER = "l"  # an ingest record's broker life: the life marker's token when it was produced
RECORD_EVENTS = 512
RECORD_BYTES = 256 * 1024
"""An event record holds at most this many events / bytes of them (the broker's limit is 1 MiB)."""
STATE_KIND = b"s"
TOPIC_EXISTS = 36
json_encoder = msgspec.json.Encoder()

Record = tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]
"""``(partition, key, value, headers)`` of one record to send."""
Sent = tuple[int, int, list[Record]]
"""A batch of records as the broker stored it: partition, offset of its first record, records."""

T = TypeVar("T")
C = TypeVar("C", AIOKafkaConsumer, AIOKafkaAdminClient)


class KafkaOptions(msgspec.Struct, kw_only=True):
    """Kafka-only URL options (``kafka://h:p?session_timeout_ms=3000``)."""

    session_timeout_ms: int | None = None
    """Group session timeout (how soon a dead member's partitions move).

    Default: ``lease_ms``, but at least 6 s — Kafka's own lower bound
    (``group.min.session.timeout.ms``), and a margin against heartbeats
    delayed by a busy event loop, which would cost a needless rebalance.
    """
    hot_events: int = 500_000
    """Events the hot tier holds over all delivery streams."""
    request_timeout_ms: int = 10_000
    linger_ms: int = 1
    commit_interval_ms: int = 100
    """Acks are committed at most this often (and always on revoke and on close)."""


def event_records(
    partition: int,
    key: bytes,
    view_header: tuple[str, bytes],
    events: Sequence[Event],
    values: Sequence[bytes],
) -> list[Record]:
    """One stream's new events as records of consecutive events each.

    A record's value is its events' canonical JSON, one per line (JSON
    text holds no raw newline); headers: the view, ``q`` = the last event's
    seq (a reader that holds it skips the record undecoded), ``n`` = how
    many events. Fewer records cost less to produce and to read back.
    """
    if type(values) is Lines and len(values) <= RECORD_EVENTS and len(values.joined) <= RECORD_BYTES:
        # a worker's stream of a write, encoded at once: one record, its lines as they are
        return [(partition, key, values.joined, [view_header, (SEQ_HEADER, b"%d" % events[-1].seq),
                                                 (COUNT_HEADER, b"%d" % len(values))])]
    out: list[Record] = []
    for start, end in cuts(values, RECORD_EVENTS, RECORD_BYTES):
        headers = [view_header, (SEQ_HEADER, b"%d" % events[end - 1].seq),
                   (COUNT_HEADER, b"%d" % (end - start))]
        out.append((partition, key, join(values[start:end]), headers))
    return out


def ingest_records(partition: int, key: bytes, values: Sequence[bytes]) -> list[Record]:
    """One root run's events of a publish as ingest records (:mod:`runwire.bus.ingest_entries`):
    several in a record, one per line with header ``n`` = how many, or one alone as before."""
    out: list[Record] = []
    for chunk in chunks(values):
        if len(chunk) == 1:
            out.append((partition, key, chunk[0], []))
        else:
            out.append((partition, key, join(chunk), [(COUNT_HEADER, b"%d" % len(chunk))]))
    return out


def stamped(records: Sequence[Record], token: bytes) -> list[Record]:
    """The records with header :data:`LIFE_HEADER` = ``token`` (in place of one they carry)."""
    life = (LIFE_HEADER, token)
    return [(p, key, value, [*(h for h in headers if h[0] != LIFE_HEADER), life]) for p, key, value, headers in records]


def ingest_events(value: bytes, headers: Sequence[tuple[str, bytes]]) -> list[bytes]:
    """The events of an ingest record: one per line with header ``n``, else the value."""
    for name, _ in headers:
        if name == COUNT_HEADER:
            return split(value or b"")
    return [value]


def ingest_event_count(value: bytes, headers: Sequence[tuple[str, bytes]]) -> int:
    """How many events :func:`ingest_events` finds in a record, without splitting it (the
    lines are counted: a header ``n`` that is wrong or no number cannot mislead a reader)."""
    for name, _ in headers:
        if name == COUNT_HEADER:
            return (value or b"").count(b"\n") + 1
    return 1


async def guard(what: str, call: Awaitable[T]) -> T:
    """Await a client call, turning Kafka and connection errors into BusUnavailable."""
    try:
        return await call
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BusUnavailable(f"kafka: {what} failed: {exc!r}") from exc


async def started(what: str, client: C) -> C:
    """``client`` started; closed again if that fails or is cancelled (no connection left open)."""
    try:
        await guard(what, client.start())
    except BaseException:
        with contextlib.suppress(Exception):
            await (client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop())
        raise
    return client


class KafkaLink:
    """The bus's producer, and the admin and reader clients it opens for one call each."""

    def __init__(self, bootstrap: str, options: KafkaOptions) -> None:
        self.bootstrap = bootstrap
        self.options = options
        self._producer: AIOKafkaProducer | None = None
        self.lost: Callable[[], Awaitable[bool]] | None = None
        """Whether the broker lost its state (:meth:`~runwire.bus.kafka.life.LifeMarker.lost`),
        asked after the producer lost a connection; None: never asked."""
        self._on_closed: Callable[[Any, Any], None] = lambda conn, reason: None
        self.breaks = 0
        """Connections of the producer closed so far."""
        self._checked = 0
        self.losses = 0
        """Losses of the broker's state found so far."""
        self.token: bytes | None = None
        """The broker's life marker as last read (:class:`~runwire.bus.kafka.life.LifeMarker`)."""
        self._check_lock = asyncio.Lock()

    def _closed(self, conn: Any, reason: Any) -> None:
        self.breaks += 1
        self._on_closed(conn, reason)

    async def check(self) -> None:
        """Ask :attr:`lost` once per batch of connection losses (concurrent senders wait); a
        no-op while no connection closed since the last answer."""
        if self.lost is None or self._checked == self.breaks:
            return
        async with self._check_lock:
            breaks = self.breaks
            if self._checked == breaks:
                return
            if await self._ask_life():
                self.losses += 1
            self._checked = breaks

    async def _ask_life(self) -> bool:
        """:attr:`lost`, within a deadline (its metadata, reads and topic creations each have
        one, but a client's wait for a broker gone midway may not): BusUnavailable past it."""
        assert self.lost is not None
        deadline = 3 * self.options.request_timeout_ms / 1000
        return await guard("life marker check", asyncio.wait_for(self.lost(), deadline))

    async def check_life(self) -> int:
        """Ask :attr:`lost` now, whatever the connections did; the losses found so far.

        Raises BusUnavailable when the broker can't be asked.
        """
        if self.lost is not None:
            async with self._check_lock:
                breaks = self.breaks
                if await self._ask_life():
                    self.losses += 1
                self._checked = breaks
        return self.losses

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            enable_idempotence=False,
            acks="all",
            linger_ms=self.options.linger_ms,
            max_batch_size=1 << 20,
            request_timeout_ms=self.options.request_timeout_ms,
        )
        client = producer.client  # count closed connections (its own callback still runs)
        self._on_closed = client._on_connection_closed
        client._on_connection_closed = self._closed
        try:
            await guard("connect", producer.start())
        except BaseException:  # failed, or cancelled midway: its connections closed with it
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise BusUnavailable("kafka bus is not connected (use `async with open_bus(url)`)")
        return self._producer

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=self.options.request_timeout_ms
        )

    def reader(self, **options: Any) -> AIOKafkaConsumer:
        """A consumer outside any group, for reading partitions it is assigned (a position
        below a partition's first retained record moves to that record)."""
        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **options)

    async def ensure_topics(
        self,
        wanted: list[NewTopic],
        check: Callable[[AIOKafkaAdminClient], Awaitable[None]] | None = None,
    ) -> None:
        """Create topics that don't exist yet (an existing one is left as it is)."""
        admin = self.admin()
        await started("connect", admin)
        try:
            response = await guard("create topics", admin.create_topics(wanted))
            for topic, code, message in response.topic_errors:
                if code not in (0, TOPIC_EXISTS):
                    raise BusUnavailable(f"kafka: cannot create topic {topic}: {message} ({code})")
            if check is not None:
                await check(admin)
        finally:
            await admin.close()

    async def send(
        self,
        topic: str,
        records: Sequence[Record],
        before: Callable[[], Awaitable[None]] | None = None,
        *,
        stamp: bool = False,
    ) -> list[Sent]:
        """:meth:`produce`, but never taking an acknowledgement from a broker that lost its state.

        After a closed connection the broker's life marker is checked before producing
        (when it was lost, the topics are there again when the check returns), and after a
        send that a closed connection overlapped: records acknowledged across a loss of the
        broker's state are sent again. ``before`` runs after each check, before the records
        go (a publisher sends there again what it keeps of a former life, ahead of newer ones);
        ``stamp``: each attempt stamped with the life it is made in (:meth:`produce`).
        """
        while True:
            await self.check()
            if before is not None:
                await before()
            breaks, losses = self.breaks, self.losses
            sent = await self.produce(topic, records, stamp=stamp)
            if self.breaks == breaks:
                return sent
            await self.check()
            if self.losses == losses:
                return sent

    async def produce(self, topic: str, records: Sequence[Record], *, stamp: bool = False) -> list[Sent]:
        """Send ``(partition, key, value, headers)`` records, one batch per partition run;
        each batch as stored: its partition, the offset of its first record, its records.

        Records of one partition keep their order (aiokafka has one batch
        in flight per partition). Raises BusUnavailable unless all are stored.
        With ``stamp``, each record carries the life marker's token (:data:`LIFE_HEADER`;
        why: :mod:`runwire.bus.kafka.life`, Stamps).
        """
        if stamp and self.token is not None:
            records = stamped(records, self.token)
        producer = self.producer
        known = producer.client.cluster.partitions_for_topic(topic)
        if known is not None and any(record[0] not in known for record in records):
            # a topic created again since (a broker that lost its state, which another client
            # made create it with its default partition count): the producer's metadata is old
            await guard("metadata", producer.client.force_metadata_update())
            known = producer.client.cluster.partitions_for_topic(topic) or known
            if any(record[0] not in known for record in records):
                raise BusUnavailable(f"kafka: topic {topic} has {len(known)} partitions")
        batches: dict[int, tuple[Any, list[Record]]] = {}
        sent: list[asyncio.Future[Any]] = []
        parts: list[tuple[int, list[Record]]] = []
        for record in records:
            partition, key, value, headers = record
            found = batches.get(partition)
            if found is None:
                found = batches[partition] = (producer.create_batch(), [])
            if found[0].append(key=key, value=value, timestamp=None, headers=headers) is None:
                sent.append(await guard("send", producer.send_batch(found[0], topic, partition=partition)))
                parts.append((partition, found[1]))
                found = batches[partition] = (producer.create_batch(), [])
                if found[0].append(key=key, value=value, timestamp=None, headers=headers) is None:
                    raise BusUnavailable(f"kafka: a record of {len(value)} bytes exceeds the batch size")
            found[1].append(record)
        for partition, (batch, held) in batches.items():
            sent.append(await guard("send", producer.send_batch(batch, topic, partition=partition)))
            parts.append((partition, held))
        stored = await guard("send", asyncio.gather(*sent))
        return [(partition, meta.offset, held) for (partition, held), meta in zip(parts, stored, strict=True)]

    async def read_partition(
        self, tp: TopicPartition, start_at: Callable[[int, int], int]
    ) -> list[Any]:
        """Records of one partition from ``start_at(end, beginning)`` to its end."""
        reader = self.reader()
        await started("read", reader)
        try:
            end = (await guard("read", reader.end_offsets([tp])))[tp]
            begin = (await guard("read", reader.beginning_offsets([tp])))[tp]
            if end <= begin:
                return []
            reader.assign([tp])
            reader.seek(tp, start_at(end, begin))
            out: list[Any] = []
            while await reader.position(tp) < end:
                batch = await guard("read", reader.getmany(tp, timeout_ms=1000))
                if not batch:
                    break
                out.extend(batch.get(tp, []))
            return out
        finally:
            await reader.stop()

    async def first_offset(
        self, topic: str, partition: int, offset: int, timeout_s: float = 10.0
    ) -> int:
        """The offset of the partition's first record at or after ``offset``, as the broker answers
        a fetch from there; past its end offset when it holds none before its end, else ``offset``
        (nothing after it yet).

        Offsets below the partition's beginning (deleted, or past retention) hold no record:
        the broker answers a fetch there out of range, and the reader moves to the first it
        holds. (Its answer for the partition's *earliest* offset is not asked: Tansu can name
        one past the first records, see :meth:`~runwire.bus.kafka.consumer.KafkaConsumer._from_commit`.)
        Raises BusUnavailable when the partition cannot be read within ``timeout_s``.
        """
        tp = TopicPartition(topic, partition)
        reader = self.reader()
        await started("read", reader)
        try:
            end = int((await guard("read", reader.end_offsets([tp])))[tp])
            start = offset
            reader.assign([tp])
            reader.seek(tp, start)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                batch = await guard("read", reader.getmany(tp, timeout_ms=500, max_records=1))
                if records := batch.get(tp):
                    return int(records[0].offset)
                position = int(await reader.position(tp))
                if position >= end:  # nothing up to the end (an end behind ``start``: nothing yet)
                    return max(position, start)
            raise BusUnavailable(f"kafka: could not read {topic}[{partition}] from offset {start}")
        finally:
            await reader.stop()

    async def last_records(self, topic: str, partitions: Sequence[int]) -> dict[int, Any]:
        """The newest record of each partition (absent when a partition is empty).

        Reads one record per partition, never the partition's history: each
        record read this way must have been sent on its own (one batch).
        """
        reader = self.reader()
        await started("read", reader)
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            ends = await guard("read", reader.end_offsets(tps))
            begins = await guard("read", reader.beginning_offsets(tps))
            waiting = {tp for tp in tps if ends[tp] > begins[tp]}
            if not waiting:
                return {}
            reader.assign(list(waiting))
            for tp in waiting:
                reader.seek(tp, ends[tp] - 1)
            out: dict[int, Any] = {}
            deadline = time.monotonic() + 10
            while waiting and time.monotonic() < deadline:
                batches = await guard("read", reader.getmany(*waiting, timeout_ms=500))
                for tp, records in batches.items():
                    out[tp.partition] = records[-1]
                    if await reader.position(tp) >= ends[tp]:
                        waiting.discard(tp)
            if waiting:
                raise BusUnavailable(f"kafka: could not read the end of {topic}")
            return out
        finally:
            await reader.stop()
