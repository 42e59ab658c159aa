"""The SQLite replay log reports the error that stopped a write, not its own clean-up's.

When SQLite ends a transaction itself — the file can't grow (disk full), an
I/O error, a trigger's ``RAISE(ROLLBACK)`` — a ``ROLLBACK`` afterwards fails
with "no transaction is active"; raised in place of the first error, it tells
the operator nothing. Here the first error is real: the file is held to its
current size with ``PRAGMA max_page_count`` (exactly what a full disk does to
a write), or a trigger created through a second connection to the same file
ends the transaction. After the error the log works again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import pytest

from runwire.core import envelope
from runwire.core.errors import StoreError, StoreFull
from runwire.store import open_store
from runwire.store.base import ReplayLog
from runwire.store.sqlite.log import SQLiteLog
from tests.events import event
from tests.store.conftest import Clock

BIG = "x" * 40_000
"""A text no page the file already has can take."""


def _big(run_id: str, seq: int) -> list[envelope.Event]:
    return [event(run_id, s, "text.delta", {"text": BIG}) for s in range(seq, seq + 8)]


async def _full(log: SQLiteLog, full: bool) -> None:
    """Hold the file to the pages it has (``max_page_count`` is per connection: the log's own)."""
    def limit() -> None:
        pages = log._db.execute("PRAGMA page_count").fetchone()[0]
        log._db.execute(f"PRAGMA max_page_count = {pages if full else 1 << 30}")

    await log._call(limit)


WRITES: dict[str, Callable[[ReplayLog, int], Awaitable[object]]] = {
    "append": lambda log, seq: log.append(_big("r-full", seq)),
    "append_streams": lambda log, seq: log.append_streams(
        [("r-full", events, [envelope.encode(e) for e in events]) for events in [_big("r-full", seq)]]
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_full_disk_is_the_error_a_write_reports(tmp_path: Path, write: str) -> None:
    """A write the file has no room for raises "database or disk is full" — SQLite has already
    rolled the transaction back — and once there is room again the same write goes through."""
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as log:
        assert isinstance(log, SQLiteLog)
        await log.append([event("r-full", 1, "run.lifecycle", {"state": "running"})])
        await _full(log, True)
        with pytest.raises(StoreFull) as failed:  # a pause (retriable, reason "full"), not a failure
            await WRITES[write](log, 2)
        assert "database or disk is full" in str(failed.value)
        assert "no transaction is active" not in str(failed.value)
        await _full(log, False)
        await WRITES[write](log, 2)
        assert [e.seq for e in await log.read("r-full")] == list(range(1, 10))


OPERATIONS: dict[str, tuple[str, Callable[[ReplayLog], Awaitable[object]]]] = {
    "append": ("BEFORE INSERT ON segments", lambda log: log.append(_big("r-trig", 2))),
    "append_streams": ("BEFORE INSERT ON segments", lambda log: log.append_streams(
        [("r-trig", events, [envelope.encode(e) for e in events]) for events in [_big("r-trig", 2)]]
    )),
    "sweep": ("BEFORE DELETE ON runs", lambda log: log.sweep()),
    "claim_run": ("BEFORE INSERT ON run_owners", lambda log: log.claim_run("r-new", "acme", "r-new")),
    "stream_reserve": ("BEFORE UPDATE ON ds_streams", lambda log: log.stream_reserve(
        "r-ds", None, 1, close=False, hold_s=5
    )),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_an_error_that_ended_the_transaction_reaches_the_caller(
    tmp_path: Path, clock: Clock, operation: str
) -> None:
    """Each of the log's write transactions, failed by a trigger's ``RAISE(ROLLBACK, …)``: the
    caller reads the trigger's message, and the log keeps working."""
    path = tmp_path / "replay.db"
    when, call = OPERATIONS[operation]
    async with open_store(f"sqlite:///{path}", clock=clock) as log:
        await log.append([event("r-trig", 1, "run.lifecycle", {"state": "done"})])
        assert await log.stream_create("r-ds")
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute(f"CREATE TRIGGER fail {when} BEGIN SELECT RAISE(ROLLBACK, 'injected failure'); END")
        clock.advance(days=3650)  # every run has expired, so a sweep deletes
        with pytest.raises(StoreError) as failed:
            await call(log)
        assert "injected failure" in str(failed.value)
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("DROP TRIGGER fail")
        await call(log)  # the same operation, without the trigger


async def test_a_chunk_over_sqlites_value_limit_is_joined_in_python(tmp_path: Path) -> None:
    """An export or read whose joined bytes exceed SQLite's largest value (``SQLITE_LIMIT_LENGTH``,
    per connection: the log's own) still returns exactly the events asked for, in order."""
    stored = [event("r-big", seq) for seq in range(1, 61)]
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as log:
        assert isinstance(log, SQLiteLog)
        for start in range(0, 60, 6):  # writes of 6 events: segments well under the limit
            await log.append(stored[start:start + 6])
        lengths = [len(envelope.encode(e)) for e in stored]
        await log._call(lambda: log._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, sum(lengths[:20])))
        chunks = [chunk async for chunk in log.iter_jsonl("r-big", after=3, batch=40)]
        middle = await log.read("r-big", after=8, limit=30)
    assert [count for _, count in chunks] == [40, 17]
    assert b"".join(lines for lines, _ in chunks).splitlines() == [envelope.encode(e) for e in stored[3:]]
    assert middle == stored[8:38]
