"""The SQLite replay log's tables and the migrations from every older schema version."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..outbox import SQLITE, ddl
from .connection import transaction

SCHEMA_VERSION = 8

_SEGMENTS = """
CREATE TABLE IF NOT EXISTS segments (
    run_id    TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq  INTEGER NOT NULL,
    body      BLOB NOT NULL
);
"""
"""A run's events as segments: the events ``first_seq`` … ``last_seq``, every seq
of that range exactly once, their canonical JSON joined by ``\\n`` in seq order.

A run's segments never overlap, so ordered by ``last_seq`` (the index
``(run_id, last_seq, first_seq)``, which also gives their spans without
reading them) they are in seq order, and an event's line within its
segment is ``seq - first_seq``. A worker's write stores one segment per
run it touches (~23 events each in ``bench/workers.py``): one row and one
index entry instead of one per event took the SQLite thread's CPU per
published event from ~6 to ~3.5 µs (docs/workers.md § Throughput). A
segment holds at most :data:`SEGMENT_EVENTS` events, so a read from any
seq loads little more than it returns.

Schemas 2–4 kept one row per event (:data:`_EVENTS_V4`); schema 1 the
same clustered by ``(run_id, seq)``, ~40 % dearer to write than rows in
arrival order."""

_EVENTS_V4 = """
CREATE TABLE IF NOT EXISTS {name} (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    body   BLOB NOT NULL
);
"""
"""The events table of schemas 2–4 (one row per event), for the migrations."""

SEGMENT_EVENTS = 512
"""The most events one segment holds (a longer write is cut into several)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
""" + _SEGMENTS + """
CREATE INDEX IF NOT EXISTS segments_run_last ON segments (run_id, last_seq, first_seq);
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    tenant        TEXT,
    parent_id     TEXT,
    root_id       TEXT,
    thread_id     TEXT,
    state         TEXT,
    state_seq     INTEGER NOT NULL DEFAULT 0,
    terminal      INTEGER NOT NULL DEFAULT 0,
    events        INTEGER NOT NULL DEFAULT 0,
    last_seq      INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    dropped       INTEGER NOT NULL DEFAULT 0,
    first_ts      TEXT,
    last_ts       TEXT,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    expires_at    REAL,
    checkpoint    BLOB
);
CREATE INDEX IF NOT EXISTS runs_tenant_updated ON runs (tenant, updated_at);
CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated_at);
CREATE TABLE IF NOT EXISTS run_owners (
    run_id     TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    root_id    TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_thread ON runs (thread_id, updated_at) WHERE thread_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS ds_streams (
    run_id     TEXT PRIMARY KEY,
    next_seq   INTEGER NOT NULL DEFAULT 0,
    closed     INTEGER NOT NULL DEFAULT 0,
    busy_until REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ds_producers (
    run_id      TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    last_base   INTEGER NOT NULL,
    last_digest TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, producer_id)
);
CREATE TABLE IF NOT EXISTS forks (
    run_id     TEXT PRIMARY KEY,
    source_id  TEXT NOT NULL,
    at_seq     INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS forks_source ON forks (source_id);
CREATE TABLE IF NOT EXISTS span_exports (
    root_id    TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL DEFAULT 0,
    holder     TEXT NOT NULL,
    held_until REAL NOT NULL
);
""" + ddl(SQLITE)
"""``span_exports`` (the span exporter's cursor and hold per root run) is a table of its own that
no older code reads: made by every open (``IF NOT EXISTS``), it needs no schema version."""


def _from_1(conn: sqlite3.Connection) -> None:
    """Schema 1 → 2: the events move from the clustered table to a rowid table + index
    (it needs free disk for a second copy of the events)."""
    conn.execute(_EVENTS_V4.format(name="events_v2"))
    conn.execute("INSERT INTO events_v2 (run_id, seq, body)"
                 " SELECT run_id, seq, body FROM events ORDER BY run_id, seq")
    conn.execute("DROP TABLE events")
    conn.execute("ALTER TABLE events_v2 RENAME TO events")
    conn.execute("CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq)")


def _from_2(conn: sqlite3.Connection) -> None:
    """Schema 2 → 3: runs gain ``thread_id`` (NULL for the runs stored before)."""
    conn.execute("ALTER TABLE runs ADD COLUMN thread_id TEXT")


def _from_3(conn: sqlite3.Connection) -> None:
    """Schema 3 → 4: Durable Streams producers remember their last batch's digest."""
    columns = [row[1] for row in conn.execute("PRAGMA table_info(ds_producers)")]
    if columns and "last_digest" not in columns:  # a file from before the table is made whole later
        conn.execute("ALTER TABLE ds_producers ADD COLUMN last_digest TEXT NOT NULL DEFAULT ''")


def _from_4(conn: sqlite3.Connection) -> None:
    """Schema 4 → 5: the events move from one row each to segments (each stored event one;
    later writes add segments of many events, and the one-event ones read back as before)."""
    conn.execute(_SEGMENTS)
    conn.execute("INSERT INTO segments (run_id, first_seq, last_seq, body)"
                 " SELECT run_id, seq, seq, body FROM events ORDER BY run_id, seq")
    conn.execute("DROP TABLE events")


def _from_5(conn: sqlite3.Connection) -> None:
    """Schema 5 → 6: runs keep their raw stream's checkpoint of record (NULL for the runs
    stored before, which a worker that lost the bus's checkpoint then starts as before)."""
    if "checkpoint" not in [row[1] for row in conn.execute("PRAGMA table_info(runs)")]:
        conn.execute("ALTER TABLE runs ADD COLUMN checkpoint BLOB")


def _from_6(conn: sqlite3.Connection) -> None:
    """Schema 6 → 7: the outbox's tables (run notices, webhooks, deliveries: ``outbox.py``)."""
    for statement in ddl(SQLITE).split(";"):
        if statement.strip():
            conn.execute(statement)


def _from_7(conn: sqlite3.Connection) -> None:
    """Schema 7 → 8: webhooks keep the headers their deliveries carry (an A2A push config's token
    and authentication)."""
    if "headers" not in [row[1] for row in conn.execute("PRAGMA table_info(webhooks)")]:
        conn.execute("ALTER TABLE webhooks ADD COLUMN headers TEXT NOT NULL DEFAULT '{}'")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _from_1, 2: _from_2, 3: _from_3, 4: _from_4, 5: _from_5, 6: _from_6, 7: _from_7}
"""The step from each old schema version to the next."""


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """From ``version`` to ``SCHEMA_VERSION``, a transaction a step; a process that opened the
    file at the same time finds a step done and goes on from there."""
    for step in range(version, SCHEMA_VERSION):
        with transaction(conn):
            if conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] != step:
                continue  # another process migrated it meanwhile
            MIGRATIONS[step](conn)
            conn.execute("UPDATE schema_version SET version = ?", (step + 1,))
