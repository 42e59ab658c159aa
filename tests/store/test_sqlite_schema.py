"""The embedded replay log's on-disk schema: a file written by an older runwire opens."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pipeline import envelope
from pipeline.store import open_store
from tests.store.conftest import event

SCHEMA_1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, tenant TEXT, parent_id TEXT, root_id TEXT, state TEXT,
    state_seq INTEGER NOT NULL DEFAULT 0, terminal INTEGER NOT NULL DEFAULT 0,
    events INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0, first_ts TEXT, last_ts TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL
);
INSERT INTO schema_version VALUES (1);
"""


async def test_a_schema_1_file_is_migrated_and_keeps_every_event(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = [event("r1", seq) for seq in (1, 2, 3)] + [event("r2", 1)]
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_1)
    conn.executemany("INSERT INTO events VALUES (?, ?, ?)",
                     [(e.run_id, e.seq, envelope.encode(e)) for e in old])
    conn.execute("INSERT INTO runs (run_id, events, last_seq, created_at, updated_at)"
                 " VALUES ('r1', 3, 3, 0, 0)")
    conn.commit()
    conn.close()

    async with open_store(f"sqlite:///{path}") as log:
        assert await log.read("r1") == old[:3]
        assert await log.append([old[2], event("r1", 4)]) == 1  # still idempotent on (run, seq)
        assert [e.seq for e in await log.read("r1", after=2)] == [3, 4]
        info = await log.run("r1")
    assert info is not None and info.events == 4
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (2,)
        ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        assert "WITHOUT ROWID" not in ddl
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (5,)
    finally:
        conn.close()
