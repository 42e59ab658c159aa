"""At the limit, pause: the PostgreSQL replay log stopped mid-run (``pg_ctl stop -m immediate``,
every connection dropped at once) and started again a few seconds later, while a publisher goes
on publishing.

The worker pauses without acking what it could not log — one ``paused:`` line, one ``resumed
after`` line —, never exits, reconnects by itself, and everything drains exactly once, in order:
in the replay log and for a client resuming from seq 0 on the hot tier. (``bench/faults.py``
``postgres-restart`` and ``postgres-down-30s`` drive the same fault with worker processes and
SDK publishers.)
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from runwire.bus import open_bus
from runwire.store import open_store
from runwire.workers.runtime import run_worker
from tests.services import PostgresServer, RedisServer
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, run_tree

DOWN_S = 3.0
"""How long PostgreSQL stays down (at least: until the worker paused and the publisher is done)."""


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_the_replay_log_restarted_mid_run_pauses_the_worker_and_everything_drains_once_after(
    own_redis: RedisServer, own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    prefix = f"p{uuid.uuid4().hex[:8]}"
    events, ancestry = run_tree(prefix, deltas=300)
    root = f"{prefix}_root"
    url = f"{own_redis.url}?shards=2&prefix=pg"
    async with open_bus(url) as bus, open_store(own_postgres.url) as store:
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(bus, store, group="g", name="w1", stop=stop))
        published = 0

        async def publisher() -> None:
            nonlocal published
            for start in range(0, len(events), 8):
                await bus.publish(events[start:start + 8])
                published = start + 8
                await asyncio.sleep(0.005)

        publishing = asyncio.create_task(publisher())
        await until(lambda: store.run(root), within=30, what="the worker writes the replay log")
        await asyncio.to_thread(own_postgres.stop)
        stopped = time.monotonic()
        assert not publishing.done(), "the fault must come while the publisher is publishing"
        await until(lambda: _lines(caplog, "paused: store unavailable"), within=30, what="the worker pauses")
        await until(lambda: publishing.done() and time.monotonic() - stopped >= DOWN_S, within=60,
                    what="the publisher done, PostgreSQL down a few seconds")
        assert not worker.done(), "the worker must not exit while the replay log is down"
        await asyncio.to_thread(own_postgres.resume)
        await until(lambda: _lines(caplog, "resumed after"), within=30, what="the worker writes again")

        async def logged() -> bool:
            infos = await store.runs_by_id(list(ancestry))
            return len(infos) == len(ancestry) and all(i.terminal for i in infos.values())

        await until(logged, within=60, what="every run ended in the replay log")
        assert not worker.done()
        stop.set()
        stats = await worker
        await assert_delivered_exactly_once(bus, store, events, ancestry)
    assert published >= len(events)
    assert stats.paused_seconds > 0
    assert stats.retried.get("store unavailable", 0) >= 1
    assert len(_lines(caplog, "paused:")) == 1  # one line for the outage, however many retries
    assert len(_lines(caplog, "resumed after")) == 1
