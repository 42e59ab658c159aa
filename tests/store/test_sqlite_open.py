"""Opening one SQLite replay log from several processes at once (a worker and an edge
starting together on a fresh file): every opener waits its turn, none fails."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

from runwire.store import open_store
from runwire.store.sqlite.log import SQLiteLog
from runwire.store.sqlite.schema import SCHEMA_VERSION
from tests.events import event

OPENERS = 16


def _open_when_told(path: str, go: EventType, results: multiprocessing.Queue[str]) -> None:
    async def open_append_close() -> None:
        log = SQLiteLog(f"sqlite:///{path}")
        await log.connect()
        try:
            await log.ping()
        finally:
            await log.close()

    go.wait()
    try:
        asyncio.run(open_append_close())
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def test_many_processes_open_one_fresh_file_at_once_and_none_fails(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")  # quick to start, so the openers really race
    for round_ in range(2):
        path = str(tmp_path / f"fresh-{round_}.db")
        go = context.Event()
        results: multiprocessing.Queue[str] = context.Queue()
        openers = [context.Process(target=_open_when_told, args=(path, go, results))
                   for _ in range(OPENERS)]
        for opener in openers:
            opener.start()
        go.set()  # all of them open the new file at the same instant
        outcomes = [results.get(timeout=60) for _ in openers]
        for opener in openers:
            opener.join(timeout=60)
        assert outcomes == ["ok"] * OPENERS
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        finally:
            conn.close()


async def test_opening_waits_while_another_connection_writes_the_new_file(tmp_path: Path) -> None:
    """The switch to WAL needs the file to itself; SQLite refuses it at once (no busy wait)
    while another connection holds a write lock in rollback mode, as a peer creating the
    schema does. The opener waits for the lock and then opens, whatever the peer's pace."""
    path = tmp_path / "fresh.db"
    peer = sqlite3.connect(path, isolation_level=None)
    peer.execute("BEGIN IMMEDIATE")
    peer.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    log = SQLiteLog(f"sqlite:///{path}")
    opening = asyncio.create_task(log.connect())
    try:
        done, _ = await asyncio.wait([opening], timeout=0.3)
        assert not done, "the opener gave up while the peer held its lock"
    finally:
        peer.execute("COMMIT")
        peer.close()
    await opening
    try:
        assert await log.append([event("r1", 1)]) == 1
    finally:
        await log.close()
    async with open_store(f"sqlite:///{path}") as again:
        assert [e.seq for e in await again.read("r1")] == [1]
