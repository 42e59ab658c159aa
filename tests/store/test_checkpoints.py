"""The replay log as the checkpoint of record: each run keeps the raw stream's checkpoint of the
worker write that logged its newest events, never one of an earlier write, read only when asked
for (``logged_runs``); a database from before the column gains it when opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.store import open_store
from runwire.store.base import LogStream, RunInfo
from runwire.store.postgres.schema import SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION
from runwire.store.sqlite.schema import SCHEMA_VERSION
from tests.events import deltas, event


def _part(run_id: str, events: list[Event], checkpoint: bytes | None = None) -> LogStream:
    encoded = [envelope.encode(e) for e in events]
    return (run_id, events, encoded) if checkpoint is None else (run_id, events, encoded, checkpoint)


async def test_a_run_keeps_the_checkpoint_of_its_newest_write_never_an_earlier_ones(store_url: str) -> None:
    """A write's checkpoint replaces the run's when the write reaches the run's last seq or goes
    past it; a write filling a hole below it, a write of nothing new and a write without one
    leave it; other runs of the same write keep their own."""
    async with open_store(store_url) as log:
        assert await log.append_streams([_part("ra", deltas("ra", 1, 10), b"ra10"),
                                         _part("rb", deltas("rb", 1, 3), b"rb3"), _part("rc", deltas("rc", 1, 2))]) == 15
        first = await log.logged_runs(["ra", "rb", "rc", "nobody"])
        assert await log.append_streams([_part("ra", deltas("ra", 12, 14), b"ra14")]) == 3  # (a hole at 11)
        after_14 = (await log.logged_runs(["ra"]))["ra"].checkpoint
        assert await log.append_streams([_part("ra", deltas("ra", 11, 11), b"ra11")]) == 1  # fills the hole
        assert await log.append_streams([_part("ra", deltas("ra", 5, 14), b"redone")]) == 0  # nothing new
        assert await log.append_streams([_part("ra", deltas("ra", 15, 16))]) == 2  # no checkpoint
        after_16 = (await log.logged_runs(["ra"]))["ra"].checkpoint
        # a redone write, merged otherwise (out of order, part of it stored): its highest seq counts
        assert await log.append_streams([_part("ra", [event("ra", 17), event("ra", 18)], b"ra18")]) == 2
        assert await log.append_streams([_part("ra", [event("ra", 19), event("ra", 18)], b"ra19")]) == 1
        last = await log.logged_runs(["ra", "rb"])
        info = await log.run("ra")
        listed = await log.runs()
    assert {run_id: run.checkpoint for run_id, run in first.items()} == {"ra": b"ra10", "rb": b"rb3", "rc": None}
    assert (first["ra"].last_seq, first["ra"].events, first["rb"].last_seq) == (10, 10, 3)
    assert after_14 == b"ra14" and after_16 == b"ra14"
    assert (last["ra"].checkpoint, last["rb"].checkpoint, last["ra"].last_seq) == (b"ra19", b"rb3", 19)
    # the catalogue never carries the blob
    assert info is not None and type(info) is RunInfo and not hasattr(info, "checkpoint")
    assert all(type(run) is RunInfo for run in listed)


async def test_a_checkpoint_is_kept_only_where_the_write_reaches_the_runs_last_seq(store_url: str) -> None:
    """A write whose new events fill a hole while its last event is the run's last stored one
    reaches the run's last seq: its checkpoint is kept (equal moves it, below never does)."""
    async with open_store(store_url) as log:
        await log.append_streams([_part("r", [event("r", 1), event("r", 3)], b"r3")])
        assert await log.append_streams([_part("r", deltas("r", 1, 3), b"r3-again")]) == 1  # seq 2
        equal = (await log.logged_runs(["r"]))["r"].checkpoint
        await log.append([event("r", 4), event("r", 6)])  # an import: no checkpoint
        assert await log.append_streams([_part("r", [event("r", 5)], b"r5")]) == 1  # below 6
        below = (await log.logged_runs(["r"]))["r"]
    assert equal == b"r3-again"
    assert (below.checkpoint, below.last_seq) == (b"r3-again", 6)


async def test_a_schema_5_file_gains_the_checkpoint_column(tmp_path: Path) -> None:
    """A SQLite file from before checkpoints were logged opens: its runs have none (a worker that
    lost the bus's starts them as before) and the next write's is kept."""
    path = tmp_path / "v5.db"
    async with open_store(f"sqlite:///{path}") as log:  # today's schema, then made a schema-5 file
        await log.append_streams([_part("old", deltas("old", 1, 3))])
    conn = sqlite3.connect(path)
    conn.executescript("ALTER TABLE runs DROP COLUMN checkpoint; UPDATE schema_version SET version = 5;")
    conn.close()
    async with open_store(f"sqlite:///{path}") as log:
        before = await log.logged_runs(["old"])
        await log.append_streams([_part("old", deltas("old", 4, 5), b"old5"), _part("new", deltas("new", 1, 1), b"new1")])
        after = await log.logged_runs(["old", "new"])
        stored = await log.read("old")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        conn.close()
    assert before["old"].checkpoint is None and before["old"].last_seq == 3
    assert {run_id: run.checkpoint for run_id, run in after.items()} == {"old": b"old5", "new": b"new1"}
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]


async def test_a_postgres_schema_2_database_gains_the_checkpoint_column(postgres_schema: tuple[str, str]) -> None:
    """PostgreSQL schema 2 (no ``runs.checkpoint``) is migrated when opened, keeping its runs."""
    schema, url = postgres_schema
    async with open_store(url) as log:  # today's schema, then made a schema-2 database
        await log.append_streams([_part("old", deltas("old", 1, 3))])
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {schema}.runs DROP COLUMN checkpoint")
        conn.execute(f"UPDATE {schema}.runwire_schema SET version = 2")
    async with open_store(url) as log:
        before = await log.logged_runs(["old"])
        await log.append_streams([_part("old", deltas("old", 4, 5), b"old5")])
        after = await log.logged_runs(["old"])
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        version = conn.execute(f"SELECT max(version) FROM {schema}.runwire_schema").fetchone()
    assert before["old"].checkpoint is None
    assert (after["old"].checkpoint, after["old"].last_seq, after["old"].events) == (b"old5", 5, 5)
    assert version == (POSTGRES_SCHEMA_VERSION,)
