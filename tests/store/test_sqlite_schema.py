"""The replay logs' schemas: a SQLite file or a PostgreSQL database written by an older runwire opens."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from runwire.core import envelope
from runwire.store import RetentionPolicy, open_store
from runwire.store.outbox import Subscription
from runwire.store.postgres.schema import SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION
from runwire.store.sqlite.schema import SCHEMA_VERSION
from tests.events import T0, event
from tests.store.conftest import Clock

RUNS_BEFORE_3 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, tenant TEXT, parent_id TEXT, root_id TEXT, state TEXT,
    state_seq INTEGER NOT NULL DEFAULT 0, terminal INTEGER NOT NULL DEFAULT 0,
    events INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0, first_ts TEXT, last_ts TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL
);
"""
"""The runs table of schemas 1 and 2 (no ``thread_id``)."""

SCHEMA_1 = f"""
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
{RUNS_BEFORE_3}
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
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'events'").fetchone() is None
        assert conn.execute("SELECT sum(last_seq - first_seq + 1) FROM segments").fetchone() == (5,)
    finally:
        conn.close()


SCHEMA_2_RUNS = f"""
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL);
CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq);
{RUNS_BEFORE_3}
INSERT INTO schema_version VALUES (2);
"""


async def test_a_schema_2_file_gains_thread_ids_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    old = event("r1", 1)
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_2_RUNS)
    conn.execute("INSERT INTO events VALUES (?, ?, ?)", (old.run_id, old.seq, envelope.encode(old)))
    conn.execute("INSERT INTO runs (run_id, tenant, events, last_seq, created_at, updated_at)"
                 " VALUES ('r1', 'acme', 1, 1, 0, 0)")
    conn.commit()
    conn.close()

    async with open_store(f"sqlite:///{path}") as log:
        before = await log.run("r1")
        await log.append([event("r1", 2, thread_id="chat-1"), event("r2", 1, thread_id="chat-1")])
        after = await log.run("r1")
        listed = {r.run_id for r in await log.runs(thread_id="chat-1")}
    assert before is not None and (before.tenant, before.thread_id, before.events) == ("acme", None, 1)
    assert after is not None and (after.thread_id, after.events) == ("chat-1", 2)
    assert listed == {"r1", "r2"}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        conn.close()


async def test_a_postgres_schema_1_database_gains_thread_ids(postgres_schema: tuple[str, str]) -> None:
    """PostgreSQL schema 1 (no ``runs.thread_id``) is migrated when opened, keeping its runs."""
    schema, url = postgres_schema
    async with open_store(url) as log:  # today's schema, then made a schema-1 database
        await log.append([event("r1", 1)])
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {schema}.runs DROP COLUMN thread_id")
        conn.execute(f"UPDATE {schema}.runwire_schema SET version = 1")
    async with open_store(url) as log:
        await log.append([event("r1", 2, thread_id="chat-1")])
        info = await log.run("r1")
        listed = [r.run_id for r in await log.runs(thread_id="chat-1")]
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        version = conn.execute(f"SELECT max(version) FROM {schema}.runwire_schema").fetchone()
    assert info is not None and (info.events, info.thread_id) == (2, "chat-1")
    assert listed == ["r1"] and version == (POSTGRES_SCHEMA_VERSION,)


async def test_a_schema_3_file_keeps_its_producers_and_fences_by_digest(tmp_path: Path) -> None:
    """Schema 3 → 4: Durable Streams producers gain the digest of their last batch; a producer stored
    before it (no digest) still dedupes its retry, and the next batch is fenced by its bytes."""
    path = tmp_path / "v3.db"
    async with open_store(f"sqlite:///{path}") as log:
        await log.stream_create("s1")
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE ds_old AS SELECT run_id, producer_id, epoch, last_seq, last_base FROM ds_producers;
        DROP TABLE ds_producers;
        CREATE TABLE ds_producers (run_id TEXT NOT NULL, producer_id TEXT NOT NULL, epoch INTEGER NOT NULL,
            last_seq INTEGER NOT NULL, last_base INTEGER NOT NULL, PRIMARY KEY (run_id, producer_id));
        INSERT INTO ds_producers VALUES ('s1', 'p', 0, 0, 0);
        DROP TABLE segments;
        CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL);
        CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq);
        UPDATE ds_streams SET next_seq = 1 WHERE run_id = 's1';
        UPDATE schema_version SET version = 3;
    """)
    conn.commit()
    conn.close()
    async with open_store(f"sqlite:///{path}") as log:
        retry = await log.stream_reserve("s1", ("p", 0, 0), 1, close=False, hold_s=0, digest="aaa")
        nxt = await log.stream_reserve("s1", ("p", 0, 1), 1, close=False, hold_s=0, digest="bbb")
        changed = await log.stream_reserve("s1", ("p", 0, 1), 1, close=False, hold_s=0, digest="ccc")
        same = await log.stream_reserve("s1", ("p", 0, 1), 1, close=False, hold_s=0, digest="bbb")
    assert (retry.outcome, nxt.outcome, changed.outcome, same.outcome) == ("duplicate", "append", "conflict", "duplicate")


async def test_a_schema_4_file_keeps_every_event_and_stays_idempotent(tmp_path: Path) -> None:
    """Schema 4 → 5: one row per event becomes one segment per event; reads, exports, retries
    and new writes (segments of many events) behave as on a new file."""
    path = tmp_path / "v4.db"
    old = [event("r1", seq) for seq in (1, 2, 3, 5)] + [event("r2", 1)]
    async with open_store(f"sqlite:///{path}"):  # today's schema, then made a schema-4 file
        pass
    conn = sqlite3.connect(path)
    conn.executescript("""
        DROP TABLE segments;
        CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL);
        CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq);
        UPDATE schema_version SET version = 4;
    """)
    conn.executemany("INSERT INTO events VALUES (?, ?, ?)",
                     [(e.run_id, e.seq, envelope.encode(e)) for e in old])
    conn.execute("INSERT INTO runs (run_id, events, last_seq, created_at, updated_at)"
                 " VALUES ('r1', 4, 5, 0, 0), ('r2', 1, 1, 0, 0)")
    conn.commit()
    conn.close()

    fresh = [event("r1", seq) for seq in range(3, 9)]
    async with open_store(f"sqlite:///{path}") as log:
        assert await log.read("r1", after=1, limit=2) == old[1:3]
        assert await log.append_encoded([(e, envelope.encode(e)) for e in fresh]) == 4  # 4, 6, 7, 8
        stored = await log.read("r1")
        exported = b"".join([lines async for lines, _ in log.iter_jsonl("r1", after=2, batch=4)])
        first = await log.first_seq("r2")
        swept = await log.sweep(now=T0 + timedelta(days=400))
    assert [e.seq for e in stored] == list(range(1, 9))
    assert stored[4] == old[3]  # seq 5 kept as it was stored, not as appended again
    assert exported.splitlines() == [envelope.encode(e) for e in stored[2:]]
    assert first == 1 and swept.events == 9
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT count(*) FROM segments").fetchone() == (0,)
    finally:
        conn.close()


async def test_the_runs_table_keeps_each_runs_expiry(tmp_path: Path) -> None:
    """``runs.expires_at`` in the file is the expiry the log reports: the default policy's for a new
    run and after a state change, a tenant's own policy for its runs."""
    path = tmp_path / "expiry.db"
    clock = Clock()
    short = RetentionPolicy(done=timedelta(days=7))
    async with open_store(f"sqlite:///{path}", clock=clock, tenant_retention={"short": short}) as log:
        await log.append([event("a", 1, "run.lifecycle", {"state": "running"}),
                          event("b", 1, "run.lifecycle", {"state": "done"}, tenant="short")])
        clock.advance(hours=1)
        await log.append([event("a", 2, "run.lifecycle", {"state": "done"}),
                          event("c", 1, "run.lifecycle", {"state": "error"})])
        reported = {run_id: info.expires_at for run_id in "abc" if (info := await log.run(run_id))}
    conn = sqlite3.connect(path)
    try:
        stored = {run_id: datetime.fromtimestamp(at, UTC)
                  for run_id, at in conn.execute("SELECT run_id, expires_at FROM runs")}
    finally:
        conn.close()
    hour = timedelta(hours=1)
    assert stored == reported == {"a": T0 + hour + timedelta(days=90), "b": T0 + timedelta(days=7),
                                  "c": T0 + hour + timedelta(days=30)}


def _webhook(webhook_id: str, headers: dict[str, str] | None = None) -> Subscription:
    return Subscription(id=webhook_id, tenant="A", url="https://example.com/hook", events=["run.finished"],
                        secret="whsec_x", created_at=1.0, headers=headers or {})


async def test_a_schema_7_file_keeps_its_webhooks_and_gains_their_headers(tmp_path: Path) -> None:
    """Schema 7 → 8: webhooks gain ``headers`` (none for the ones stored before); new ones keep theirs."""
    path = tmp_path / "v7.db"
    async with open_store(f"sqlite:///{path}") as log:  # today's schema, then made a schema-7 file
        await log.outbox().add_webhook(_webhook("wh_old"))
    conn = sqlite3.connect(path)
    conn.executescript("ALTER TABLE webhooks DROP COLUMN headers; UPDATE schema_version SET version = 7;")
    conn.close()
    async with open_store(f"sqlite:///{path}") as log:
        await log.outbox().add_webhook(_webhook("a2a_new", {"Authorization": "Bearer s"}))
        found = {sub.id: sub.headers for sub in await log.outbox().webhooks("A")}
    assert found == {"wh_old": {}, "a2a_new": {"Authorization": "Bearer s"}}


async def test_a_postgres_schema_4_database_gains_webhook_headers(postgres_schema: tuple[str, str]) -> None:
    schema, url = postgres_schema
    async with open_store(url) as log:  # today's schema, then made a schema-4 database
        await log.outbox().add_webhook(_webhook("wh_old"))
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {schema}.webhooks DROP COLUMN headers; UPDATE {schema}.runwire_schema SET version = 4")
    async with open_store(url) as log:
        await log.outbox().add_webhook(_webhook("a2a_new", {"Authorization": "Bearer s"}))
        found = {sub.id: sub.headers for sub in await log.outbox().webhooks("A")}
    assert found == {"wh_old": {}, "a2a_new": {"Authorization": "Bearer s"}}
