"""At the limit, pause: the SQLite replay log's filesystem full.

The log lives on a tmpfs of a few MiB the test mounts (a real filesystem at its real limit:
SQLite answers "database or disk is full"). The worker pauses without acking what it could not
log — one ``paused:`` line, the outage counted —, never exits, and the file is not corrupt; once
the filesystem has room again (remounted larger) everything drains exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwire.bus import open_bus
from runwire.store import open_store
from runwire.workers.runtime import run_worker
from tests.services import RedisServer, fill_filesystem
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, run_tree

HINT = "mounting a tmpfs needs root (or CAP_SYS_ADMIN): run the tests as root, as .ci/run does"


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 1 MiB at a directory of the test's own; remountable larger."""
    where = tmp_path / "tiny"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"{HINT}: {mounted.stderr.strip()}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_full_disk_pauses_the_worker_and_everything_drains_once_after(
    own_redis: RedisServer, tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    prefix = f"f{uuid.uuid4().hex[:8]}"
    events, ancestry = run_tree(prefix, deltas=400)
    url = f"{own_redis.url}?shards=2&prefix=full"
    db = tiny_fs / "replay.db"
    async with open_bus(url) as bus, open_store(f"sqlite:///{db}") as store:
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(bus, store, group="g", name="w1", stop=stop))
        fill_filesystem(tiny_fs / "filler", leave=32 * 1024)
        await bus.publish(events)
        await until(lambda: any("paused: store full" in r.getMessage() and "disk is full" in r.getMessage()
                                for r in caplog.records), within=30, what="the worker pauses: disk full")
        pauses = [r for r in caplog.records if "paused:" in r.getMessage()]
        assert not worker.done()
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,size=64m", "tmpfs", str(tiny_fs)],
                                check=True)
        await until(lambda: any("resumed after" in r.getMessage() for r in caplog.records), within=30,
                    what="the worker resumes once there is room")

        async def logged() -> bool:
            infos = await store.runs_by_id(list(ancestry))
            return len(infos) == len(ancestry) and all(i.terminal for i in infos.values())

        await until(logged, within=60, what="every run in the log")
        stop.set()
        stats = await worker
        await assert_delivered_exactly_once(bus, store, events, ancestry)
    assert stats.paused_seconds > 0
    assert stats.retried.get("store full", 0) >= 1
    assert len(pauses) == 1  # one line for the outage, however many retries
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
