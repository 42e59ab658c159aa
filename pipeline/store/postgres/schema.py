"""The PostgreSQL replay log's tables, made or migrated when a process connects."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from ...core.errors import StoreError
from ..outbox import POSTGRES, ddl

SCHEMA_VERSION = 5
SCHEMA = """
CREATE TABLE IF NOT EXISTS runwire_schema (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id       text NOT NULL,
    run_id   text NOT NULL,
    tenant   text,
    child_id text,
    seq      bigint NOT NULL,
    type     text NOT NULL,
    ts       timestamptz NOT NULL,
    payload  jsonb NOT NULL,
    body     bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS events_tenant_ts ON events (tenant, ts);
CREATE TABLE IF NOT EXISTS runs (
    run_id        text PRIMARY KEY,
    tenant        text,
    parent_id     text,
    root_id       text,
    state         text,
    state_seq     bigint NOT NULL DEFAULT 0,
    terminal      boolean NOT NULL DEFAULT false,
    events        bigint NOT NULL DEFAULT 0,
    last_seq      bigint NOT NULL DEFAULT 0,
    input_tokens  bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    dropped       bigint NOT NULL DEFAULT 0,
    first_ts      text,
    last_ts       text,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    expires_at    timestamptz
);
CREATE INDEX IF NOT EXISTS runs_tenant_updated ON runs (tenant, updated_at);
CREATE INDEX IF NOT EXISTS runs_updated ON runs (updated_at);
CREATE TABLE IF NOT EXISTS run_owners (
    run_id     text PRIMARY KEY,
    tenant     text NOT NULL,
    root_id    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS thread_id text;
CREATE TABLE IF NOT EXISTS ds_streams (
    run_id     text PRIMARY KEY,
    next_seq   bigint NOT NULL DEFAULT 0,
    closed     boolean NOT NULL DEFAULT false,
    busy_until double precision NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ds_producers (
    run_id      text NOT NULL,
    producer_id text NOT NULL,
    epoch       bigint NOT NULL,
    last_seq    bigint NOT NULL,
    last_base   bigint NOT NULL,
    last_digest text NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, producer_id)
);
ALTER TABLE ds_producers ADD COLUMN IF NOT EXISTS last_digest text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS runs_thread ON runs (thread_id, updated_at) WHERE thread_id IS NOT NULL;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS checkpoint bytea;
CREATE TABLE IF NOT EXISTS forks (
    run_id     text PRIMARY KEY,
    source_id  text NOT NULL,
    at_seq     bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS forks_source ON forks (source_id);
CREATE TABLE IF NOT EXISTS span_exports (
    root_id    text PRIMARY KEY,
    seq        bigint NOT NULL DEFAULT 0,
    holder     text NOT NULL,
    held_until double precision NOT NULL
);
""" + ddl(POSTGRES) + """
ALTER TABLE webhooks ADD COLUMN IF NOT EXISTS headers text NOT NULL DEFAULT '{}';
"""
"""Schema 2 added ``runs.thread_id``, schema 3 ``runs.checkpoint`` (the raw stream's checkpoint of
record), schema 4 the outbox's tables (``outbox.py``), schema 5 ``webhooks.headers``: ``ADD COLUMN IF NOT EXISTS`` and ``CREATE …
IF NOT EXISTS`` migrate an older database. The ``forks`` table (a run's fork records,
:meth:`ReplayLog.record_fork`) is created the same way on a database without one: older code
ignores it."""


_CREATES = re.compile(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS (\w+)")
_ADDS = re.compile(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+)")
STATEMENTS = [statement.strip() for statement in SCHEMA.split(";") if statement.strip()]
""":data:`SCHEMA` one statement at a time (none holds a ``;`` of its own)."""
_PRESENT = """
SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL"""
_COLUMNS = """
SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.oid IN (SELECT to_regclass(name) FROM unnest(%s::text[]) AS name) AND NOT a.attisdropped"""


async def missing_statements(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """The statements of :data:`SCHEMA` whose table, index or column is not there yet, in order.

    ``CREATE INDEX IF NOT EXISTS`` and ``ALTER TABLE … ADD COLUMN IF NOT EXISTS`` lock their
    table before they find there is nothing to do (a share lock, an exclusive one). Run on a
    database other processes are writing to, they waited behind those writers' transactions
    while holding the locks of the statements before them, and PostgreSQL broke the deadlock
    by failing one side: a worker starting beside running ones exited. What is there already
    is left alone, so a process that finds its schema made takes no lock on a table.
    """
    names = [found.group(1) for statement in STATEMENTS if (found := _CREATES.match(statement))]
    adds = [found.groups() for statement in STATEMENTS if (found := _ADDS.match(statement))]
    present = {row[0] for row in await (await conn.execute(_PRESENT, (names,))).fetchall()}
    tables = sorted({table for table, _ in adds})
    columns = {(row[0], row[1]) for row in await (await conn.execute(_COLUMNS, (tables,))).fetchall()}
    missing: list[str] = []
    for statement in STATEMENTS:
        created, added = _CREATES.match(statement), _ADDS.match(statement)
        if (created and created.group(1) in present) or (added and added.groups() in columns):
            continue
        missing.append(statement)
    return missing


async def migrate(conn: psycopg.AsyncConnection[Any]) -> None:
    """The tables made or brought to :data:`SCHEMA_VERSION`, under an advisory lock (one
    process at a time), with only the statements still needed (:func:`missing_statements`);
    a database of a newer schema is refused."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(7426105)")
        for statement in await missing_statements(conn):
            await conn.execute(statement)
        row = await (await conn.execute("SELECT max(version) FROM runwire_schema")).fetchone()
        version = row[0] if row else None
        if version is None:
            await conn.execute(
                "INSERT INTO runwire_schema VALUES (%s)", (SCHEMA_VERSION,)
            )
        elif version > SCHEMA_VERSION:
            raise StoreError(f"database has schema {version}, newer than {SCHEMA_VERSION}")
        elif version < SCHEMA_VERSION:
            await conn.execute("UPDATE runwire_schema SET version = %s", (SCHEMA_VERSION,))
