"""Kafka ingest records of several events (runwire.bus.ingest_entries): one record per root run
and up to 64 events of a publish, records of one event (the earlier format, and what a plain
producer sends) read as before, a record acked once each of its events is acked or
dead-lettered, and a poison event dead-lettered alone."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runwire.bus import Delivery, open_bus
from runwire.bus.base import Consumer
from runwire.bus.ingest_entries import INGEST_ENTRY_EVENTS
from runwire.bus.kafka.bus import KafkaBus
from runwire.bus.kafka.hold import BACKLOG_FETCH_WAIT_MS, IDLE_FETCH_WAIT_MS
from runwire.bus.keys import shard_for
from runwire.core.envelope import decode, encode
from tests.bus.test_kafka import read_topic
from tests.events import event
from tests.waiting import until


@pytest.fixture
def url(kafka_url: str) -> str:
    return f"{kafka_url}?prefix=m{uuid.uuid4().hex[:10]}&shards=2&claim_idle_ms=300&session_timeout_ms=2000"


async def take(consumer: Consumer, want: int, within: float = 20) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + within
    while len(got) < want and time.monotonic() < deadline:
        got += await consumer.fetch(max_count=want - len(got), block_ms=200)
    return got


def seqs(deliveries: list[Delivery]) -> list[int]:
    return [decode(d.data).seq for d in deliveries]


async def produce(bus: KafkaBus, run_id: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bus.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(bus.topics["ingest"], value, key=run_id.encode(),
                                     partition=shard_for(run_id, bus.shards), headers=headers)
    finally:
        await producer.stop()


async def test_a_publish_is_one_record_per_root_run_and_64_events(url: str) -> None:
    async with open_bus(url) as bus:
        assert isinstance(bus, KafkaBus)
        await bus.publish([event("run-a", seq) for seq in range(1, 151)] + [event("run-b", 1)])
        records = await read_topic(bus.bootstrap, bus.topics["ingest"], 2)
    counts = sorted((r.key, dict(r.headers).get("n")) for r in records)
    assert counts == [(b"run-a", b"22"), (b"run-a", b"64"), (b"run-a", b"64"), (b"run-b", None)]
    assert INGEST_ENTRY_EVENTS == 64


async def test_records_of_one_event_and_of_several_are_read_in_order(url: str) -> None:
    """A record without header ``n`` is one event, even one holding a newline (a plain
    producer's pretty-printed JSON); fetch counts events, not records."""
    async with open_bus(url) as bus:
        assert isinstance(bus, KafkaBus)
        await produce(bus, "run-o", encode(event("run-o", 1)), [])
        pretty = encode(event("run-o", 2)).replace(b'","', b'",\n"', 1)
        await produce(bus, "run-o", pretty, [])
        await bus.publish([event("run-o", seq) for seq in range(3, 203)])
        await produce(bus, "run-o", encode(event("run-o", 203)), [])
        async with bus.consumer("g", "c") as consumer:
            first = await consumer.fetch(max_count=100, block_ms=5000)
            got = first + await take(consumer, 203 - len(first))
            await consumer.ack(got)
    assert len(first) >= 100
    assert seqs(got) == list(range(1, 204))
    assert len({d.entry_id for d in got}) == 3 + 4  # three plain records, 200 events in four


async def test_a_record_with_header_n_is_its_lines_whatever_the_header_says(url: str) -> None:
    """Header ``n`` marks the format; readers count the lines (a wrong count misleads none)."""
    async with open_bus(url) as bus:
        assert isinstance(bus, KafkaBus)
        lines = b"\n".join(encode(event("run-n", seq)) for seq in (1, 2, 3))
        await produce(bus, "run-n", lines, [("n", b"not a number")])
        await produce(bus, "run-n", encode(event("run-n", 4)), [("other", b"x")])
        async with bus.consumer("g", "c") as consumer:
            got = await take(consumer, 4)
            await consumer.ack(got)
    assert seqs(got) == [1, 2, 3, 4] and [d.part for d in got] == [0, 1, 2, 0]


async def test_a_record_is_committed_once_each_event_is_acked_or_dead_lettered(url: str) -> None:
    async with open_bus(url) as bus:
        await bus.publish([event("run-p", seq) for seq in range(1, 4)])
        async with bus.consumer("g", "c") as consumer:
            got = await take(consumer, 3)
            assert len({d.entry_id for d in got}) == 1 and [d.part for d in got] == [0, 1, 2]
            await consumer.ack([got[0], got[2]])
        async with bus.consumer("g", "c") as consumer:  # the middle one is open: all again
            again = await take(consumer, 3)
            assert seqs(again) == [1, 2, 3]
            await consumer.ack([again[0], again[2]])
            await consumer.dead_letter(again[1], "bad")
        async with bus.consumer("g", "c") as consumer:
            assert await take(consumer, 1, within=3) == []
        letters = await bus.dead_letters()
    assert [(decode(d.data).seq, d.reason, d.entry_id) for d in letters] == [
        (2, "bad", again[1].entry_id)]


async def test_an_idle_record_hands_out_only_its_open_events_and_dead_letters_them_alone(
    url: str,
) -> None:
    async with open_bus(url + "&max_deliveries=2") as bus:
        await bus.publish([event("run-i", seq) for seq in range(1, 5)])
        async with bus.consumer("g", "c") as consumer:
            got = await take(consumer, 4)
            await consumer.ack([got[0], got[3]])
            again = await take(consumer, 2)  # after claim_idle_ms
            assert seqs(again) == [2, 3] and {d.deliveries for d in again} == {2}
            await consumer.ack(again[:1])
            assert await take(consumer, 1, within=2) == []  # the third time: dead-lettered
        letters = await bus.dead_letters()
        async with bus.consumer("g", "c") as consumer:
            assert await take(consumer, 1, within=3) == []
    assert [(decode(d.data).seq, d.deliveries) for d in letters] == [(3, 3)]
    assert "max_deliveries" in letters[0].reason


async def test_the_broker_holds_a_fetch_long_only_when_it_asks_for_every_partition(url: str) -> None:
    """aiokafka keeps one fetch in flight per broker, without the partitions whose fetched records
    are not taken yet: held long, it kept those waiting behind caught-up ones. Each fetch asking
    for only some partitions is held 100 ms at most; one asking for all of them (nothing left
    out: the broker answers it as soon as any has a record) 400 ms, so an idle consumer asks
    2.5 times a second (``docs/bus.md`` § Kafka, "Fetch wait")."""
    async with open_bus(url) as bus:
        assert isinstance(bus, KafkaBus)
        consumer = bus.consumer("g", "c1")
        try:
            await consumer.fetch(block_ms=10)  # joins; nothing published yet
            fetcher = consumer._client._fetcher  # type: ignore[attr-defined]
            build = fetcher._get_actions_per_node
            built: list[tuple[int, int]] = []  # (hold, partitions asked for) of each fetch

            def watched(assignment: Any) -> Any:
                actions = build(assignment)
                built.extend((request._max_wait_ms, sum(len(parts) for _, parts in request.topics))
                             for _, request in actions[0])
                return actions

            fetcher._get_actions_per_node = watched
            await bus.publish([event("fw", seq) for seq in range(1, 1001)])  # one partition
            got: list[Delivery] = []
            while len(got) < 1000:  # taken slowly: the backlog's records wait, fetched
                taken = await consumer.fetch(max_count=64, block_ms=200)
                await consumer.ack(taken)
                got += taken
                await asyncio.sleep(0.05)
            taken_all = len(built)
            await until(lambda: any(asked == 2 for _, asked in built[taken_all:]), within=10,
                        what="a fetch for both partitions, nothing left to take")
        finally:
            await consumer.close()
    assert seqs(got) == list(range(1, 1001))
    assert {hold for hold, asked in built if asked < 2} == {BACKLOG_FETCH_WAIT_MS} == {100}
    assert {hold for hold, asked in built if asked == 2} == {IDLE_FETCH_WAIT_MS} == {400}
