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

from runwire.bus import Bus
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
