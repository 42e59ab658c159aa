"""The embedded replay log: one SQLite file (WAL mode), the default store.

``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or
``sqlite://:memory:``; retention parameters as in :mod:`.retention`.

All SQLite work runs on one dedicated thread with one connection: SQLite
allows a single writer anyway, and one thread keeps the connection's state
simple. The stdlib ``sqlite3`` module is used directly: aiosqlite does the
same thing (one thread per connection, calls queued to it) behind another
dependency, and the per-call hop is paid once per batch of 5 000–20 000 rows,
so it does not show in the figures (``bench/replay.py``). The events are
stored as *segments* (:data:`_SEGMENTS`): one row per run per write, holding
the canonical JSON bytes of consecutive seqs joined by newlines, so export
streams them without re-encoding and a worker's write costs one row per run
it touches, not one per event.

Longer than ~400 lines: one backend — schema, migrations, the writer thread's
batched statements and the queries — whose parts share the connection's
thread and locks; what it shares with PostgreSQL is in ``runmeta.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import attrgetter, eq, lt
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..core import envelope
from ..core.envelope import Event
from ..core.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from ..core.lines import join_lines
from .base import (
    ForkPoint,
    LoggedRun,
    LogStream,
    ReplayLog,
    RunInfo,
    RunOwner,
    SweepResult,
    stream_checkpoint,
)
from .outbox import INSERT_NOTICE, SQLITE, Outbox, ddl, notice_rows
from .producers import ProducerState, Reservation, reserve
from .retention import RetentionPolicy
from .runmeta import (
    RUN_COLUMNS,
    STATE_AFTER_MERGE,
    RunDelta,
    logged_run,
    run_info,
    summarize_run,
    upsert_run_sql,
    with_checkpoint,
)

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

_SCHEMA = """
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

BUSY_TIMEOUT_S = 10.0
"""How long a statement waits for another connection's lock (opening included) before
"database is locked" (``StoreUnavailable``)."""
_ROWS_PER_STATEMENT = 500
"""Rows per multi-row statement (an upsert of runs: 8 000 parameters, under SQLite's 32 766)."""
_IDS_PER_QUERY = 1000
"""Run ids per ``IN (…)`` lookup (under SQLite's 32 766 parameters)."""
_INSERT_SEGMENTS = "INSERT INTO segments (run_id, first_seq, last_seq, body) VALUES "
_STORED_PAST = (
    "SELECT 1 FROM json_each(?) AS start WHERE EXISTS (SELECT 1 FROM segments"
    " WHERE run_id = json_extract(start.value, '$[0]') AND last_seq >= json_extract(start.value, '$[1]'))"
    " LIMIT 1"
)
"""A row when a run of ``[[run_id, first_seq], …]`` has a stored event at or past ``first_seq``
(one index probe per run)."""


@functools.lru_cache(maxsize=128)
def _rows_sql(head: str, width: int, rows: int, tail: str) -> str:
    row = "(" + ",".join(["?"] * width) + ")"
    return head + ",".join([row] * rows) + tail


def _execute_rows(
    db: sqlite3.Connection, head: str, width: int, params: list[Any], tail: str = ""
) -> None:
    """Run ``head VALUES-rows tail`` for rows given as one flat list of ``width`` values each.

    Multi-row statements rather than ``executemany``: the sqlite3 module
    releases the GIL around every ``sqlite3_step``, once per row with
    ``executemany``, and on this writer thread each of those re-acquisitions
    waits for the event loop's thread to let go of the GIL (up to the
    switch interval when it is busy). Measured with a CPU-bound main thread
    (100 k rows over ~600 runs, WAL, 16 KiB pages): ``executemany`` took
    76–660 µs a row instead of 5–6 µs alone; 500-row statements took ~19 µs
    a row while the main thread kept ~88 % of its speed.
    """
    most = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width  # 999 before SQLite 3.32
    step = width * min(_ROWS_PER_STATEMENT, most)
    for start in range(0, len(params), step):
        chunk = params[start : start + step]
        db.execute(_rows_sql(head, width, len(chunk) // width, tail), chunk)


@functools.lru_cache(maxsize=16)
def _upsert_runs(keep: tuple[float, float, float]) -> tuple[str, str]:
    """The run upsert around its VALUES rows, for :func:`_execute_rows` (19 values a row),
    setting ``expires_at`` as :meth:`ReplayLog.expiry` computes it with these keep times
    (seconds: done, aborted/error, unfinished) in the same statement."""
    done, failed, unfinished = (repr(float(seconds)) for seconds in keep)
    expires = (f"max(runs.updated_at, excluded.updated_at) + CASE {STATE_AFTER_MERGE} WHEN 'done' THEN {done}"
               f" WHEN 'aborted' THEN {failed} WHEN 'error' THEN {failed} ELSE {unfinished} END")
    statement = upsert_run_sql("?", "max", expires).rsplit("RETURNING", 1)[0]
    head, tail = statement.replace("VALUES (" + ", ".join(["?"] * 19) + ")", "VALUES {rows}").split("{rows}")
    return head, tail


_SET_EXPIRY = """
UPDATE runs SET expires_at = updated_at + CASE
        WHEN state = 'done' THEN ?
        WHEN state IN ('aborted', 'error') THEN ?
        ELSE ? END
WHERE run_id IN (SELECT value FROM json_each(?))"""
"""Expiry as :meth:`ReplayLog.expiry` computes it, for one tenant's runs among those touched."""


def _keep_seconds(policy: RetentionPolicy) -> tuple[float, float, float]:
    return (policy.keep_for("done").total_seconds(), policy.keep_for("error").total_seconds(),
            policy.keep_for(None).total_seconds())


T = TypeVar("T")
_seq = attrgetter("seq")
_ids_json = msgspec.json.Encoder()


_ALL = 2**63 - 1
"""A limit of "every event" (SQLite's largest integer)."""
_SPANS_AFTER = "SELECT first_seq, last_seq FROM segments WHERE run_id = ? AND last_seq > ? ORDER BY last_seq"
"""The spans of a run's segments holding events after a seq, in seq order (from the index alone)."""
_SEGMENTS_OF_CHUNK = (
    "SELECT first_seq, last_seq, body FROM segments WHERE run_id = ?1 AND last_seq > ?2 AND last_seq <= ?3"
    " ORDER BY last_seq"
)
"""The segments of run ``?1`` holding events after seq ``?2``, up to the one ending at ``?3``."""
_ORDERED_CONCAT = sqlite3.sqlite_version_info >= (3, 44, 0)
_JOINED = (
    "SELECT CAST(group_concat(body, x'0a'{order}) AS BLOB), min(first_seq), max(last_seq),"
    " sum(last_seq - first_seq + 1) FROM ({segments})"
).format(order=" ORDER BY last_seq" if _ORDERED_CONCAT else "", segments=_SEGMENTS_OF_CHUNK)
""":data:`_SEGMENTS_OF_CHUNK` joined into one value: ``(lines, first_seq of the first,
last_seq of the last, their events)``. Before SQLite 3.44 (no ORDER BY inside
aggregates) the concatenation follows the ordered subquery, which SQLite runs
as a co-routine feeding the aggregate row by row in seq order; the export test
checks the order."""
_EVENTS_OF_RUNS = (
    "SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM segments"
    " WHERE run_id IN (SELECT value FROM json_each(?))"
)
"""How many events the runs of a JSON list of ids hold (what a sweep deletes)."""
_STORED_FROM = (
    "SELECT first_seq, last_seq FROM segments WHERE run_id = ? AND last_seq >= ? ORDER BY last_seq"
)
"""The spans of a run's segments holding a seq at or past one, in seq order."""


def _cut(blob: bytes, head: int, tail: int) -> bytes:
    """``blob``'s lines without the first ``head`` and the last ``tail`` (each under a segment)."""
    if not head and not tail:
        return blob
    start, end = 0, len(blob)
    for _ in range(head):
        start = blob.index(b"\n", start) + 1
    for _ in range(tail):
        end = blob.rindex(b"\n", start, end)
    return blob[start:end]


def _decode_lines(lines: bytes) -> list[Event]:
    return [envelope.decode(line, max_depth=None) for line in lines.split(b"\n")]


def _missing(seqs: list[int], stored: Iterable[tuple[int, int]]) -> list[int]:
    """The ``seqs`` (ascending) outside every ``(first, last)`` range of ``stored`` (ascending)."""
    missing: list[int] = []
    ranges = iter(stored)
    first, last = next(ranges, (_ALL, _ALL))
    for seq in seqs:
        while last < seq:
            first, last = next(ranges, (_ALL, _ALL))
        if seq < first:
            missing.append(seq)
    return missing


def _add_segments(
    params: list[Any], run_id: str, seqs: list[int], encoded: Sequence[bytes]
) -> None:
    """Add the segment rows of one run's new events (``seqs`` ascending) to ``params``.

    A contiguous stretch of seqs becomes one segment (several past
    :data:`SEGMENT_EVENTS`).
    """
    count = len(seqs)
    if seqs[-1] - seqs[0] == count - 1:
        bounds = list(range(0, count, SEGMENT_EVENTS)) + [count]
    else:
        bounds = [0]
        for index in range(1, count):
            if seqs[index] != seqs[index - 1] + 1 or index - bounds[-1] == SEGMENT_EVENTS:
                bounds.append(index)
        bounds.append(count)
    for start, stop in zip(bounds, bounds[1:], strict=False):
        params += (run_id, seqs[start], seqs[stop - 1], join_lines(encoded, start, stop))


def _ascending_segments(
    streams: Sequence[LogStream],
) -> tuple[list[Any], list[tuple[str, int]]] | None:
    """The segment rows of a write whose runs each come once with ascending seqs, and each
    run's first seq; None for any other write.

    The usual stream (contiguous seqs, at most :data:`SEGMENT_EVENTS`) is one
    join and a few C-level passes over its events.
    """
    params: list[Any] = []
    starts: list[tuple[str, int]] = []
    for stream in streams:
        run_id, events, encoded = stream[0], stream[1], stream[2]
        count = len(events)
        if not count:
            continue
        first = events[0].seq
        if count <= SEGMENT_EVENTS and all(map(eq, map(_seq, events), range(first, first + count))):
            params += (run_id, first, first + count - 1, join_lines(encoded))
        else:
            seqs = list(map(_seq, events))
            if not all(map(lt, seqs, seqs[1:])):
                return None
            _add_segments(params, run_id, seqs, encoded)
        starts.append((run_id, first))
    if len(starts) != len({run_id for run_id, _ in starts}):
        return None
    return params, starts


def _checkpoints(streams: Sequence[LogStream]) -> dict[str, tuple[bytes, int]]:
    """The checkpoint each run's part of a write carries, with that part's last seq (a run
    given twice: the part ending further)."""
    found: dict[str, tuple[bytes, int]] = {}
    for stream in streams:
        checkpoint = stream_checkpoint(stream)
        if checkpoint is not None and stream[1]:
            last = max(map(_seq, stream[1]))
            if stream[0] not in found or found[stream[0]][1] <= last:
                found[stream[0]] = (checkpoint, last)
    return found


_NO_CHECKPOINT = (None, 0)


def _path_of(url: str) -> str:
    rest = url.split("://", 1)[1].split("?", 1)[0]
    if rest in (":memory:", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/") or rest == "/":
        raise ConfigError(f"bad SQLite URL {url!r}; use sqlite:///relative.db or sqlite:////abs.db")
    return rest[1:]


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def _moment(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error, which is then re-raised.

    ``IMMEDIATE`` takes the write lock up front: one writer across the
    processes sharing the file. Every write transaction of this module is one
    of these, so none can hide its first error (see :func:`_undo`).
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException as error:
        _undo(db, error, "ROLLBACK")
        raise


@contextmanager
def _snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """A read transaction: the statements inside see one state of the file, whatever
    other processes commit meanwhile (WAL: no lock is taken from writers)."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("COMMIT")


def _undo(db: sqlite3.Connection, error: BaseException, *statements: str) -> None:
    """Roll back after ``error`` without ever raising in its place.

    SQLite ends the transaction itself on some errors (the file can't grow —
    disk full —, an I/O error, a trigger's ``RAISE(ROLLBACK)``); a ``ROLLBACK``
    then fails with "no transaction is active", which would replace the error
    the operator needs. So nothing is run when no transaction is left, and a
    statement that fails anyway is a note on ``error``.
    """
    for statement in statements:
        if not db.in_transaction:
            return
        try:
            db.execute(statement)
        except sqlite3.Error as also:
            error.add_note(f"{statement} after it failed too: {also}")
            return

def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """``journal_mode = WAL``, waiting for the other openers of the file.

    The switch needs the file to itself: while another connection writes to
    it in rollback mode (a peer creating the schema of a new file), SQLite
    answers "database is locked" at once, without the busy timeout's wait,
    so the switch is retried with backoff for up to :data:`BUSY_TIMEOUT_S`.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


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


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """From ``version`` to ``SCHEMA_VERSION``, a transaction a step; a process that opened the
    file at the same time finds a step done and goes on from there."""
    for step in range(version, SCHEMA_VERSION):
        with _transaction(conn):
            if conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] != step:
                continue  # another process migrated it meanwhile
            MIGRATIONS[step](conn)
            conn.execute("UPDATE schema_version SET version = ?", (step + 1,))


class SQLiteLog(ReplayLog):
    """The replay log in one SQLite file (or in memory)."""

    def _locate(self, location: str) -> None:
        self.path = _path_of(location)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    # ---- plumbing ------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError("the SQLite replay log is not connected")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.OperationalError as exc:
            kind = StoreFull if exc.sqlite_errorcode == sqlite3.SQLITE_FULL else StoreUnavailable
            raise kind(f"SQLite {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite {self.path}: {exc}") from exc

    @property
    def _db(self) -> sqlite3.Connection:
        assert self._conn is not None
        return self._conn

    def _open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_S)
        conn.execute("PRAGMA page_size = 16384")
        _switch_to_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is not None and version < SCHEMA_VERSION:
            _migrate(conn, version)
        conn.executescript(_SCHEMA)
        if version is None:  # one row, whoever of several openers of a new file gets here first
            conn.execute("INSERT INTO schema_version SELECT ? WHERE NOT EXISTS"
                         " (SELECT 1 FROM schema_version)", (SCHEMA_VERSION,))
        elif version > SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"{self.path} has schema {version}, newer than {SCHEMA_VERSION}")
        self._conn = conn

    async def connect(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="runwire-sqlite")
        try:
            await self._call(self._open)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        self._executor.shutdown(wait=True)
        self._executor = None

    async def ping(self) -> None:
        await self._call(lambda: self._db.execute("SELECT 1").fetchone())

    def outbox(self) -> Outbox:
        """The outbox in this file, worked on by the log's own thread and connection."""
        return Outbox(lambda work: self._call(lambda: work(self._db)), SQLITE, lambda: _epoch(self.clock()))

    # ---- append --------------------------------------------------------
    async def append(self, events: Sequence[Event]) -> int:
        return await self.append_encoded([(e, envelope.encode(e)) for e in events])

    async def append_encoded(self, rows: Sequence[tuple[Event, bytes]]) -> int:
        if not rows:
            return 0
        return await self._call(self._append, rows, _epoch(self.clock()))

    def _append(self, rows: Sequence[tuple[Event, bytes]], now: float) -> int:
        """Rows of any runs, in any order: grouped by run, then written as by :meth:`_append_streams`."""
        groups: dict[str, tuple[list[Event], list[bytes]]] = {}
        for event, body in rows:
            events, bodies = groups.setdefault(event.run_id, ([], []))
            events.append(event)
            bodies.append(body)
        return self._append_streams([(run_id, *group) for run_id, group in groups.items()], now)

    async def append_streams(self, streams: Sequence[LogStream]) -> int:
        if not any(stream[1] for stream in streams):
            return 0
        return await self._call(self._append_streams, streams, _epoch(self.clock()))

    def _append_streams(self, streams: Sequence[LogStream], now: float) -> int:
        """Store the events not stored yet (returns how many), one segment per run and write.

        Fast path: a worker's write holds each run once, its seqs ascending and
        past the run's stored end (checked by one query, :data:`_STORED_PAST`),
        so each stream becomes a segment, stored as it is. Any other write (one
        redone after a crash, possibly batched otherwise; events out of order,
        repeated or filling a gap) is stored per seq (:meth:`_insert_new`).
        The fast path's parameters come from C-level iterators and one join per
        stream, so this thread holds the GIL for little besides SQLite's own
        binding. A run's checkpoint, when its part carries one, goes into the
        same upsert of its metadata (:func:`~.runmeta.upsert_run_sql`).
        """
        db = self._db
        checkpoints = _checkpoints(streams)
        with _transaction(db):
            plan = _ascending_segments(streams)
            fresh: Sequence[tuple[str, Sequence[Event]]]
            if plan is not None and db.execute(_STORED_PAST, (_ids_json.encode(plan[1]),)).fetchone() is None:
                _execute_rows(db, _INSERT_SEGMENTS, 4, plan[0])
                fresh = [(stream[0], stream[1]) for stream in streams if stream[1]]
            else:
                fresh = self._insert_new(streams)
            self._merge_runs([with_checkpoint(summarize_run(run_id, events, ascending=True),
                                              *checkpoints.get(run_id, _NO_CHECKPOINT))
                              for run_id, events in fresh], now)
        return sum(len(events) for _, events in fresh)

    def _insert_new(self, streams: Sequence[LogStream]) -> list[tuple[str, list[Event]]]:
        """Store the events whose ``(run_id, seq)`` is neither stored nor earlier in ``streams``.

        Returns them per run. Each run's stored segments within the span of its
        seqs are read, and the events they miss become new segments.
        """
        db = self._db
        groups: dict[str, dict[int, tuple[Event, bytes]]] = {}
        for stream in streams:
            run_id, events, encoded = stream[0], stream[1], stream[2]
            group = groups.setdefault(run_id, {})
            for event, body in zip(events, encoded, strict=True):
                group.setdefault(event.seq, (event, body))
        fresh: list[tuple[str, list[Event]]] = []
        params: list[Any] = []
        for run_id, group in groups.items():
            if not group:
                continue
            seqs = sorted(group)
            new = _missing(seqs, db.execute(_STORED_FROM, (run_id, seqs[0])))
            if new:
                events = [group[seq][0] for seq in new]
                _add_segments(params, run_id, new, [group[seq][1] for seq in new])
                fresh.append((run_id, events))
        _execute_rows(db, _INSERT_SEGMENTS, 4, params)
        return fresh

    def _merge_runs(self, deltas: Sequence[RunDelta], now: float) -> None:
        """Merge the batch's run deltas and set the touched runs' expiry, in a few statements.

        The upsert sets the expiry under the default policy; then one
        ``UPDATE`` per tenant with a policy of its own sets its touched runs'.
        """
        if not deltas:
            return
        db = self._db
        keep = _keep_seconds(self.retention)
        head, tail = _upsert_runs(keep)
        expiry = {"done": keep[0], "aborted": keep[1], "error": keep[1]}
        _execute_rows(db, head, 19, [
            value for d in deltas
            for value in (d.run_id, d.tenant, d.parent_id, d.root_id, d.thread_id, d.state,
                          d.state_seq, d.terminal, d.events, d.last_seq, d.input_tokens, d.output_tokens,
                          d.dropped, d.first_ts, d.last_ts, now, now, d.checkpoint,
                          now + expiry.get(d.state or "", keep[2]))
        ], tail)
        notices = [notice for d in deltas for notice in d.notices]
        if notices:
            db.executemany(INSERT_NOTICE, notice_rows(notices, now))
        if self.tenant_retention:
            touched = _ids_json.encode([d.run_id for d in deltas])
            for tenant, policy in self.tenant_retention.items():
                db.execute(_SET_EXPIRY + " AND tenant = ?", (*_keep_seconds(policy), touched, tenant))

    # ---- read ----------------------------------------------------------
    async def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        if limit is not None and limit <= 0:
            return []
        lines, count, _ = await self._call(self._chunk, run_id, after, _ALL if limit is None else limit)
        return _decode_lines(lines) if count else []

    async def iter_events(
        self, run_id: str, after: int = 0, batch: int = 5000
    ) -> AsyncIterator[Event]:
        async for lines, _ in self._chunks(run_id, after, batch):
            for event in _decode_lines(lines):
                yield event

    def _chunk(self, run_id: str, after: int, limit: int) -> tuple[bytes, int, int]:
        """The first ``limit`` events after ``after`` as stored bytes joined by SQLite itself:
        ``(lines, count, last seq)``, without a final newline.

        The segments needed are found from the index (their spans, until
        ``limit`` events are counted), then joined into one value instead of
        one Python object per row or event (about 1.6x less CPU per exported
        event than a tuple per row); only the segments at the two ends are
        cut, by counting newlines. A batch over SQLite's value size limit is
        joined in Python instead.
        """
        db, counted, end = self._db, 0, _ALL
        with _snapshot(db):
            for first, last in db.execute(_SPANS_AFTER, (run_id, after)):
                counted += last - max(first, after + 1) + 1
                if counted >= limit:
                    end = last
                    break
            if not counted:
                return b"", 0, after
            try:
                blob, low, high, total = db.execute(_JOINED, (run_id, after, end)).fetchone()
            except sqlite3.DataError:  # string or blob too big
                rows = db.execute(_SEGMENTS_OF_CHUNK, (run_id, after, end)).fetchall()
                blob, low, high = b"\n".join([body for _, _, body in rows]), rows[0][0], rows[-1][1]
                total = sum(last - first + 1 for first, last, _ in rows)
        head = max(0, after + 1 - low)  # the first segment's events at or before ``after``
        tail = max(0, total - head - limit)  # the last segment's events past the limit
        return _cut(blob, head, tail), total - head - tail, high - tail

    async def iter_jsonl(
        self, run_id: str, after: int = 0, batch: int = 20_000
    ) -> AsyncIterator[tuple[bytes, int]]:
        async for lines, count in self._chunks(run_id, after, batch):
            yield lines + b"\n", count

    async def _chunks(self, run_id: str, after: int, batch: int) -> AsyncIterator[tuple[bytes, int]]:
        while True:
            lines, count, after = await self._call(self._chunk, run_id, after, batch)
            if count:
                yield lines, count
            if count < batch:
                return

    async def first_seq(self, run_id: str) -> int | None:
        row = await self._call(
            lambda: self._db.execute(
                "SELECT first_seq FROM segments WHERE run_id = ? ORDER BY last_seq LIMIT 1", (run_id,)
            ).fetchone()
        )
        return None if row is None else int(row[0])

    async def run(self, run_id: str) -> RunInfo | None:
        row = await self._call(
            lambda: self._db.execute(
                f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        )
        return None if row is None else self.with_expiry(run_info(row, _moment))

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        return await self._call(self._runs_by_id, list(dict.fromkeys(run_ids)))

    def _runs_by_id(self, run_ids: list[str]) -> dict[str, RunInfo]:
        found: dict[str, RunInfo] = {}
        for start in range(0, len(run_ids), _IDS_PER_QUERY):
            chunk = run_ids[start:start + _IDS_PER_QUERY]
            for row in self._db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id IN"
                                        f" ({', '.join('?' * len(chunk))})", chunk):
                found[row[0]] = self.with_expiry(run_info(row, _moment))
        return found

    async def logged_runs(self, run_ids: Sequence[str]) -> dict[str, LoggedRun]:
        return await self._call(self._logged_runs, list(dict.fromkeys(run_ids)))

    def _logged_runs(self, run_ids: list[str]) -> dict[str, LoggedRun]:
        found: dict[str, LoggedRun] = {}
        for start in range(0, len(run_ids), _IDS_PER_QUERY):
            chunk = run_ids[start:start + _IDS_PER_QUERY]
            for row in self._db.execute(f"SELECT {RUN_COLUMNS}, checkpoint FROM runs WHERE run_id IN"
                                        f" ({', '.join('?' * len(chunk))})", chunk):
                found[row[0]] = logged_run(self.with_expiry(run_info(row, _moment)), row[-1])
        return found

    async def claim_run(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        return await self._call(self._claim, run_id, tenant, root_id)

    def _claim(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        db = self._db
        with _transaction(db):
            row = db.execute("SELECT tenant, root_id FROM run_owners WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                logged = db.execute(
                    "SELECT tenant, coalesce(root_id, run_id) FROM runs WHERE run_id = ?", (run_id,)
                ).fetchone()
                row = (logged[0] or tenant, logged[1]) if logged else (tenant, root_id)
                db.execute("INSERT INTO run_owners VALUES (?, ?, ?, ?)",
                           (run_id, row[0], row[1], _epoch(self.clock())))
        return RunOwner(tenant=row[0], root_id=row[1])

    # ---- forks -----------------------------------------------------------------
    async def record_fork(self, fork: ForkPoint) -> ForkPoint:
        def record() -> ForkPoint:
            db = self._db
            db.execute("INSERT OR IGNORE INTO forks VALUES (?, ?, ?, ?)",
                       (fork.run_id, fork.source_id, fork.at, _epoch(self.clock())))
            row = db.execute("SELECT source_id, at_seq FROM forks WHERE run_id = ?", (fork.run_id,)).fetchone()
            return ForkPoint(run_id=fork.run_id, source_id=row[0], at=row[1])

        return await self._call(record)

    async def fork_points(self, run_ids: Sequence[str]) -> list[ForkPoint]:
        def find() -> list[ForkPoint]:
            found: dict[str, ForkPoint] = {}
            ids = list(dict.fromkeys(run_ids))
            for start in range(0, len(ids), _IDS_PER_QUERY // 2):
                chunk = ids[start:start + _IDS_PER_QUERY // 2]
                marks = ", ".join("?" * len(chunk))
                for row in self._db.execute(
                        f"SELECT run_id, source_id, at_seq FROM forks WHERE run_id IN ({marks})"
                        f" UNION SELECT run_id, source_id, at_seq FROM forks WHERE source_id IN ({marks})",
                        [*chunk, *chunk]):
                    found[row[0]] = ForkPoint(run_id=row[0], source_id=row[1], at=row[2])
            return list(found.values())

        return await self._call(find)

    # ---- Durable Streams write state ---------------------------------------
    async def stream_create(self, run_id: str) -> bool:
        def create() -> bool:
            before = self._db.total_changes
            self._db.execute("INSERT OR IGNORE INTO ds_streams (run_id, created_at) VALUES (?, ?)",
                             (run_id, _epoch(self.clock())))
            return self._db.total_changes > before

        return await self._call(create)

    async def stream_state(self, run_id: str) -> tuple[int, bool] | None:
        row = await self._call(lambda: self._db.execute(
            "SELECT next_seq, closed FROM ds_streams WHERE run_id = ?", (run_id,)).fetchone())
        return None if row is None else (row[0], bool(row[1]))

    async def stream_reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, *, close: bool, hold_s: float,
        digest: str = "",
    ) -> Reservation:
        return await self._call(self._reserve, run_id, producer, count, close, hold_s, digest)

    def _reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, close: bool, hold_s: float,
        digest: str,
    ) -> Reservation:
        db = self._db
        with _transaction(db):
            row = db.execute("SELECT next_seq, closed, busy_until FROM ds_streams WHERE run_id = ?",
                             (run_id,)).fetchone()
            state = None
            if row is not None and producer is not None:
                found = db.execute("SELECT epoch, last_seq, last_base, last_digest FROM ds_producers "
                                   "WHERE run_id = ? AND producer_id = ?", (run_id, producer[0])).fetchone()
                state = (ProducerState(epoch=found[0], last_seq=found[1], last_base=found[2],
                                       last_digest=found[3]) if found else None)
            producers = 0
            if row is not None and producer is not None and state is None:
                producers = db.execute("SELECT count(*) FROM ds_producers WHERE run_id = ?", (run_id,)).fetchone()[0]
            decision = reserve(row, state, producer, time.time(), digest, producers)
            if decision.outcome == "append":
                db.execute("UPDATE ds_streams SET next_seq = ?, closed = ?, busy_until = ? WHERE run_id = ?",
                           (decision.base + count, int(close or bool(row and row[1])),
                            time.time() + hold_s, run_id))
                if producer is not None:
                    db.execute("INSERT OR REPLACE INTO ds_producers VALUES (?, ?, ?, ?, ?, ?)",
                               (run_id, producer[0], producer[1], producer[2], decision.base, digest))
        return decision

    async def stream_release(self, run_id: str) -> None:
        await self._call(lambda: self._db.execute(
            "UPDATE ds_streams SET busy_until = 0 WHERE run_id = ?", (run_id,)))

    async def run_owner(self, run_id: str) -> RunOwner | None:
        row = await self._call(
            lambda: self._db.execute(
                "SELECT tenant, root_id FROM run_owners WHERE run_id = ?", (run_id,)
            ).fetchone()
        )
        return None if row is None else RunOwner(tenant=row[0], root_id=row[1])

    async def _count_runs(self, conditions: list[tuple[str, Sequence[str | datetime]]], cap: int) -> int:
        where = " AND ".join(["1 = 1", *(sql.replace("{}", "?") for sql, _ in conditions)])
        args = [_epoch(v) if isinstance(v, datetime) else v for _, values in conditions for v in values]
        sql = f"SELECT count(*) FROM (SELECT 1 FROM runs WHERE {where} LIMIT ?)"
        row = await self._call(lambda: self._db.execute(sql, (*args, cap)).fetchone())
        return int(row[0])

    async def _runs(self, filters: dict[str, str | datetime], limit: int) -> list[RunInfo]:
        where = " AND ".join(["1 = 1", *(sql.format("?") for sql in filters)])
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY updated_at DESC, run_id LIMIT ?"
        args = [_epoch(v) if isinstance(v, datetime) else v for v in filters.values()]
        rows = await self._call(lambda: self._db.execute(sql, (*args, limit)).fetchall())
        return [self.with_expiry(run_info(row, _moment)) for row in rows]

    # ---- retention -----------------------------------------------------
    def _expired(self, now: datetime) -> list[tuple[str, int]]:
        cursor = self._db.execute(
            "SELECT run_id, tenant, state, updated_at, events FROM runs WHERE updated_at <= ?",
            (_epoch(now - self.shortest_retention()),),
        )
        return [
            (run_id, events)
            for run_id, tenant, state, updated, events in cursor
            if self.expiry(tenant, state, datetime.fromtimestamp(updated, UTC)) <= now
        ]

    def _delete(self, run_ids: list[str]) -> int:
        db, deleted = self._db, 0
        for start in range(0, len(run_ids), 500):
            some = run_ids[start:start + 500]
            chunk = [(run_id,) for run_id in some]
            with _transaction(db):
                deleted += db.execute(_EVENTS_OF_RUNS, (_ids_json.encode(some),)).fetchone()[0]
                db.executemany("DELETE FROM segments WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM runs WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM run_owners WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM ds_streams WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM ds_producers WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM forks WHERE run_id = ?", chunk)
                db.executemany("DELETE FROM span_exports WHERE root_id = ?", chunk)
        return deleted

    async def sweep(self, *, now: datetime | None = None, dry_run: bool = False) -> SweepResult:
        return await self._call(self._sweep, now or self.clock(), dry_run)

    def _sweep(self, now: datetime, dry_run: bool) -> SweepResult:
        expired = self._expired(now)
        run_ids = [run_id for run_id, _ in expired]
        if dry_run:
            return SweepResult(runs=run_ids, events=sum(n for _, n in expired))
        deleted = self._delete(run_ids)
        self._db.execute(  # claims of runs that never reached the log
            "DELETE FROM run_owners WHERE created_at <= ? AND run_id NOT IN (SELECT run_id FROM runs)",
            (_epoch(now - self.retention.unfinished),),
        )
        self._db.execute(  # Durable Streams created and never written: their stream and producer rows
            "DELETE FROM ds_streams WHERE created_at <= ? AND run_id NOT IN (SELECT run_id FROM runs)",
            (_epoch(now - self.retention.unfinished),),
        )
        self._db.execute("DELETE FROM ds_producers WHERE run_id NOT IN (SELECT run_id FROM ds_streams)")
        self._db.execute(  # forks recorded and never copied (their copy failed and was not retried)
            "DELETE FROM forks WHERE created_at <= ? AND run_id NOT IN (SELECT run_id FROM runs)",
            (_epoch(now - self.retention.unfinished),),
        )
        return SweepResult(runs=run_ids, events=deleted)

    # ---- span export cursors -------------------------------------------
    async def export_claim(self, roots: Sequence[str], holder: str, hold_s: float) -> dict[str, int]:
        def claim() -> dict[str, int]:  # one statement for the whole batch of roots
            now = _epoch(self.clock())
            with _transaction(self._db):
                rows = self._db.execute(_EXPORT_CLAIM, (json.dumps(list(roots)), holder, now + hold_s, now)).fetchall()
            return {str(root): int(seq) for root, seq in rows}

        return await self._call(claim) if roots else {}

    async def export_commit(
        self, moves: Sequence[tuple[str, int, int]], holder: str, hold_s: float
    ) -> list[str]:
        def commit() -> list[str]:  # one statement for the whole batch of moves
            until = _epoch(self.clock()) + hold_s
            with _transaction(self._db):
                rows = self._db.execute(_EXPORT_COMMIT, (until, json.dumps(list(moves)), holder)).fetchall()
            return [str(row[0]) for row in rows]

        return await self._call(commit) if moves else []

    async def export_behind(self, since: datetime, until: datetime, limit: int) -> list[str]:
        rows = await self._call(lambda: self._db.execute(
            "SELECT r.run_id FROM runs r LEFT JOIN span_exports x ON x.root_id = r.run_id"
            " WHERE r.parent_id IS NULL AND r.updated_at >= ? AND r.updated_at <= ?"
            " AND r.last_seq > coalesce(x.seq, 0) ORDER BY r.updated_at LIMIT ?",
            (_epoch(since), _epoch(until), limit)).fetchall())
        return [row[0] for row in rows]


_EXPORT_CLAIM = (
    "INSERT INTO span_exports (root_id, seq, holder, held_until) SELECT value, 0, ?2, ?3 FROM json_each(?1) WHERE true"
    " ON CONFLICT (root_id) DO UPDATE SET holder = excluded.holder, held_until = excluded.held_until"
    " WHERE span_exports.holder = excluded.holder OR span_exports.held_until < ?4 RETURNING root_id, seq"
)
"""Hold each root's export: a new row, or ours again, or one whose holder's hold has lapsed (the
rows returned: those now held)."""
_EXPORT_COMMIT = (
    "UPDATE span_exports SET seq = m.after, held_until = ?1 FROM (SELECT json_extract(value, '$[0]') AS root,"
    " json_extract(value, '$[1]') AS before, json_extract(value, '$[2]') AS after FROM json_each(?2)) AS m"
    " WHERE span_exports.root_id = m.root AND span_exports.holder = ?3 AND span_exports.seq = m.before"
    " RETURNING root_id"
)
"""Move each ``[root, before, after]`` cursor still at ``before`` and held by the holder."""
