"""A worker's write order: the replay log first, then the delivery streams (``Stages.write``).

Pins the cause of a flaky invariant-2 end-to-end check (a run's raw stream "held only its
first ~10 events" while the replay log held all of them, after a takeover on a loaded
machine): the successor wrote the killed worker's backlog — the terminal event included — to
the log in one write, and the test read the hot tier as soon as the log had the terminal
event, before that write's delivery appends. Nothing was lost: the appends follow. A reader of
the hot tier must wait for the stream's own terminal event (``wait_for_stream_end``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from runwire.bus import Bus, open_bus
from runwire.processing.processor import Processor
from runwire.processing.stages import EncodedWrite, Stages
from runwire.processing.worker_loop import ConsumerLoop
from runwire.store import ReplayLog, open_store
from tests.e2e_harness import wait_for_stream_end, wait_for_terminal
from tests.workers.checks import read_all
from tests.workers.events import RunScript


@pytest.fixture
async def log_store(tmp_path) -> AsyncIterator[ReplayLog]:  # type: ignore[no-untyped-def]
    async with open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        yield store


class HeldViews(Stages):
    """Stages whose delivery appends wait for ``go`` (a loaded machine, a slow Redis)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.go = asyncio.Event()

    async def write_views(self, write: EncodedWrite) -> None:
        await self.go.wait()
        await super().write_views(write)


async def test_the_replay_log_has_the_terminal_event_before_the_raw_stream_does(
    redis_bus: Bus, log_store: ReplayLog
) -> None:
    run = RunScript(f"order-{uuid.uuid4().hex[:8]}")
    events = [run.lifecycle("running")] + [run.tool_start(f"c{i}") for i in range(60)]  # one ingest entry: one write
    events.append(run.lifecycle("done"))
    await redis_bus.publish(events)
    consumer = redis_bus.consumer("g", "w1")
    stop = asyncio.Event()
    stages = HeldViews(redis_bus, log_store, Processor(), stop, dead_letter=consumer.dead_letter)
    worker = asyncio.create_task(ConsumerLoop(consumer, stages).loop(batch=4096, tick_s=0.05,
                                                                     burst=False))
    try:
        await wait_for_terminal(log_store, run.run_id)
        assert len(await log_store.read(run.run_id)) == len(events)
        assert await read_all(redis_bus, run.run_id) == []  # the log leads the hot tier
        stages.go.set()
        await wait_for_stream_end(redis_bus, run.run_id)
        assert [e.id for e in await read_all(redis_bus, run.run_id)] == [e.id for e in events]
    finally:
        stages.go.set()
        stop.set()
        await asyncio.wait_for(worker, 30)
        await consumer.close()


class Recorded(Stages):
    """Stages that note when each write's log part and views start, and whose first log part
    is slow (a busy disk), so the loop queues the next write behind it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.order: list[tuple[str, int]] = []
        self._numbers: dict[int, int] = {}

    def _number(self, write: EncodedWrite) -> int:
        return self._numbers.setdefault(id(write), len(self._numbers) + 1)

    async def write_log(self, write: EncodedWrite) -> None:
        number = self._number(write)
        self.order.append(("log", number))
        if number == 1:
            await asyncio.sleep(0.3)
        await super().write_log(write)

    async def write_views(self, write: EncodedWrite) -> None:
        self.order.append(("views", self._number(write)))
        await super().write_views(write)


async def test_a_write_queued_behind_a_log_part_starts_its_own_before_that_writes_views(
    log_store: ReplayLog,
) -> None:
    """The replay log's thread is the worker's other lane: while a write's log part runs, the
    batches processed meanwhile are sealed into the next write, whose log part starts as soon
    as that one ends — not after that write's views and acks have run on the loop."""
    async with open_bus("memory://?shards=1") as bus:
        run = RunScript(f"queued-{uuid.uuid4().hex[:8]}")
        events = [run.tool_start(f"c{i}", ms=i) for i in range(1, 2001)]
        await bus.publish(events)
        consumer = bus.consumer("g", "w1")
        stages = Recorded(bus, log_store, Processor(), asyncio.Event(),
                          dead_letter=consumer.dead_letter)
        try:
            await ConsumerLoop(consumer, stages).loop(batch=100, tick_s=0.05, burst=True)
        finally:
            await consumer.close()
        assert stages.order[:2] == [("log", 1), ("log", 2)], stages.order
        assert stages.order.index(("log", 2)) < stages.order.index(("views", 1))
        assert [e.id for e in await read_all(bus, run.run_id)] == [e.id for e in events]
        assert [e.id for e in await log_store.read(run.run_id)] == [e.id for e in events]
