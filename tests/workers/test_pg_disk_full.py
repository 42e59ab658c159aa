"""At the limit, pause: the PostgreSQL replay log's disk full.

PostgreSQL runs on a tmpfs of the test's own (its data directory: tables, temporary files and
``pg_wal``), filled up before the events are published — a real server at its real limit: each
write is refused with SQLSTATE 53100 (``could not extend file …: No space left on device``),
the server stays up. The worker pauses without acking what it could not log — one ``paused:
store full`` line, ``runwire_worker_paused{part="store",reason="full"}`` 1 on its metrics —,
never exits and dead-letters nothing; once the filesystem has room again (remounted larger)
everything drains exactly once, in order. (``bench/faults.py --only postgres-disk-full`` drives
the same fault with worker processes, SDK publishers and an edge.)
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from runwire.bus import open_bus
from runwire.store import open_store
from runwire.workers.runtime import run_worker
from tests.services import PostgresServer, RedisServer, fill_filesystem
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, run_tree
from tests.workers.test_disk_full import HINT

LEFT = 32 * 1024
"""Bytes left on the filesystem once it is filled: less than one batch's rows."""


@pytest.fixture
def full_postgres() -> Iterator[tuple[PostgresServer, Path]]:
    """A PostgreSQL (``synchronous_commit`` on) whose cluster is on a 96 MiB tmpfs of its own
    (initdb takes ~40 MiB); the test fills it up and remounts it larger. (Mounted outside the
    test's ``tmp_path``, which the ``postgres`` user may not enter.)"""
    where = Path(tempfile.mkdtemp(prefix="runwire-pgfs-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0755", "tmpfs", str(where)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"{HINT}: {mounted.stderr.strip()}"
    server = PostgresServer(durable=True, root=where)
    try:
        server.start()
        yield server, where
    finally:
        server.close()
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_a_full_postgres_disk_pauses_the_worker_and_everything_drains_once_after(
    own_redis: RedisServer, full_postgres: tuple[PostgresServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server, fs = full_postgres
    prefix = f"pf{uuid.uuid4().hex[:8]}"
    events, ancestry = run_tree(prefix, deltas=300)
    url = f"{own_redis.url}?shards=2&prefix=pgfull"
    metrics = CollectorRegistry()
    paused = {"part": "store", "reason": "full"}
    async with open_bus(url) as bus, open_store(server.url) as store:
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(bus, store, group="g", name="w1", stop=stop, metrics=metrics))
        await asyncio.to_thread(fill_filesystem, fs / "filler", leave=LEFT)
        await bus.publish(events)
        await until(lambda: _lines(caplog, "paused: store full"), within=60, what="the worker pauses: disk full")
        assert "No space left on device" in _lines(caplog, "paused:")[0]
        assert metrics.get_sample_value("runwire_worker_paused", paused) == 1
        assert not worker.done(), "the worker must not exit while the replay log's disk is full"
        assert not await store.runs_by_id(list(ancestry)), "nothing of the batch is in the log yet"
        assert server.running(), "PostgreSQL refuses the writes and stays up"
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,size=512m", "tmpfs", str(fs)], check=True)
        await until(lambda: _lines(caplog, "resumed after"), within=60, what="the worker resumes once there is room")

        async def logged() -> bool:
            infos = await store.runs_by_id(list(ancestry))
            return len(infos) == len(ancestry) and all(i.terminal for i in infos.values())

        await until(logged, within=60, what="every run ended in the replay log")
        assert metrics.get_sample_value("runwire_worker_paused", paused) is None
        assert (metrics.get_sample_value("runwire_worker_retried_total", paused) or 0) >= 1
        stop.set()
        stats = await worker
        await assert_delivered_exactly_once(bus, store, events, ancestry)
    assert stats.paused_seconds > 0
    assert stats.retried.get("store full", 0) >= 1
    assert stats.dead_lettered == 0
    assert len(_lines(caplog, "paused:")) == 1  # one line for the outage, however many retries
    assert len(_lines(caplog, "resumed after")) == 1
