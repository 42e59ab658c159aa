"""Invariant 8 (at the limit, pause): Redis at ``maxmemory`` pauses a worker and a publisher,
which retry as they do for an unreachable bus; once memory is raised the backlog drains
exactly once (invariant 2). Each test sets ``maxmemory`` on a redis-server of its own."""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from redis.asyncio import Redis

from runwire.bus import open_bus
from runwire.processing.processor import Processor
from runwire.processing.stages import EncodedWrite, Stages
from runwire.processing.worker_loop import ConsumerLoop
from runwire.sdk.publisher import Publisher
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.services import RedisServer
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, read_all, run_tree
from tests.workers.test_crash import start_worker, wait_finished, wait_sharing

FULL = 1
"""``maxmemory`` in bytes: any Redis is over it, so every write that may grow memory is refused."""




@pytest.fixture
async def log_store(tmp_path) -> AsyncIterator[ReplayLog]:  # type: ignore[no-untyped-def]
    async with open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        yield store


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


class FillingStages(Stages):
    """The worker's stages, with Redis filling up between a batch's fetch and its delivery appends."""

    def __init__(self, *args: object, admin: Redis, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.admin = admin
        self.filled = False

    async def write_views(self, write: EncodedWrite) -> None:
        if not self.filled:
            self.filled = True
            await self.admin.config_set("maxmemory", FULL)
        await super().write_views(write)


async def test_a_worker_at_maxmemory_pauses_in_its_delivery_appends_and_drains_exactly_once(
    own_redis: RedisServer, admin: Redis, log_store: ReplayLog, caplog: pytest.LogCaptureFixture
) -> None:
    """The delivery append script refused with OOM (``write_views`` → ``run_packed``) is a
    pause: the worker retries with backoff, logs one line when it pauses and one when it
    resumes, counts the refusals, and never ends; raised memory drains the batch once."""
    caplog.set_level(logging.INFO, logger="runwire")
    events, ancestry = run_tree(f"full{uuid.uuid4().hex[:6]}")
    root = next(run for run, parents in ancestry.items() if not parents)
    async with open_bus(f"{own_redis.url}?shards=2") as bus:
        await bus.publish(events)
        consumer = bus.consumer("g", "w1")
        stop = asyncio.Event()
        stages = FillingStages(bus, log_store, Processor(), stop,
                               dead_letter=consumer.dead_letter, admin=admin)
        worker = asyncio.create_task(ConsumerLoop(consumer, stages).loop(
            batch=4096, tick_s=0.05, burst=False))
        try:
            await until(lambda: stages.outage.retried.get("bus full", 0) >= 5 or worker.done())
            assert not worker.done(), worker.exception()
            assert stages.outage.state == "bus full"
            assert await read_all(bus, root) == []  # refused: nothing half-written
            assert len(lines(caplog, "paused: bus full")) == 1

            await admin.config_set("maxmemory", 0)
            await until(lambda: stages.outage.state is None and not worker.done())
            expected = len([e for e in events if e.run_id == root])
            await until_logged(log_store, root, expected)
            assert not worker.done()
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
            await consumer.close()
        await assert_delivered_exactly_once(bus, log_store, events, ancestry)
    assert len(lines(caplog, "paused: bus full")) == 1
    assert len(lines(caplog, "resumed after")) == 1
    assert stages.finish_stats().retried["bus full"] >= 5


async def until_logged(store: ReplayLog, run_id: str, at_least: int, within: float = 30.0) -> None:
    async with asyncio.timeout(within):
        while True:
            info = await store.run(run_id)
            if info is not None and info.terminal and info.events >= at_least:
                return
            await asyncio.sleep(0.05)


async def test_a_publisher_at_maxmemory_retries_within_its_delivery_timeout(
    own_redis: RedisServer, admin: Redis, log_store: ReplayLog, caplog: pytest.LogCaptureFixture
) -> None:
    """An OOM refusal is retried like an unreachable bus, not given up at once: once memory
    is raised every emitted event is delivered, and a worker records each exactly once."""
    caplog.set_level(logging.INFO, logger="runwire")
    url = f"{own_redis.url}?shards=2"
    run_id = f"pubfull-{uuid.uuid4().hex[:6]}"
    await admin.config_set("maxmemory", FULL)
    async with Publisher.connect(url, linger_ms=1.0, delivery_timeout=120) as publisher:
        run = publisher.run(run_id)
        for index in range(50):
            await run.emit("text.delta", {"text": f"{index} "})
        await run.finish("done")
        flushing = asyncio.create_task(publisher.flush())
        await until(lambda: publisher.outage.retried.get("bus full", 0) >= 3 or flushing.done())
        assert not flushing.done(), flushing.exception()
        assert publisher.outage.state == "bus full"
        await admin.config_set("maxmemory", 0)
        await asyncio.wait_for(flushing, 60)
        assert publisher.published == 51  # 50 deltas and the terminal event
    async with open_bus(url) as bus:
        await run_worker(bus, log_store, group="g", name="w1", burst=True)
        raw = await read_all(bus, run_id)
    logged = await log_store.read(run_id)
    assert [e.seq for e in raw] == list(range(1, len(raw) + 1))
    assert [e.id for e in logged] == [e.id for e in raw]
    assert sum(e.type == "text.delta" for e in raw) == 50
    assert len(lines(caplog, "paused: bus full")) == 1
    assert len(lines(caplog, "resumed after")) == 1


async def test_a_runwire_worker_process_at_maxmemory_never_exits_and_drains_exactly_once(
    own_redis: RedisServer, admin: Redis, tmp_path: Path
) -> None:
    """The operator's view: a ``runwire worker`` process and an SDK publisher on a Redis that
    fills up mid-stream. The worker keeps running (paused, one log line), the publisher keeps
    retrying; once memory is raised every published event is delivered and logged once."""
    url = f"{own_redis.url}?shards=2&lease_ms=1500&claim_idle_ms=1000"
    store_url = f"sqlite:///{tmp_path}/replay.db"
    worker = start_worker(url, store_url, "w1", tmp_path, group="full")
    log_file = tmp_path / "w1.log"
    try:
        await wait_sharing(tmp_path, ["w1"])
        before, before_ancestry = run_tree(f"pre{uuid.uuid4().hex[:6]}")
        after, after_ancestry = run_tree(f"post{uuid.uuid4().hex[:6]}")
        roots = [run for run, parents in {**before_ancestry, **after_ancestry}.items() if not parents]
        async with open_bus(url) as bus:
            await bus.publish(before)
            await wait_finished(bus, roots[:1], 30)

            await admin.config_set("maxmemory", FULL)
            async with Publisher.connect(url, linger_ms=1.0, delivery_timeout=120) as publisher:
                await publisher.publish_events(after)
                flushing = asyncio.create_task(publisher.flush())
                await until(lambda: "paused: bus full" in log_file.read_text()
                            and publisher.outage.state == "bus full", within=60)
                assert worker.poll() is None, log_file.read_text()
                assert not flushing.done()

                await admin.config_set("maxmemory", 0)
                await asyncio.wait_for(flushing, 60)
            await wait_finished(bus, roots[1:], 60)
            assert worker.poll() is None, log_file.read_text()
            async with open_store(store_url) as store:
                await assert_delivered_exactly_once(
                    bus, store, before + after, {**before_ancestry, **after_ancestry})
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log_file.read_text()
    text = log_file.read_text()
    assert text.count("paused: bus full") == 1, text
    assert text.count("resumed after") == 1, text
    counters = msgspec.json.decode(text.strip().splitlines()[-1])
    assert counters["retried"]["bus full"] >= 1 and counters["paused_seconds"] > 0
