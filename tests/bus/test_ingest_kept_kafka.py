"""Invariant 2 when the Kafka-protocol broker loses what it acknowledged: the publishing process
sends it again (``runwire.bus.kafka.retain``).

A broker on volatile storage restarted empty no longer has ingest records it acknowledged, and a
worker that had not read them never will. A publishing process keeps each batch until every
consumer group reading the ingest topic has committed past it; finding the broker's life marker
gone, it sends the kept batches again, before anything newer. What every group committed is let
go, and never sent again. (End to end with workers: tests/workers/test_broker_restart.py.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import msgspec

from runwire.bus import open_bus
from runwire.bus.kafka.bus import KafkaBus
from tests.bus.test_contract import drain
from tests.events import event
from tests.services import TansuBroker
from tests.waiting import until


def _url(base: str, extra: str = "", shards: int = 2) -> str:
    return f"{base}?prefix=k{uuid.uuid4().hex[:8]}&shards={shards}{extra}"


async def test_what_a_group_committed_is_let_go_and_never_sent_again() -> None:
    broker = TansuBroker()
    broker.start()
    try:
        async with open_bus(_url(broker.url)) as bus:
            assert isinstance(bus, KafkaBus)
            reader = bus.consumer("g", "c")
            await bus.publish([event("run-r", s) for s in range(1, 6)])
            assert bus.kept.bytes > 0
            got = await drain(reader, 5)
            assert sorted(msgspec.json.decode(d.data)["seq"] for d in got) == [1, 2, 3, 4, 5]
            await until(lambda: bus.kept.bytes == 0, within=15, what="kept batches let go once committed")
            assert not bus.kept.unread
            await reader.close()
            broker.close()
            broker.start()  # empty: had the publisher kept them, it would send them again
            await bus.publish([event("run-r", s) for s in range(6, 8)])
            assert bus.kept.resent == 0
            assert bus.link.losses == 1
    finally:
        broker.close()


async def test_without_a_reading_group_everything_is_kept_and_closing_does_not_wait(
    kafka_url: str,
) -> None:
    async with open_bus(_url(kafka_url)) as bus:
        assert isinstance(bus, KafkaBus)
        await bus.publish([event("run-u", s) for s in range(1, 4)])
        await bus.kept.confirm()
        assert bus.kept.unread and bus.kept.bytes > 0


async def test_past_retain_bytes_the_oldest_are_let_go_and_counted(kafka_url: str) -> None:
    async with open_bus(_url(kafka_url, "&retain_bytes=4000")) as bus:
        assert isinstance(bus, KafkaBus)
        for s in range(1, 41):
            await bus.publish([event("run-b", s, text="x" * 200)])
        assert 0 < bus.kept.bytes <= 4000
        assert bus.kept.unprotected > 0


async def test_a_new_lifes_offsets_never_let_go_of_what_the_former_life_lost() -> None:
    """Kept batches of the broker's former life, the broker restarted empty, and a group of the
    new life committed past their offsets before this process's producer saw a connection close
    (as when it was idle): the round reads the life marker after the offsets, lets nothing go,
    and the batches are sent again — a reader of the new life gets every event."""
    broker = TansuBroker()
    broker.start()
    url = _url(broker.url, shards=4)  # what the broker makes of a topic a client asks about
    try:
        async with open_bus(url) as bus:
            assert isinstance(bus, KafkaBus)
            await bus.publish([event("run-o", s) for s in range(1, 4)])
            kept = bus.kept.bytes
            await bus.kept.close()  # its rounds stop: the one below is the first after the restart
            broker.close()
            broker.start()  # empty
            async with open_bus(url) as other:  # the new life: more records, read and committed
                reader = other.consumer("g", "c")
                for n in range(40):  # records on every partition, the kept one's included
                    await other.publish([event(f"run-n{n}", 1)])
                assert len(await drain(reader, 40)) == 40
                await reader.close()
            assert bus.kept.resent == 0
            bus.link._checked = bus.link.breaks  # the producer has not seen its connection close
            await until(_confirmed(bus), within=20, what="a round that asked the life marker")
            assert bus.kept.resent == 1 and bus.kept.bytes >= kept  # its one record, sent again
            check = bus.consumer("check", "c")
            got = {msgspec.json.decode(d.data)["run_id"] for d in await drain(check, 43)}  # type: ignore[attr-defined]
            await check.close()
        assert "run-o" in got
    finally:
        broker.close()


async def test_a_batch_in_flight_as_the_broker_went_away_is_not_read_ahead_of_what_it_lost() -> None:
    """The broker stopped with a produce in flight, killed and started again empty: aiokafka sends
    the batch again by itself once the broker answers, and the new life stores that copy before the
    publisher, finding the loss, sends again what it kept of the former one. A reader would meet the
    run's later events first (the worker: an ``x.gap``, then the earlier ones dropped as late).
    Stamped with the former life, the copy is dropped where it is read: the run arrives once, in
    order (``runwire.bus.kafka.life``, Stamps)."""
    broker = TansuBroker()
    broker.start()
    url = _url(broker.url, shards=4)  # what the broker makes of a topic a client asks about
    try:
        async with open_bus(url) as bus:
            assert isinstance(bus, KafkaBus) and broker.proc is not None
            await bus.publish([event("run-f", s) for s in range(1, 6)])  # kept: no group read them
            os.kill(broker.proc.pid, signal.SIGSTOP)
            in_flight = asyncio.create_task(bus.publish([event("run-f", s) for s in range(6, 9)]))
            sender = bus.link.producer._sender
            await until(lambda: bool(sender._in_flight), within=10, what="a produce sent to the stopped broker")
            broker.close()  # SIGKILL: the produce's connection closes unanswered
            broker.start()  # empty, on the same port: aiokafka's own retry is stored here
            await asyncio.wait_for(in_flight, 60)
            assert bus.link.losses == 1 and bus.kept.resent == 1  # a record of events 1-5
            reader = bus.consumer("g", "c")
            got = await drain(reader, 8)
            got += await reader.fetch(max_count=500, block_ms=500)  # nothing more
            assert [msgspec.json.decode(d.data)["seq"] for d in got] == list(range(1, 9))
            assert bus.life.dropped == 1  # the retried copy, once
            await reader.close()
    finally:
        broker.close()


def _confirmed(bus: KafkaBus):  # type: ignore[no-untyped-def]
    async def round_done() -> bool:
        try:
            await bus.kept.confirm()
        except Exception:  # the broker still starting: the task's rounds retry too
            return False
        return bus.kept.resent > 0
    return round_done


async def test_a_reader_whose_life_token_another_bus_replaced_reads_that_buss_records(
    kafka_url: str,
) -> None:
    """Two buses that find the life marker empty at once both write a token; the one that read
    its own back holds a token the marker no longer ends with. Records stamped with the newer
    token are not a former life's: the reader asks the marker, takes its token, and reads them."""
    url = _url(kafka_url)
    async with open_bus(url) as reader_bus:
        assert isinstance(reader_bus, KafkaBus)
        held = reader_bus.life.token
        await reader_bus.link.produce(reader_bus.life.topic, [(0, None, b"a-later-token", [])])
        async with open_bus(url) as publisher:
            assert isinstance(publisher, KafkaBus) and publisher.life.token == b"a-later-token"
            await publisher.publish([event("run-t", s) for s in range(1, 4)])
        reader = reader_bus.consumer("g", "c")
        got = await drain(reader, 3)
        assert [msgspec.json.decode(d.data)["seq"] for d in got] == [1, 2, 3]
        assert reader_bus.life.token == b"a-later-token" and held in reader_bus.life.former
        assert reader_bus.life.dropped == 0
        await reader.close()


async def test_rounds_at_once_let_go_only_of_what_the_group_committed(kafka_url: str) -> None:
    """A closing process's rounds (``drain``) and the task's run one at a time: two at once each
    counted the same committed batches and each let them go — the second taking batches no group
    had read, which a broker loss would then lose (and they shared, and closed, one admin client
    under each other's asks)."""
    async with open_bus(_url(kafka_url, shards=1)) as bus:
        assert isinstance(bus, KafkaBus)
        for s in range(1, 6):
            await bus.publish([event("run-c", s)])
        await bus.kept.close()  # no round until the committed batches have company
        reader = bus.consumer("g", "c")
        assert len(await drain(reader, 5)) == 5  # read and committed
        await reader.close()
        for s in range(6, 11):
            await bus.publish([event("run-c", s)])  # no group reads these
        await asyncio.gather(bus.kept.drain(1.5), bus.kept.drain(1.5), bus.kept.drain(1.5))
        assert [len(part) for part in bus.kept.batches.values() if part] == [5]
