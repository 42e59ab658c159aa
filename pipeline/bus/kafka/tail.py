"""The Kafka bus's delivery tail: one process-wide reader of the delivery
topic feeding the hot tier (:class:`~runwire.bus.kafka.hot.HotStreams`).

Records a stream already holds (a writer's own appends, written through) are
skipped by their header ``q`` without being decoded; see
:mod:`runwire.bus.kafka.bus` for the record format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from redis.backoff import ConstantBackoff

from ...core.envelope import Event, decode
from ...core.errors import BusUnavailable, ProtocolError
from ...core.retry import Retry
from ..base import StreamKey
from .hot import HotStreams
from .io import (
    COUNT_HEADER,
    KIND_HEADER,
    SEQ_HEADER,
    STATE_KIND,
    VIEW_HEADER,
    KafkaLink,
    guard,
    started,
)

log = logging.getLogger(__name__)
_RETRY = Retry(ConstantBackoff(0.5), retry_on=(KafkaError,), retriable=lambda _: True)
"""The tail reads for as long as the process lives, through any broker outage."""


def _report(exc: Exception, _pause: float) -> None:
    log.warning("kafka delivery tail: %r; retrying", exc)


class DeliveryTail:
    """One process-wide reader of the delivery topic feeding the hot tier."""

    def __init__(self, link: KafkaLink, topic: str, shards: int, streams: HotStreams) -> None:
        self.link = link
        self.topic = topic
        self.shards = shards
        self.streams = streams
        self.positions: dict[int, int] = {}
        self._progress = asyncio.Event()
        self._reader: AIOKafkaConsumer | None = None
        self._offsets: AIOKafkaConsumer | None = None
        """Asks for end offsets, and fetches once from there for the high water (a 1 ms wait)."""
        self._ends_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = time.monotonic()

    async def start(self) -> None:
        """Read the retained delivery topic up to its current end, then tail it live."""
        offsets = self.link.reader(fetch_max_wait_ms=1)
        await started("delivery tail", offsets)
        self._offsets = offsets
        reader = self.link.reader()
        await started("delivery tail", reader)
        tps = [TopicPartition(self.topic, p) for p in range(self.shards)]
        reader.assign(tps)
        for tp in tps:  # from offset 0, not the broker's "earliest" (see KafkaConsumer._from_commit)
            reader.seek(tp, 0)
            self.positions[tp.partition] = 0
        self._reader = reader
        self._task = asyncio.create_task(self._run(reader), name="runwire-kafka-delivery-tail")
        await self.sync(*range(self.shards))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for client in (self._reader, self._offsets):
            if client is not None:
                await client.stop()

    async def sync(self, *partitions: int) -> None:
        """Wait until the hot tier holds everything in ``partitions`` as of now."""
        ends = await self._ends([TopicPartition(self.topic, p) for p in partitions])
        while any(self.positions.get(tp.partition, 0) < end for tp, end in ends.items()):
            if self._task is None or self._task.done():
                raise BusUnavailable("kafka: the delivery tail stopped")
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), 1.0)

    async def _ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end as of now: the high water of a fetch answered from the end offset
        the broker names (that offset alone is not enough: Tansu 0.6.0 names one below the
        partition's end — the last batch's base offset + 1 on memory storage, 58 of 90 records
        seen on s3 storage — while its fetch responses' high water is right)."""
        client = self._offsets
        assert client is not None
        async with self._ends_lock:  # one assignment of the client at a time
            ends = await guard("delivery sync", client.end_offsets(tps))
            client.assign(tps)
            client.resume(*tps)  # paused by the last sync (an assignment like it stays one)
            for tp in tps:
                client.seek(tp, ends[tp])
            asked = time.time() * 1000
            deadline = time.monotonic() + self.link.options.request_timeout_ms / 1000
            while not all((client.last_poll_timestamp(tp) or 0) >= asked for tp in tps):
                if time.monotonic() > deadline:
                    raise BusUnavailable(f"kafka: no fetch answer for {self.topic} to sync on")
                await guard("delivery sync", client.getmany(*tps, timeout_ms=2, max_records=1))
            client.pause(*tps)  # no more fetches until the next sync (they would not wait)
            return {tp: max(ends[tp], client.highwater(tp) or 0) for tp in tps}

    async def _run(self, reader: AIOKafkaConsumer) -> None:
        while True:
            batches = await _RETRY.call(
                lambda: reader.getmany(timeout_ms=500, max_records=5000), on_retry=_report)
            for tp, records in batches.items():
                self._absorb(records)
                self.positions[tp.partition] = records[-1].offset + 1
            self._progress.set()
            if time.monotonic() - self._last_sweep > min(60.0, self.streams.grace_s):
                self._last_sweep = time.monotonic()
                self.streams.sweep()

    def _absorb(self, records: Sequence[Any]) -> None:
        for record in records:
            headers = dict(record.headers)
            view = headers.get(VIEW_HEADER, b"raw").decode()
            key: StreamKey = (record.key.decode(), "shaped" if view == "shaped" else "raw")
            at = record.timestamp / 1000 if record.timestamp and record.timestamp > 0 else None
            if headers.get(KIND_HEADER) == STATE_KIND:
                self.streams.set_state(key, record.value, at)
                continue
            last = headers.get(SEQ_HEADER)
            if last is not None and int(last) <= self.streams.last_seq(key):
                continue  # held already (this process's own append): no need to decode it
            values = record.value.split(b"\n") if COUNT_HEADER in headers else [record.value]
            events: list[Event] = []
            for value in values:
                try:
                    events.append(decode(value, max_depth=None))
                except ProtocolError as exc:
                    log.warning("kafka delivery tail: skipping a bad event in the record at %s: %s",
                                record.offset, exc)
            self.streams.add(key, events, at)
