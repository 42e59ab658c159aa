"""Opening a PostgreSQL replay log that other processes are writing to."""

from __future__ import annotations

import asyncio

import psycopg

from runwire.store import open_store
from runwire.store.postgres.schema import STATEMENTS, missing_statements
from tests.events import deltas
from tests.store.test_checkpoints import _part

WRITTEN = ("events", "runs", "ds_producers", "run_notices", "webhooks", "deliveries", "forks")
"""The tables whose schema statements lock them when run (an index on them, or a column added)."""


async def test_a_process_opening_a_made_log_waits_for_no_writer(postgres_schema: tuple[str, str]) -> None:
    """A worker starting beside running ones: while another process's transaction writes to every
    table (row-exclusive locks held, not committed), the log opens, reads and writes. Before, the
    schema's ``CREATE INDEX IF NOT EXISTS`` and ``ADD COLUMN IF NOT EXISTS`` locked those tables
    even with nothing to do, queued behind such writers, and PostgreSQL broke the deadlock that
    followed by failing one side (a worker exited at its start)."""
    _, url = postgres_schema
    async with open_store(url) as log:  # makes the schema
        await log.append_streams([_part("before", deltas("before", 1, 3))])
    async with await psycopg.AsyncConnection.connect(url) as writer, writer.transaction():
        await writer.execute(f"LOCK TABLE {', '.join(WRITTEN)} IN ROW EXCLUSIVE MODE")
        async with asyncio.timeout(60):  # (before: for as long as the writer's transaction)
            async with open_store(url) as log:
                assert [e.seq for e in await log.read("before")] == [1, 2, 3]
                await log.append_streams([_part("after", deltas("after", 1, 2))])
            assert await missing_statements(writer) == []


async def test_a_database_missing_an_index_and_a_column_gets_just_those(
    postgres_schema: tuple[str, str],
) -> None:
    """What is missing is made when the log opens (here an index and a column dropped), and only
    that: every other statement of the schema is left out."""
    schema, url = postgres_schema
    async with open_store(url):
        pass
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"DROP INDEX {schema}.runs_updated")
        conn.execute(f"ALTER TABLE {schema}.webhooks DROP COLUMN headers")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        missing = await missing_statements(conn)
    assert missing == [
        next(s for s in STATEMENTS if s.startswith("CREATE INDEX IF NOT EXISTS runs_updated ")),
        next(s for s in STATEMENTS if s.startswith("ALTER TABLE webhooks ADD COLUMN IF NOT EXISTS headers ")),
    ]
    assert len(STATEMENTS) > 20
    async with open_store(url):
        pass
    async with await psycopg.AsyncConnection.connect(url) as conn:
        assert await missing_statements(conn) == []
