"""The Kafka worker and offsets of an ingest partition the broker has no record at."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from runwire.bus import open_bus
from runwire.bus.kafka.bus import KafkaBus
from runwire.bus.keys import shard_for
from runwire.core.envelope import Event, encode
from runwire.processing.faust.worker import FaustWorker
from runwire.store import open_store
from tests.waiting import until
from tests.workers.checks import read_all
from tests.workers.events import RunScript
from tests.workers.test_faust import kafka_bus_url


async def _produce_with_holes(bus: KafkaBus, run_id: str, values: list[bytes | None]) -> int:
    """One batch of the run's records in its ingest partition, one per entry of ``values``; an
    entry None leaves its offset without a record. Returns the batch's base offset.

    A producer numbers a batch's records by their offset deltas and the broker assigns the
    batch's base offset. Tansu stores the batch as sent, so a skipped delta is an offset the
    broker counts (the high water moves past it) but holds no record at, as a broker that lost
    a record does. (aiokafka's batch builder has no public way to skip one: its next delta.)
    """
    producer = AIOKafkaProducer(bootstrap_servers=bus.bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        batch = producer.create_batch()
        for value in values:
            if value is None:
                batch._relative_offset += 1
            else:
                batch.append(timestamp=None, key=run_id.encode(), value=value)
        sent = await producer.send_batch(
            batch, bus.topics["ingest"], partition=shard_for(run_id, bus.shards))
        return int((await sent).offset)
    finally:
        await producer.stop()


async def _delivered(bus: KafkaBus, run_id: str, event_id: str) -> bool:
    return any(event.id == event_id for event in await read_all(bus, run_id))


@pytest.mark.slow
async def test_offsets_the_broker_has_no_record_at_are_passed_with_an_error_and_an_x_gap(
    kafka_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hole the broker really has in an ingest partition (no record at those offsets: a broker
    that lost records) is not sought back to for ever as if faust had dropped its entries: once
    re-reading from it has kept returning a later entry, the broker is asked, the hole is logged as an error,
    counted, and passed. Holes at the partition's start and in its middle; an event that was in a
    hole is an ``x.gap`` of its run, every other event is delivered once, in order."""
    caplog.set_level(logging.INFO, logger="runwire.faust")
    prefix = f"f{uuid.uuid4().hex[:8]}"
    run = RunScript(f"{prefix}_root")
    events: list[Event] = [run.lifecycle("running")]
    events += [run.text(f"delta {index} ", 10 * index) for index in range(1, 10)]
    events.append(run.lifecycle("done", 200))
    values = [encode(event) for event in events]
    bus_url = kafka_bus_url(kafka_url, prefix, session_timeout_ms=2000, shards=1,
                            request_timeout_ms=3000)
    async with open_bus(bus_url) as bus, \
            open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        assert isinstance(bus, KafkaBus)
        # offset 0: no record (a hole at the partition's start); 1, 2: events 0 and 1
        assert await _produce_with_holes(bus, run.run_id, [None, values[0], values[1]]) == 0
        await bus.publish(events[2:4])  # offset 3
        # offsets 4: event 4; 5 and 6: no record (event 5 was there); 7: event 6
        assert await _produce_with_holes(bus, run.run_id, [values[4], None, None, values[6]]) == 4
        await bus.publish(events[7:])  # offset 8
        worker = FaustWorker(bus, store, group=f"{prefix}-g", name="f1")
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: _delivered(bus, run.run_id, events[-1].id), within=25,
                        what="the run's last event delivered")
        finally:
            worker.stop.set()
            stats = await asyncio.wait_for(running, 30)
        assert stats.broker_holes == 2
        errors = [r.getMessage() for r in caplog.records
                  if r.name == "runwire.faust" and r.levelno == logging.ERROR]
        assert errors == [
            "f1: the broker has no record at offsets 0..0 of ingest partition 0: lost by the "
            "broker; going on (what its publishers still keep comes again; a run still missing "
            "events shows an x.gap)",
            "f1: the broker has no record at offsets 5..6 of ingest partition 0: lost by the "
            "broker; going on (what its publishers still keep comes again; a run still missing "
            "events shows an x.gap)",
        ]
        raw = await read_all(bus, run.run_id)
        assert [(e.type, e.seq) for e in raw] == [
            *[(e.type, index) for index, e in enumerate(events[:5], 1)],
            ("x.gap", 6),
            *[(e.type, index) for index, e in enumerate(events[6:], 7)],
        ]
        gap = raw[5].payload_dict()
        assert (gap["first"], gap["last"]) == (6, 6)  # publisher seq 6 (events[5]) was lost
        assert [e.id for e in raw if e.type != "x.gap"] == [
            e.id for e in events if e is not events[5]]
        assert stats.gaps == 1
