"""A member of a Kafka consumer group on the ingest topic, and its partition bookkeeping.

A record may hold several events (:mod:`runwire.bus.ingest_entries`): ``fetch``
hands out one delivery per event and counts events, and a record counts as
acked once each of its events is acked or dead-lettered.

Offsets are committed explicitly after the caller's ``ack`` (only the
contiguous acked prefix of a partition, at most every
``commit_interval_ms``), and always in the rebalance listener's
``on_partitions_revoked`` before a partition moves and on close. Delivery
counts survive crashes through the group's marks topic (see
:class:`KafkaConsumer`). The consumer is handed what it needs from its bus
(the shared clients, the options, callbacks), never the bus itself.

Longer than ~400 lines: a member and its per-partition bookkeeping (delivery
counts and their marks, the commit point, records of a former broker life
skipped) are read together whenever one of them changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from ...core.errors import BusUnavailable
from .. import keys
from ..base import Consumer, DeadLetter, Delivery, Fetched
from ..ingest_entries import INGEST_ENTRY_EVENTS, OpenEntries
from ..options import BusOptions
from .hold import BACKLOG_FETCH_WAIT_MS, hold_fetches
from .io import KafkaLink, Record, guard, ingest_events, json_encoder, started
from .life import LifeMarker

log = logging.getLogger(__name__)

class _Held(msgspec.Struct):
    """A record handed out and not yet acked: its events' deliveries (the open ones)."""

    deliveries: list[Delivery]
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
        self.open: OpenEntries[int] = OpenEntries()
        """Held records of several events, by offset: their events not yet acked."""
        self.next_offset: int | None = None
        self.committed: int | None = None
        self.prior_through = -1 if mark is None else mark.through
        self.prior_counts = {} if mark is None else dict(mark.counts)
        self.counts: dict[int, int] = {}
        self.start_checked = False
        """Whether the first records fetched were checked against the group's commit."""

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

    def __init__(
        self,
        link: KafkaLink,
        options: BusOptions,
        topic: str,
        group: str,
        name: str,
        *,
        claim_idle_ms: int,
        dead_letter: Callable[[DeadLetter], Awaitable[None]],
        ownership_changed: Callable[[], None],
        closed: Callable[[KafkaConsumer], None],
        life: LifeMarker,
    ) -> None:
        self.link = link
        self.options = options
        self.kafka = link.options
        self.group = group
        self.name = name
        self.claim_idle_ms = claim_idle_ms
        self.topic = topic
        self.marks_topic = keys.kafka_marks_topic(options.prefix, group)
        self._send_dead_letter = dead_letter
        self._ownership_changed = ownership_changed
        self._on_close = closed
        self.life = life
        self._client: AIOKafkaConsumer | None = None
        self._partitions: dict[int, _PartitionState] = {}
        self._former: dict[int, _PartitionState] = {}
        """Partitions revoked from this consumer: taken back as they were if reassigned."""
        self._closed = False
        self._dirty: set[int] = set()
        """Partitions with acks not yet committed."""
        self._last_commit = time.monotonic()
        self._per_record = float(INGEST_ENTRY_EVENTS)
        """Events per record in the last fetch (at first the most a record holds), so that a
        fetch of ``max_count`` events asks for ``max_count / _per_record`` records."""

    def owned_shards(self) -> frozenset[int]:
        if self._client is None:
            return frozenset()
        return frozenset(tp.partition for tp in self._client.assignment())

    async def _start(self) -> AIOKafkaConsumer:
        if self._closed:
            raise RuntimeError("consumer is closed")
        if self._client is None:
            await self.link.ensure_topics([NewTopic(
                self.marks_topic, self.options.shards, 1,
                topic_configs={"retention.ms": str(self.options.ttl * 1000)},
            )])
            session = self.kafka.session_timeout_ms or max(self.options.lease_ms, 6000)
            client = AIOKafkaConsumer(
                bootstrap_servers=self.link.bootstrap,
                group_id=keys.kafka_group(self.options.prefix, self.group),
                client_id=self.name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=session,
                heartbeat_interval_ms=max(session // 4, 100),
                rebalance_timeout_ms=max(session, 10_000),
                request_timeout_ms=max(self.kafka.request_timeout_ms, session + 5000),
                fetch_max_wait_ms=BACKLOG_FETCH_WAIT_MS,
            )
            client.subscribe([self.topic], listener=_Rebalance(self))
            await started("join group", client)
            hold_fetches(client)
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
            self._ownership_changed()
        back = [tp.partition for tp in assigned if tp.partition in self._former]
        for partition in back:
            self._partitions.setdefault(partition, self._former.pop(partition))
        if back:
            await self._commit(back)
        fresh = [tp.partition for tp in assigned if tp.partition not in self._partitions]
        marks = await self.link.last_records(self.marks_topic, fresh) if fresh else {}
        for partition in fresh:
            record = marks.get(partition)
            if partition not in self._partitions:  # fetch may have read it meanwhile
                self._partitions[partition] = _PartitionState(
                    None if record is None else _mark_json.decode(record.value)
                )

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        """Commit what was acked on partitions about to move, then forget them (so a successor starts after it)."""
        if revoked:
            self._ownership_changed()
        await self._commit([tp.partition for tp in revoked])
        for tp in revoked:
            state = self._partitions.pop(tp.partition, None)
            if state is not None:
                self._former[tp.partition] = state

    async def fetch(self, max_count: int = 512, block_ms: int = 1000, *, whole: bool = False) -> Sequence[Fetched]:
        client = await self._start()
        await self._commit_due()
        out, poison = self._redeliver(max_count)
        for delivery in poison:
            await self.dead_letter(delivery, f"delivered {delivery.deliveries} times without an "
                                   f"ack (max_deliveries={self.options.max_deliveries})")
        wait = 0 if out else min(block_ms, max(self._next_redelivery_ms(), 0))
        while len(out) < max_count:
            # records hold several events: ask for about as many as the events still wanted
            asked = max(1, -(-(max_count - len(out)) // round(self._per_record)))
            batches = await guard("fetch", client.getmany(timeout_ms=int(wait), max_records=asked))
            # aiokafka may fetch before our assignment listener has read the marks
            await self._assigned([tp for tp in batches if tp.partition not in self._partitions])
            batches = await self._from_commit(client, batches)
            out += self._take(batches, await self._of_former_life(batches))
            if sum(map(len, batches.values())) < asked:
                break  # nothing more is ready
            wait = 0
        if out:
            await self._write_marks({d.shard for d in out})
        return out

    async def _from_commit(
        self, client: AIOKafkaConsumer, batches: Mapping[TopicPartition, Sequence[Any]]
    ) -> Mapping[TopicPartition, Sequence[Any]]:
        """The fetched records, less those of a partition whose first records fetched begin past
        where the group is to begin it: its committed offset, or offset 0 without one. That
        partition is sought back there, once (a broker that deleted records below its first
        answers out of range, and the client moves to its earliest offset: taken as it is then).

        The client begins a partition without a commit at the broker's answer for its
        *earliest* offset, and Tansu (0.6.0) can answer one past the partition's first records
        when its first writes race (producers writing to it at once): a group reset there
        would never read them.
        """
        late: list[TopicPartition] = []
        for tp, records in batches.items():
            state = self._partitions[tp.partition]
            if state.start_checked or state.next_offset is not None:
                continue
            state.start_checked = True
            if records[0].offset == 0:
                continue
            committed = await guard("committed offsets", client.committed(tp))
            begin = 0 if committed is None else committed
            if records[0].offset > begin:
                log.info("kafka group %s began %s at offset %d, past %s %d: sought back to it",
                         self.group, tp, records[0].offset,
                         "its commit" if committed is not None else "the partition's start", begin)
                client.seek(tp, begin)
                late.append(tp)
        if not late:
            return batches
        return {tp: records for tp, records in batches.items() if tp not in late}

    async def _of_former_life(self, batches: Mapping[TopicPartition, Sequence[Any]]) -> set[tuple[int, int]]:
        """The records fetched that a former life of the broker stamped: skipped, as read."""
        life = self.life
        return {(tp.partition, record.offset) for tp, records in batches.items() for record in records
                if record.headers and not life.is_current(record.headers)
                and await life.of_former_life(record.headers)}

    def _take(
        self, batches: Mapping[TopicPartition, Sequence[Any]], skipped: set[tuple[int, int]]
    ) -> list[Delivery]:
        """One delivery per event of the records fetched (see :mod:`runwire.bus.ingest_entries`),
        none for those ``skipped``."""
        now = time.monotonic() * 1000
        out: list[Delivery] = []
        taken = 0
        for tp, records in batches.items():
            partition = tp.partition
            state = self._partitions[partition]
            handed_out = state.next_offset
            if handed_out is not None and records[0].offset < handed_out:
                # the partition came back to us and the broker replays from the last commit
                records = [r for r in records if r.offset >= handed_out]
                if not records:
                    continue
            for record in records:
                offset = record.offset
                if skipped and (partition, offset) in skipped:
                    continue
                count = state.first_count(offset)
                entry_id = f"{partition}:{offset}"
                events = ingest_events(record.value, record.headers)
                if len(events) == 1:
                    handed = [Delivery(entry_id=entry_id, shard=partition, data=events[0],
                                       deliveries=count)]
                else:
                    handed = [Delivery(entry_id=entry_id, shard=partition, data=data,
                                       deliveries=count, part=part)
                              for part, data in enumerate(events)]
                    state.open.hand_out(offset, len(events))
                state.counts[offset] = count
                state.held[offset] = _Held(handed, now)
                out += handed
            taken += len(records)
            state.next_offset = records[-1].offset + 1
        if taken:
            self._per_record = max(1.0, len(out) / taken)
        return out

    async def _write_marks(self, partitions: set[int]) -> None:
        records: list[Record] = []
        for partition in sorted(partitions):
            state = self._partitions.get(partition)
            if state is not None:
                records.append((partition, None, json_encoder.encode(state.mark()), []))
        # one batch each (a mark is read back as its partition's last record), sent together
        await asyncio.gather(*(self.link.send(self.marks_topic, [r]) for r in records))

    def _next_redelivery_ms(self) -> float:
        now, soonest = time.monotonic() * 1000, float("inf")
        for state in self._partitions.values():
            for held in state.held.values():
                soonest = min(soonest, held.delivered_ms + self.claim_idle_ms - now)
        return soonest

    def _redeliver(self, limit: int) -> tuple[list[Delivery], list[Delivery]]:
        """Own unacked records idle past ``claim_idle_ms``: their open events, handed out again
        (counted).

        Returns the deliveries to hand out and those past ``max_deliveries`` (poison).
        """
        now = time.monotonic() * 1000
        out: list[Delivery] = []
        poison: list[Delivery] = []
        for state in self._partitions.values():
            if not state.held:
                continue
            oldest = min(held.delivered_ms for held in state.held.values())
            if now - oldest < self.claim_idle_ms:
                continue
            for offset in sorted(state.held):
                held = state.held[offset]
                if len(out) >= limit:
                    return out, poison
                if now - held.delivered_ms < self.claim_idle_ms:
                    continue
                count = state.counts[offset] = state.counts.get(offset, 1) + 1
                held.delivered_ms = now
                open_parts = state.open.open_parts(offset)
                held.deliveries = [
                    msgspec.structs.replace(delivery, deliveries=count)
                    for delivery in held.deliveries
                    if open_parts is None or delivery.part in open_parts
                ]
                if count > self.options.max_deliveries:
                    poison += held.deliveries
                    continue
                out += held.deliveries
        return out, poison

    async def ack(self, deliveries: Sequence[Fetched]) -> None:
        """Ack records whose events are all acked or dead-lettered (a worker acks them together)."""
        for delivery in deliveries:
            partition, _, at = delivery.entry_id.partition(":")
            shard, offset = int(partition), int(at)
            state = self._partitions.get(shard) or self._former.get(shard)
            part = delivery.part if type(delivery) is Delivery else 0  # (this bus hands out no Entry)
            if state is None or not state.open.settle(offset, part):
                continue
            if state.held.pop(offset, None) is not None:
                state.counts.pop(offset, None)
                self._dirty.add(shard)
        await self._commit_due()

    async def _commit_due(self) -> None:
        """Commit the acked prefix of dirty partitions if ``commit_interval_ms`` has passed."""
        if self._dirty and (
            time.monotonic() - self._last_commit >= self.kafka.commit_interval_ms / 1000
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

    async def dead_letter(self, delivery: Fetched, reason: str) -> None:
        await self._send_dead_letter(DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.group,
        ))
        log.warning("dead-lettered entry %s of group %s: %s", delivery.entry_id, self.group, reason)
        await self.ack([delivery])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_close(self)
        if self._client is not None:
            with contextlib.suppress(BusUnavailable):
                await self._commit(sorted(self._dirty))
            client, self._client = self._client, None
            await client.stop()
