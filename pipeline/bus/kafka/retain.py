"""What a publishing process keeps until every consumer group committed past it: a broker that
lost its state is not the end.

A broker acknowledges a produce once it holds the records; one on volatile
storage (Tansu on ``memory://``), or one whose disk was lost, restarted empty
no longer has records it acknowledged — and a worker that had not read them
never will. So a process that publishes (the SDK, an edge, a worker
re-routing an event) keeps each ingest batch it produced, with the offset the
broker gave it, until every consumer group reading the ingest topic has
committed an offset past it: a worker commits only what is in the replay log.

**Detection** is the bus's life marker (:mod:`runwire.bus.kafka.life`): after
any closed producer connection, the marker is read again before the next
produce, and a task does the same every :data:`~runwire.bus.confirming.CONFIRM_INTERVAL_S` while
anything is kept (for a publisher whose runs sent their last event). A loss
found there sends every kept batch of the former life again, ahead of the
records being published (:meth:`KafkaLink.send`'s ``before``), so a run's
events stay in order; workers drop what they already had by its publisher
seq (``docs/workers.md`` § Stages).

**Release.** The same task asks the broker for every consumer group's
committed offsets on the ingest topic: a batch goes once each group that has
committed on the topic committed past its last record on its partition (a
group with no commit on that partition yet holds it). With no group committed
on the topic the process keeps what it published (bounded below) but does not
wait for it when closing. Before letting anything go, the round reads the
life marker again (after the offsets): offsets read from a broker that lost
its state are its new life's, and the producer's connection may not have
closed yet; a round that finds the marker changed, or a producer connection
closed, lets nothing go.

**Bounds.** At most ``retain_bytes`` of records per process (bus URL option,
default 64 MiB; 0 keeps nothing): past it the oldest batches are released
unconfirmed, counted in :attr:`Kept.unprotected` with one warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from ..confirming import Confirming
from .io import KafkaLink, Record, Sent, guard, started

log = logging.getLogger(__name__)
T = TypeVar("T")

OTHERS_EVERY_S = 10.0
"""How often a group found committed on none of the ingest partitions is asked again (a broker
shared by many deployments has many groups)."""


@dataclass(slots=True)
class Batch:
    """Records produced together to one partition, as the broker stored them."""

    number: int
    """Order of sending, across partitions (the oldest go first past the bound)."""
    partition: int
    offset: int
    """The offset of its first record (the rest follow it one by one)."""
    records: list[Record]
    life: int
    """The link's count of losses when the broker acknowledged it."""
    size: int

    @property
    def end(self) -> int:
        """The offset after its last record: a group committed past it at or above this."""
        return self.offset + len(self.records)


def _committed_past(batches: deque[Batch], life: int, low: int) -> int:
    """How many of a partition's oldest batches, of the broker's life ``life``, end at or
    below the offset ``low`` the groups committed."""
    count = 0
    for batch in batches:
        if batch.life != life or batch.end > low:
            break
        count += 1
    return count


class Kept(Confirming):
    """The ingest batches a process produced that some group has not committed past yet."""

    def __init__(self, link: KafkaLink, topic: str, partitions: int, limit_bytes: int) -> None:
        super().__init__()
        self.link = link
        self.topic = topic
        self.partitions = partitions
        self.limit = limit_bytes
        self.batches: dict[int, deque[Batch]] = {}
        self.bytes = 0
        self.unprotected = 0
        """Batches released unconfirmed: over ``retain_bytes``."""
        self.resent = 0
        """Records the broker lost that this process sent again."""
        self.unread: bool | None = None
        """No group has committed on the ingest topic (as last asked: None before the first
        round): closing does not wait."""
        self._numbers = itertools.count()
        self._lock = asyncio.Lock()
        self._admin: AIOKafkaAdminClient | None = None
        self._others: dict[str, float] = {}
        """Groups with no commit on the ingest topic, and when to ask them again (monotonic)."""
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def add(self, sent: Sequence[Sent]) -> None:
        """Keep the batches just acknowledged (of the link's current life)."""
        if not self.enabled:
            return
        life = self.link.losses
        for partition, offset, records in sent:
            size = sum(len(record[2]) + 64 for record in records)
            batch = Batch(next(self._numbers), partition, offset, records, life, size)
            self.batches.setdefault(partition, deque()).append(batch)
            self.bytes += size
        self._bound()
        self._start()

    async def resend_lost(self) -> None:
        """Send again, oldest first, every kept batch of a former life of the broker."""
        life = self.link.losses
        if not any(part and part[0].life != life for part in self.batches.values()):
            return
        async with self._lock:
            life = self.link.losses
            stale = [batch for part in self.batches.values() for batch in part if batch.life != life]
            if not stale:
                return
            stale.sort(key=lambda batch: batch.number)
            records = [record for batch in stale for record in batch.records]
            sent = await self.link.produce(self.topic, records, stamp=True)
            again: dict[int, list[Batch]] = {}
            for partition, offset, held in sent:
                again.setdefault(partition, []).append(Batch(
                    next(self._numbers), partition, offset, held, life,
                    sum(len(record[2]) + 64 for record in held)))
            for partition, part in list(self.batches.items()):
                fresh = [batch for batch in part if batch.life == life]
                self.batches[partition] = deque([*again.pop(partition, []), *fresh])
            for partition, batches in again.items():
                self.batches[partition] = deque(batches)
            self.bytes = sum(batch.size for part in self.batches.values() for batch in part)
            self.resent += len(records)
            log.warning("kafka: the broker lost %d ingest record(s) this process had published and "
                        "no worker had committed: sent them again", len(records))

    async def confirm(self) -> None:
        """One round: notice a lost broker (sending again what it lost), then let go of what
        every group reading the ingest topic committed past."""
        await self.link.check()
        await self.resend_lost()
        if not self.bytes:
            return
        breaks, life = self.link.breaks, self.link.losses
        committed = await self._committed()
        self.unread = committed is None
        if committed is None:
            return
        done = {partition: _committed_past(part, life, committed.get(partition, 0))
                for partition, part in self.batches.items()}
        if not any(done.values()):
            return
        # Offsets of a broker that lost its state are of its new life, and the producer may not
        # have seen a connection close yet: its life marker, read after the offsets, tells.
        if await self.link.check_life() != life or self.link.breaks != breaks:
            return  # sent again at the next round or publish
        for partition, count in done.items():
            part = self.batches[partition]
            for _ in range(count):
                self.bytes -= part.popleft().size

    async def _committed(self) -> dict[int, int] | None:
        """Per ingest partition, the lowest offset committed by the groups that committed on the
        topic (0 where one has not on that partition); None when no group has."""
        admin = await self._admin_client()
        try:
            groups = await guard("list groups", admin.list_consumer_groups())
            wanted = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            low: dict[int, int] | None = None
            now = time.monotonic()
            asked = [group[0] for group in groups if self._others.get(group[0], 0.0) <= now]
            answers = await guard("group offsets", _every_answer(
                admin.list_consumer_group_offsets(group, partitions=wanted) for group in asked))
            for group, offsets in zip(asked, answers, strict=True):
                found = {tp.partition: meta.offset for tp, meta in offsets.items()}
                if all(offset < 0 for offset in found.values()):
                    # not a reader of the ingest topic (or nothing committed yet)
                    self._others[group] = now + OTHERS_EVERY_S
                    continue
                self._others.pop(group, None)
                if low is None:
                    low = {p: max(0, found.get(p, -1)) for p in range(self.partitions)}
                else:
                    for p in range(self.partitions):
                        low[p] = min(low[p], max(0, found.get(p, -1)))
            if len(self._others) > 4 * len(groups):  # groups deleted since
                listed = {group[0] for group in groups}
                self._others = {g: t for g, t in self._others.items() if g in listed}
            return low
        except Exception:
            await self._close_admin()  # a client of a broker gone may not recover: a new one
            raise

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = self.link.admin()
            await started("connect", admin)
            self._admin = admin
        return self._admin

    async def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    def _bound(self) -> None:
        while self.bytes > self.limit:
            oldest = min((part for part in self.batches.values() if part), key=lambda part: part[0].number)
            self.bytes -= oldest.popleft().size
            self.unprotected += 1
            if not self._warned:
                self._warned = True
                log.warning("kafka: more than %d bytes published that the workers have not committed "
                            "yet: the oldest are no longer kept, and only the broker's own storage "
                            "protects them (retain_bytes in the bus URL)", self.limit)

    def awaited(self) -> bool:
        return bool(self.bytes) and self.unread is not True

    async def close(self) -> None:
        await super().close()
        await self._close_admin()


async def _every_answer(asks: Iterable[Awaitable[T]]) -> list[T]:
    """Each ask's answer, asked at once; the first failure raised only once every ask has ended
    (``gather`` leaves the others running, and one would open its coordinator's connection after
    the failure had closed the admin client: never closed)."""
    answers = await asyncio.gather(*asks, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return cast(list[T], answers)
