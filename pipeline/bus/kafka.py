"""``kafka://host:port[,host:port]`` — the bus on Kafka (aiokafka).

Topics (``<prefix>.<kind>``, created at connect; see ``docs/bus.md``):

=====================  ==========  =============  ============================
topic                  partitions  record key     value
=====================  ==========  =============  ============================
``rw.ingest``          shards      root run id    event JSON
``rw.delivery``        shards      run id         events' JSON, one per line;
                                                  headers ``v`` = view, ``q``
                                                  = last seq, ``n`` = count;
                                                  writer state records carry
                                                  header ``k=s``
``rw.control``         shards      run id         ControlCommand JSON
``rw.deadletter``      1           —              DeadLetter JSON
``rw.marks.<group>``   shards      —              a group's delivery marks
=====================  ==========  =============  ============================

A record's partition is ``shard_for(key, shards)``, chosen here rather than
by the client's hash, so a run's shard is the same number on every backend.

* **Ingest** is consumed in Kafka consumer groups (id ``<prefix>.<group>``);
  offsets are committed explicitly after the caller's ``ack`` (only the
  contiguous acked prefix of a partition, at most every
  ``commit_interval_ms``), and always in the rebalance listener's
  ``on_partitions_revoked`` before a partition moves (PITFALLS 4) and on
  close. A restarted or successor consumer starts at the last commit, so
  unacked entries are redelivered. Claim of a dead consumer's entries is the
  group rebalance after its session times out (``session_timeout_ms``,
  default ``lease_ms`` but at least 6 s). Delivery counts survive crashes through the marks
  topic (see :class:`KafkaConsumer`).
* **Delivery** streams are read from :class:`~pipeline.bus.kafka_hot.HotStreams`,
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from ..envelope import Event, decode, encode
from ..errors import BusUnavailable, ConfigError, ProtocolError
from . import keys
from .base import Bus, Consumer, ControlCommand, DeadLetter, Delivery, EncodedAppend, StreamKey
from .kafka_hot import HotStreams
from .options import split_url

log = logging.getLogger(__name__)

ACCEPTED_OPTIONS = (
    "shards", "maxlen", "ttl", "claim_idle_ms", "lease_ms", "max_deliveries", "prefix",
)
PASSTHROUGH = (
    "session_timeout_ms", "hot_events", "request_timeout_ms", "linger_ms", "commit_interval_ms",
)
_VIEW_HEADER = "v"
_KIND_HEADER = "k"
_SEQ_HEADER = "q"
_COUNT_HEADER = "n"
_RECORD_EVENTS = 512
_RECORD_BYTES = 256 * 1024
"""An event record holds at most this many events / bytes of them (the broker's limit is 1 MiB)."""
_STATE_KIND = b"s"
_TOPIC_EXISTS = 36
_control_json = msgspec.json.Decoder(ControlCommand)
_dead_json = msgspec.json.Decoder(DeadLetter)
_json = msgspec.json.Encoder()

_Record = tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]
"""``(partition, key, value, headers)`` of one record to send."""

T = TypeVar("T")


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


_OWN_STATES_MAX = 100_000
"""Own appended states remembered per epoch (then the tail is caught up on again)."""


def _event_records(
    partition: int,
    key: bytes,
    view_header: tuple[str, bytes],
    events: Sequence[Event],
    values: Sequence[bytes],
) -> list[_Record]:
    """One stream's new events as records of consecutive events each.

    A record's value is its events' canonical JSON, one per line (JSON
    text holds no raw newline); headers: the view, ``q`` = the last event's
    seq (a reader that holds it skips the record undecoded), ``n`` = how
    many events. Fewer records cost less to produce and to read back.
    """
    out: list[_Record] = []
    start = 0
    while start < len(values):
        end, size = start, 0
        while end < len(values) and end - start < _RECORD_EVENTS and (
            end == start or size + len(values[end]) <= _RECORD_BYTES
        ):
            size += len(values[end]) + 1
            end += 1
        headers = [view_header, (_SEQ_HEADER, b"%d" % events[end - 1].seq),
                   (_COUNT_HEADER, b"%d" % (end - start))]
        out.append((partition, key, b"\n".join(values[start:end]), headers))
        start = end
    return out


async def _guard(what: str, call: Awaitable[T]) -> T:
    """Await a client call, turning Kafka and connection errors into BusUnavailable."""
    try:
        return await call
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BusUnavailable(f"kafka: {what} failed: {exc!r}") from exc


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
        self._producer: AIOKafkaProducer | None = None
        self._hot: _DeliveryTail | None = None
        self._hot_lock = asyncio.Lock()
        self._consumers: set[KafkaConsumer] = set()
        self._epoch = 0
        """Ownership epoch: 0 until a consumer of this process reports its partitions."""
        self._synced: dict[int, int] = {}
        """Delivery partition → the epoch in which the tail last caught up on it."""
        self._sync_locks: dict[int, asyncio.Lock] = {}
        self._own_states: dict[StreamKey, bytes] = {}
        """States this process appended in the current epoch (newer than the tail may show)."""

    # ---- connection --------------------------------------------------
    async def connect(self) -> None:
        await self._create_topics()
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            enable_idempotence=False,
            acks="all",
            linger_ms=self.kafka.linger_ms,
            max_batch_size=1 << 20,
            request_timeout_ms=self.kafka.request_timeout_ms,
        )
        try:
            await _guard("connect", producer.start())
        except BusUnavailable:
            await producer.stop()
            raise
        self._producer = producer

    async def _create_topics(self) -> None:
        retention = {"retention.ms": str(self.options.ttl * 1000)}
        await self._ensure_topics([
            NewTopic(self.topics[keys.KAFKA_INGEST], self.shards, 1),
            NewTopic(self.topics[keys.KAFKA_DELIVERY], self.shards, 1, topic_configs=retention),
            NewTopic(self.topics[keys.KAFKA_CONTROL], self.shards, 1, topic_configs=retention),
            NewTopic(self.topics[keys.KAFKA_DEAD_LETTER], 1, 1),
        ], check=True)

    async def _ensure_topics(self, wanted: list[NewTopic], *, check: bool = False) -> None:
        """Create topics that don't exist yet (an existing one is left as it is)."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=self.kafka.request_timeout_ms
        )
        await _guard("connect", admin.start())
        try:
            response = await _guard("create topics", admin.create_topics(wanted))
            for topic, code, message in response.topic_errors:
                if code not in (0, _TOPIC_EXISTS):
                    raise BusUnavailable(f"kafka: cannot create topic {topic}: {message} ({code})")
            if check:
                await self._check_partitions(admin)
        finally:
            await admin.close()

    async def _check_partitions(self, admin: AIOKafkaAdminClient) -> None:
        names = [self.topics[k] for k in (keys.KAFKA_INGEST, keys.KAFKA_DELIVERY, keys.KAFKA_CONTROL)]
        for topic in await _guard("describe topics", admin.describe_topics(names)):
            count = len(topic["partitions"])
            if count != self.shards:
                raise ConfigError(
                    f"kafka topic {topic['topic']} has {count} partitions but the bus is "
                    f"configured with shards={self.shards}; use ?shards={count} or another prefix"
                )

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise BusUnavailable("kafka bus is not connected (use `async with open_bus(url)`)")
        return self._producer

    async def close(self) -> None:
        for consumer in list(self._consumers):
            await consumer.close()
        if self._hot is not None:
            await self._hot.stop()
            self._hot = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def ping(self) -> None:
        await _guard("ping", self.producer.client.fetch_all_metadata())

    # ---- producing ---------------------------------------------------
    async def _send(self, topic: str, records: Sequence[_Record]) -> None:
        """Send ``(partition, key, value, headers)`` records, one batch per partition run.

        Records of one partition keep their order (aiokafka has one batch
        in flight per partition). Raises BusUnavailable unless all are stored.
        """
        producer = self.producer
        batches: dict[int, Any] = {}
        sent: list[asyncio.Future[Any]] = []
        for partition, key, value, headers in records:
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                sent.append(await _guard("send", producer.send_batch(batch, topic, partition=partition)))
                batch = batches[partition] = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    raise BusUnavailable(f"kafka: a record of {len(value)} bytes exceeds the batch size")
        for partition, batch in batches.items():
            sent.append(await _guard("send", producer.send_batch(batch, topic, partition=partition)))
        await _guard("send", asyncio.gather(*sent))

    # ---- ingest -------------------------------------------------------
    async def publish(self, events: Sequence[Event]) -> None:
        await self.publish_encoded(events, [encode(event) for event in events])

    async def publish_encoded(self, events: Sequence[Event], data: Sequence[bytes]) -> None:
        """:meth:`publish` with each event's canonical JSON already encoded (the publisher's)."""
        if not events:
            return
        shards = self.shards
        records: list[_Record] = []
        for event, value in zip(events, data, strict=True):
            root = event.root_id or event.run_id
            records.append((keys.shard_for(root, shards), root.encode(), value, []))
        await self._send(self.topics[keys.KAFKA_INGEST], records)

    def consumer(self, group: str, name: str, *, claim_idle_ms: int | None = None) -> Consumer:
        idle = self.claim_idle_ms if claim_idle_ms is None else claim_idle_ms
        consumer = KafkaConsumer(self, group, name, claim_idle_ms=idle)
        self._consumers.add(consumer)
        return consumer

    async def _dead_letter(self, dead: DeadLetter) -> None:
        await self._send(self.topics[keys.KAFKA_DEAD_LETTER], [(0, None, _json.encode(dead), [])])

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        tp = TopicPartition(self.topics[keys.KAFKA_DEAD_LETTER], 0)
        records = await self._read_partition(tp, lambda end, start: max(start, end - limit))
        out = [_dead_json.decode(r.value) for r in records[-limit:]]
        return out[::-1]

    async def _read_partition(
        self, tp: TopicPartition, start_at: Callable[[int, int], int]
    ) -> list[Any]:
        """Records of one partition from ``start_at(end, beginning)`` to its end."""
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await _guard("read", reader.start())
        try:
            end = (await _guard("read", reader.end_offsets([tp])))[tp]
            begin = (await _guard("read", reader.beginning_offsets([tp])))[tp]
            if end <= begin:
                return []
            reader.assign([tp])
            reader.seek(tp, start_at(end, begin))
            out: list[Any] = []
            while await reader.position(tp) < end:
                batch = await _guard("read", reader.getmany(tp, timeout_ms=1000))
                if not batch:
                    break
                out.extend(batch.get(tp, []))
            return out
        finally:
            await reader.stop()

    async def start_offsets(self, group_id: str, partitions: Sequence[int]) -> dict[int, int]:
        """Where consumer group ``group_id`` resumes each ingest partition.

        Its committed offset, or without one the partition's beginning (the
        workers reset to the earliest offset): the next offset the group's
        new owner of the partition is to read.
        """
        tps = [TopicPartition(self.topics[keys.KAFKA_INGEST], p) for p in partitions]
        if not tps:
            return {}
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=self.kafka.request_timeout_ms
        )
        await _guard("connect", admin.start())
        try:
            committed = await _guard(
                "committed offsets", admin.list_consumer_group_offsets(group_id, partitions=tps)
            )
        finally:
            await admin.close()
        out = {
            tp.partition: meta.offset for tp, meta in committed.items()
            if meta is not None and meta.offset >= 0
        }
        missing = [tp for tp in tps if tp.partition not in out]
        if missing:
            reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
            await _guard("read", reader.start())
            try:
                begins = await _guard("read", reader.beginning_offsets(missing))
            finally:
                await reader.stop()
            out.update({tp.partition: offset for tp, offset in begins.items()})
        return out

    async def _last_records(self, topic: str, partitions: Sequence[int]) -> dict[int, Any]:
        """The newest record of each partition (absent when a partition is empty).

        Reads one record per partition, never the partition's history: each
        record read this way must have been sent on its own (one batch).
        """
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await _guard("read", reader.start())
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            ends = await _guard("read", reader.end_offsets(tps))
            begins = await _guard("read", reader.beginning_offsets(tps))
            waiting = {tp for tp in tps if ends[tp] > begins[tp]}
            if not waiting:
                return {}
            reader.assign(list(waiting))
            for tp in waiting:
                reader.seek(tp, ends[tp] - 1)
            out: dict[int, Any] = {}
            deadline = time.monotonic() + 10
            while waiting and time.monotonic() < deadline:
                batches = await _guard("read", reader.getmany(*waiting, timeout_ms=500))
                for tp, records in batches.items():
                    out[tp.partition] = records[-1]
                    if await reader.position(tp) >= ends[tp]:
                        waiting.discard(tp)
            if waiting:
                raise BusUnavailable(f"kafka: could not read the end of {topic}")
            return out
        finally:
            await reader.stop()

    # ---- delivery ----------------------------------------------------
    async def _delivery(self) -> _DeliveryTail:
        if self._hot is None:
            async with self._hot_lock:
                if self._hot is None:
                    hot = _DeliveryTail(self)
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

    async def _caught_up(self, partition: int) -> _DeliveryTail:
        """The delivery tail, once it holds ``partition`` as of this epoch's first write."""
        tail = await self._delivery()
        epoch = self._epoch
        if not epoch:  # no ownership reports: another writer may append at any time
            await tail.sync(partition)
            return tail
        if self._synced.get(partition) == epoch:
            return tail
        lock = self._sync_locks.setdefault(partition, asyncio.Lock())
        async with lock:  # concurrent first writes share one catch-up
            if self._synced.get(partition) != epoch:
                await tail.sync(partition)
                if self._epoch == epoch:
                    self._synced[partition] = epoch
        return tail

    async def append(
        self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None
    ) -> int:
        return (await self.append_many([(key, events, state)]))[0]

    async def append_many(
        self, appends: Sequence[tuple[StreamKey, Sequence[Event], bytes | None]]
    ) -> list[int]:
        """All appends' records in one send: one record batch per delivery partition.

        Each stream's new events and its state are consecutive records of one
        partition, state last, so a stored state never runs ahead of its stream.
        """
        return await self._append_all([(key, events, None, state) for key, events, state in appends])

    async def append_many_encoded(self, appends: Sequence[EncodedAppend]) -> list[int]:
        """:meth:`append_many` sending the given encodings (``encode(event)``) as the record values."""
        return await self._append_all(appends)

    async def _append_all(
        self, appends: Sequence[tuple[StreamKey, Sequence[Event], Sequence[bytes] | None, bytes | None]]
    ) -> list[int]:
        """``(key, events, encoded or None, state)`` appends in one send (see :meth:`append_many`)."""
        partitions = sorted({self._delivery_partition(append[0][0]) for append in appends})
        tails = await asyncio.gather(*(self._caught_up(p) for p in partitions))
        if not tails:
            return []
        tail = tails[0]
        last_of: dict[StreamKey, int] = {}
        records: list[_Record] = []
        planned: list[tuple[StreamKey, list[Event], bytes | None]] = []
        for key, events, encoded, state in appends:
            run_id, view = key
            last = last_of[key] if key in last_of else tail.streams.last_seq(key)
            fresh: list[Event] = []
            values: list[bytes] = []
            for index, event in enumerate(events):
                if event.seq > last:
                    fresh.append(event)
                    values.append(encode(event) if encoded is None else encoded[index])
                    last = event.seq
            last_of[key] = last
            planned.append((key, fresh, state))
            if not fresh and state is None:
                continue
            partition = self._delivery_partition(run_id)
            view_header = (_VIEW_HEADER, view.encode())
            headers = [view_header]
            key_bytes = run_id.encode()
            records.extend(_event_records(partition, key_bytes, view_header, fresh, values))
            if state is not None:
                records.append((partition, key_bytes, state, [*headers, (_KIND_HEADER, _STATE_KIND)]))
        if records:
            try:
                await self._send(self.topics[keys.KAFKA_DELIVERY], records)
            except BaseException:  # some records may be stored: catch up again before the retry
                for partition in partitions:
                    self._synced.pop(partition, None)
                raise
        counts: list[int] = []
        for key, fresh, state in planned:
            if not fresh and state is None:
                counts.append(0)
                continue
            counts.append(tail.streams.add(key, fresh))
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

    async def load_state(self, key: StreamKey) -> bytes | None:
        own = self._own_states.get(key)
        if own is not None:
            return own
        tail = await self._caught_up(self._delivery_partition(key[0]))
        return tail.streams.state(key)

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
        record: _Record = (partition, command.run_id.encode(), _json.encode(command), [])
        await self._send(self.topics[keys.KAFKA_CONTROL], [record])

    async def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """Commands for one run: one partition read by a consumer of this iterator's own.

        ``after``: ``"$"`` from now, ``"0"`` from the start of the retained
        channel, else a partition offset (``"<offset>"`` or ``"<offset>-0"``).
        """
        tp = TopicPartition(self.topics[keys.KAFKA_CONTROL], keys.shard_for(run_id, self.shards))
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await _guard("controls", reader.start())
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
                batch = await _guard("controls", reader.getmany(tp, timeout_ms=1000))
                for record in batch.get(tp, []):
                    if record.key == wanted:
                        yield _control_json.decode(record.value)
        finally:
            await reader.stop()


class _DeliveryTail:
    """One process-wide reader of the delivery topic feeding the hot tier."""

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus
        self.topic = bus.topics[keys.KAFKA_DELIVERY]
        self.streams = HotStreams(
            maxlen=bus.options.maxlen, max_events=bus.kafka.hot_events, ttl_s=bus.options.ttl
        )
        self.positions: dict[int, int] = {}
        self._progress = asyncio.Event()
        self._reader: AIOKafkaConsumer | None = None
        self._offsets: AIOKafkaConsumer | None = None
        """Asks for end offsets: a client that fetches nothing answers at once."""
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = time.monotonic()


    async def start(self) -> None:
        """Read the retained delivery topic up to its current end, then tail it live."""
        offsets = AIOKafkaConsumer(bootstrap_servers=self.bus.bootstrap, enable_auto_commit=False)
        await _guard("delivery tail", offsets.start())
        self._offsets = offsets
        reader = AIOKafkaConsumer(bootstrap_servers=self.bus.bootstrap, enable_auto_commit=False)
        await _guard("delivery tail", reader.start())
        tps = [TopicPartition(self.topic, p) for p in range(self.bus.shards)]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        for tp in tps:
            self.positions[tp.partition] = await reader.position(tp)
        self._reader = reader
        self._task = asyncio.create_task(self._run(reader), name="runwire-kafka-delivery-tail")
        await self.sync(*range(self.bus.shards))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for client in (self._reader, self._offsets):
            if client is not None:
                await client.stop()

    async def sync(self, *partitions: int) -> None:
        """Wait until the hot tier holds everything in ``partitions`` as of now."""
        assert self._offsets is not None
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await _guard("delivery sync", self._offsets.end_offsets(tps))
        # Past the end offset (not at it): some brokers report the last batch's base offset + 1.
        while any(self.positions.get(tp.partition, 0) < ends[tp] for tp in tps):
            if self._task is None or self._task.done():
                raise BusUnavailable("kafka: the delivery tail stopped")
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), 1.0)

    async def _run(self, reader: AIOKafkaConsumer) -> None:
        while True:
            try:
                batches = await reader.getmany(timeout_ms=500, max_records=5000)
            except KafkaError as exc:
                log.warning("kafka delivery tail: %r; retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for tp, records in batches.items():
                self._absorb(records)
                self.positions[tp.partition] = records[-1].offset + 1
            self._progress.set()
            if time.monotonic() - self._last_sweep > 60:
                self._last_sweep = time.monotonic()
                self.streams.sweep()

    def _absorb(self, records: Sequence[Any]) -> None:
        for record in records:
            headers = dict(record.headers)
            view = headers.get(_VIEW_HEADER, b"raw").decode()
            key: StreamKey = (record.key.decode(), "shaped" if view == "shaped" else "raw")
            at = record.timestamp / 1000 if record.timestamp and record.timestamp > 0 else None
            if headers.get(_KIND_HEADER) == _STATE_KIND:
                self.streams.set_state(key, record.value, at)
                continue
            last = headers.get(_SEQ_HEADER)
            if last is not None and int(last) <= self.streams.last_seq(key):
                continue  # held already (this process's own append): no need to decode it
            values = record.value.split(b"\n") if _COUNT_HEADER in headers else [record.value]
            events: list[Event] = []
            for value in values:
                try:
                    events.append(decode(value))
                except ProtocolError as exc:
                    log.warning("kafka delivery tail: skipping a bad event in the record at %s: %s",
                                record.offset, exc)
            self.streams.add(key, events, at)


class _Held(msgspec.Struct):
    delivery: Delivery
    delivered_ms: float


class _Mark(msgspec.Struct, array_like=True):
    """What a partition's owner has handed out: through ``through``, with counts ≥ 2 listed."""

    through: int
    counts: list[tuple[int, int]] = []


_mark_json = msgspec.json.Decoder(_Mark)


class _PartitionState:
    """One assigned partition: unacked entries, delivery counts, the commit point."""

    def __init__(self, mark: _Mark | None = None) -> None:
        self.held: dict[int, _Held] = {}
        self.next_offset: int | None = None
        self.committed: int | None = None
        self.prior_through = -1 if mark is None else mark.through
        self.prior_counts = {} if mark is None else dict(mark.counts)
        self.counts: dict[int, int] = {}

    def first_count(self, offset: int) -> int:
        """Delivery count of an offset handed out now for the first time by this process."""
        if offset in self.prior_counts:
            return self.prior_counts[offset] + 1
        return 2 if offset <= self.prior_through else 1

    def commit_point(self) -> int | None:
        if self.held:
            return min(self.held)
        return self.next_offset

    def mark(self) -> _Mark:
        through = max(self.prior_through, (self.next_offset or 0) - 1)
        counts = sorted((o, c) for o, c in self.counts.items() if c >= 2 and o in self.held)
        return _Mark(through, counts)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner._revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.owner._assigned(assigned)


class KafkaConsumer(Consumer):
    """A member of a Kafka consumer group on the ingest topic (see the module docstring).

    Delivery counts survive a crash: before entries are handed out, the
    consumer writes a *mark* per partition (last offset handed out, and the
    counts of entries handed out more than once) to the group's marks topic
    ``<prefix>.marks.<group>``; a new owner reads the newest mark of each
    partition it is assigned (one record, never a scan) and counts on from
    there. An unacked entry is handed out again after ``claim_idle_ms`` and
    dead-lettered past ``max_deliveries``.
    """

    def __init__(self, bus: KafkaBus, group: str, name: str, *, claim_idle_ms: int) -> None:
        self.bus = bus
        self.group = group
        self.name = name
        self.claim_idle_ms = claim_idle_ms
        self.topic = bus.topics[keys.KAFKA_INGEST]
        self.marks_topic = keys.kafka_marks_topic(bus.options.prefix, group)
        self._client: AIOKafkaConsumer | None = None
        self._partitions: dict[int, _PartitionState] = {}
        self._former: dict[int, _PartitionState] = {}
        """Partitions revoked from this consumer: taken back as they were if reassigned."""
        self._closed = False
        self._dirty: set[int] = set()
        """Partitions with acks not yet committed."""
        self._last_commit = time.monotonic()

    def owned_shards(self) -> frozenset[int]:
        if self._client is None:
            return frozenset()
        return frozenset(tp.partition for tp in self._client.assignment())

    async def _start(self) -> AIOKafkaConsumer:
        if self._closed:
            raise RuntimeError("consumer is closed")
        if self._client is None:
            await self.bus._ensure_topics([NewTopic(
                self.marks_topic, self.bus.shards, 1,
                topic_configs={"retention.ms": str(self.bus.options.ttl * 1000)},
            )])
            session = self.bus.kafka.session_timeout_ms or max(self.bus.options.lease_ms, 6000)
            client = AIOKafkaConsumer(
                bootstrap_servers=self.bus.bootstrap,
                group_id=keys.kafka_group(self.bus.options.prefix, self.group),
                client_id=self.name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=session,
                heartbeat_interval_ms=max(session // 4, 100),
                rebalance_timeout_ms=max(session, 10_000),
                request_timeout_ms=max(self.bus.kafka.request_timeout_ms, session + 5000),
            )
            client.subscribe([self.topic], listener=_Rebalance(self))
            await _guard("join group", client.start())
            self._client = client
        return self._client

    async def _assigned(self, assigned: list[TopicPartition]) -> None:
        """Read the newest mark of each new partition, to count redeliveries on.

        A partition that comes back after a rebalance keeps this consumer's
        state: what it handed out is not handed out again from the broker
        (its unacked entries come back after ``claim_idle_ms`` as usual), and
        acks that arrived in between are committed now.
        """
        if assigned:
            self.bus.ownership_changed()
        back = [tp.partition for tp in assigned if tp.partition in self._former]
        for partition in back:
            self._partitions.setdefault(partition, self._former.pop(partition))
        if back:
            await self._commit(back)
        fresh = [tp.partition for tp in assigned if tp.partition not in self._partitions]
        marks = await self.bus._last_records(self.marks_topic, fresh) if fresh else {}
        for partition in fresh:
            record = marks.get(partition)
            if partition not in self._partitions:  # fetch may have read it meanwhile
                self._partitions[partition] = _PartitionState(
                    None if record is None else _mark_json.decode(record.value)
                )

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        """Commit what was acked on partitions about to move, then forget them (PITFALLS 4)."""
        if revoked:
            self.bus.ownership_changed()
        await self._commit([tp.partition for tp in revoked])
        for tp in revoked:
            state = self._partitions.pop(tp.partition, None)
            if state is not None:
                self._former[tp.partition] = state

    async def fetch(self, max_count: int = 512, block_ms: int = 1000) -> list[Delivery]:
        client = await self._start()
        await self._commit_due()
        out, poison = self._redeliver(max_count)
        for delivery in poison:
            await self.dead_letter(delivery, f"delivered {delivery.deliveries} times without an "
                                   f"ack (max_deliveries={self.bus.max_deliveries})")
        if len(out) < max_count:
            wait = 0 if out else min(block_ms, max(self._next_redelivery_ms(), 0))
            batches = await _guard("fetch", client.getmany(
                timeout_ms=int(wait), max_records=max_count - len(out)))
            # aiokafka may fetch before our assignment listener has read the marks
            await self._assigned([tp for tp in batches if tp.partition not in self._partitions])
            out += self._take(batches)
        if out:
            await self._write_marks({int(d.entry_id.partition(":")[0]) for d in out})
        return out

    def _take(self, batches: Mapping[TopicPartition, Sequence[Any]]) -> list[Delivery]:
        now = time.monotonic() * 1000
        out: list[Delivery] = []
        for tp, records in batches.items():
            state = self._partitions[tp.partition]
            handed_out = state.next_offset
            if handed_out is not None and records[0].offset < handed_out:
                # the partition came back to us and the broker replays from the last commit
                records = [r for r in records if r.offset >= handed_out]
                if not records:
                    continue
            for record in records:
                count = state.first_count(record.offset)
                delivery = Delivery(entry_id=f"{tp.partition}:{record.offset}", shard=tp.partition,
                                    data=record.value, deliveries=count)
                state.counts[record.offset] = count
                state.held[record.offset] = _Held(delivery, now)
                out.append(delivery)
            state.next_offset = records[-1].offset + 1
        return out

    async def _write_marks(self, partitions: set[int]) -> None:
        records: list[_Record] = []
        for partition in sorted(partitions):
            state = self._partitions.get(partition)
            if state is not None:
                records.append((partition, None, _json.encode(state.mark()), []))
        # one batch each (a mark is read back as its partition's last record), sent together
        await asyncio.gather(*(self.bus._send(self.marks_topic, [r]) for r in records))

    def _next_redelivery_ms(self) -> float:
        now, soonest = time.monotonic() * 1000, float("inf")
        for state in self._partitions.values():
            for held in state.held.values():
                soonest = min(soonest, held.delivered_ms + self.claim_idle_ms - now)
        return soonest

    def _redeliver(self, limit: int) -> tuple[list[Delivery], list[Delivery]]:
        """Own unacked entries idle past ``claim_idle_ms``, handed out again (counted).

        Returns the entries to hand out and those past ``max_deliveries`` (poison).
        """
        now = time.monotonic() * 1000
        out: list[Delivery] = []
        poison: list[Delivery] = []
        for state in self._partitions.values():
            for offset in sorted(state.held):
                held = state.held[offset]
                if len(out) >= limit:
                    return out, poison
                if now - held.delivered_ms < self.claim_idle_ms:
                    continue
                count = state.counts[offset] = state.counts.get(offset, 1) + 1
                held.delivered_ms = now
                held.delivery = msgspec.structs.replace(held.delivery, deliveries=count)
                if count > self.bus.max_deliveries:
                    poison.append(held.delivery)
                    continue
                out.append(held.delivery)
        return out, poison

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            partition, _, offset = delivery.entry_id.partition(":")
            state = self._partitions.get(int(partition)) or self._former.get(int(partition))
            if state is not None and state.held.pop(int(offset), None) is not None:
                state.counts.pop(int(offset), None)
                self._dirty.add(int(partition))
        await self._commit_due()

    async def _commit_due(self) -> None:
        """Commit the acked prefix of dirty partitions if ``commit_interval_ms`` has passed."""
        if self._dirty and (
            time.monotonic() - self._last_commit >= self.bus.kafka.commit_interval_ms / 1000
        ):
            await self._commit(sorted(self._dirty))

    async def _commit(self, partitions: Sequence[int]) -> None:
        if self._client is None:
            return
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self._last_commit = time.monotonic()
        self._dirty.difference_update(partitions)
        for partition in partitions:
            state = self._partitions.get(partition)
            point = None if state is None else state.commit_point()
            if state is not None and point is not None and point != state.committed:
                offsets[TopicPartition(self.topic, partition)] = OffsetAndMetadata(point, "")
                state.committed = point
        if offsets:
            try:
                await self._client.commit(offsets)
            except KafkaError as exc:  # lost the partition meanwhile: the successor redelivers
                log.warning("kafka commit for group %s failed: %r", self.group, exc)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        await self.bus._dead_letter(DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.group,
        ))
        log.warning("dead-lettered entry %s of group %s: %s", delivery.entry_id, self.group, reason)
        await self.ack([delivery])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.bus._consumers.discard(self)
        if self._client is not None:
            with contextlib.suppress(BusUnavailable):
                await self._commit(sorted(self._dirty))
            client, self._client = self._client, None
            await client.stop()
