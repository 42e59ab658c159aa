"""The embedded replay log: one SQLite file (WAL mode), the default store.

``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or
``sqlite://:memory:``; retention parameters as in :mod:`.retention`.

All SQLite work runs on one dedicated thread with one connection: SQLite
allows a single writer anyway, and one thread keeps the connection's state
simple. The stdlib ``sqlite3`` module is used directly: aiosqlite does the
same thing (one thread per connection, calls queued to it) behind another
dependency, and the per-call hop is paid once per batch of 5 000–20 000 rows,
so it does not show in the figures (``bench/replay.py``). The events are
stored as *segments* (``schema.py``): one row per run per write, holding
the canonical JSON bytes of consecutive seqs joined by newlines, so export
streams them without re-encoding and a worker's write costs one row per run
it touches, not one per event.

Longer than ~400 lines: the backend's one class, whose methods (the writes and
the queries of the event log, run catalogue, ownership, Durable Streams state,
retention and span export) share the connection's thread; its tables and
migrations are in ``schema.py``, its statements and their rows in
``statements.py``, what it shares with PostgreSQL in ``runmeta.py``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ...core import envelope
from ...core.envelope import Event
from ...core.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from ..base import ForkPoint, LoggedRun, LogStream, ReplayLog, RunInfo, RunOwner, SweepResult
from ..outbox import INSERT_NOTICE, SQLITE, Outbox, notice_rows
from ..producers import ProducerState, Reservation, reserve
from ..runmeta import (
    RUN_COLUMNS,
    RunDelta,
    logged_run,
    run_info,
    stream_summary,
    summarize_run,
    with_checkpoint,
)
from .connection import BUSY_TIMEOUT_S, snapshot, switch_to_wal, transaction
from .schema import SCHEMA, SCHEMA_VERSION, migrate
from .statements import (
    EVENTS_OF_RUNS,
    EVERY_EVENT,
    IDS_PER_QUERY,
    INSERT_SEGMENTS,
    JOINED,
    NO_CHECKPOINT,
    SEGMENTS_OF_CHUNK,
    SET_EXPIRY,
    SPANS_AFTER,
    STORED_FROM,
    STORED_PAST,
    add_segments,
    ascending_segments,
    checkpoints_of,
    cut_blob,
    decode_lines,
    execute_rows,
    ids_json,
    keep_seconds,
    missing_seqs,
    upsert_runs,
)

T = TypeVar("T")


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


class SQLiteLog(ReplayLog):
    """The replay log in one SQLite file (or in memory)."""

    def _locate(self, location: str) -> None:
        self.path = _path_of(location)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._checkpoints = True
        """Whether this connection's commits checkpoint the WAL once it is past SQLite's 1,000
        pages (each connection's default); a log :meth:`beside` a writer's leaves that to it."""

    def beside(self) -> SQLiteLog | None:
        """(:meth:`ReplayLog.beside`) Its commits never checkpoint the WAL: a checkpoint copies
        the pages of the writer's commits (~5 ms of CPU a time beside a worker), and it is the
        writer's commits that fill the WAL."""
        side = super().beside()
        if not isinstance(side, SQLiteLog):
            return None
        side._checkpoints = False
        return side

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
        switch_to_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA cache_size = -65536")
        if not self._checkpoints:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is not None and version < SCHEMA_VERSION:
            migrate(conn, version)
        conn.executescript(SCHEMA)
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
        past the run's stored end (checked by one query, :data:`STORED_PAST`),
        so each stream becomes a segment, stored as it is. Any other write (one
        redone after a crash, possibly batched otherwise; events out of order,
        repeated or filling a gap) is stored per seq (:meth:`_insert_new`).
        The fast path's parameters come from C-level iterators and one join per
        stream, so this thread holds the GIL for little besides SQLite's own
        binding. A run's checkpoint, when its part carries one, goes into the
        same upsert of its metadata (:func:`~.runmeta.upsert_run_sql`).
        """
        db = self._db
        with transaction(db):
            plan = ascending_segments(streams)
            checkpoints = checkpoints_of(streams, ascending=plan is not None)
            if plan is not None and db.execute(STORED_PAST, (ids_json.encode(plan[1]),)).fetchone() is None:
                execute_rows(db, INSERT_SEGMENTS, 4, plan[0])
                stored = [stream for stream in streams if stream[1]]
                deltas = [stream_summary(stream) for stream in stored]
            else:
                fresh = self._insert_new(streams)
                stored = fresh  # type: ignore[assignment]
                deltas = [summarize_run(run_id, events, ascending=True) for run_id, events in fresh]
            self._merge_runs([with_checkpoint(delta, *checkpoints.get(delta.run_id, NO_CHECKPOINT))
                              for delta in deltas], now)
        return sum(len(stream[1]) for stream in stored)

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
            new = missing_seqs(seqs, db.execute(STORED_FROM, (run_id, seqs[0])))
            if new:
                events = [group[seq][0] for seq in new]
                add_segments(params, run_id, new, [group[seq][1] for seq in new])
                fresh.append((run_id, events))
        execute_rows(db, INSERT_SEGMENTS, 4, params)
        return fresh

    def _merge_runs(self, deltas: Sequence[RunDelta], now: float) -> None:
        """Merge the batch's run deltas and set the touched runs' expiry, in a few statements.

        The upsert sets the expiry under the default policy; then one
        ``UPDATE`` per tenant with a policy of its own sets its touched runs'.
        """
        if not deltas:
            return
        db = self._db
        keep = keep_seconds(self.retention)
        head, tail = upsert_runs(keep)
        expiry = {"done": keep[0], "aborted": keep[1], "error": keep[1]}
        execute_rows(db, head, 19, [
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
            touched = ids_json.encode([d.run_id for d in deltas])
            for tenant, policy in self.tenant_retention.items():
                db.execute(SET_EXPIRY + " AND tenant = ?", (*keep_seconds(policy), touched, tenant))

    # ---- read ----------------------------------------------------------
    async def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        if limit is not None and limit <= 0:
            return []
        lines, count, _ = await self._call(self._chunk, run_id, after, EVERY_EVENT if limit is None else limit)
        return decode_lines(lines) if count else []

    async def iter_events(
        self, run_id: str, after: int = 0, batch: int = 5000
    ) -> AsyncIterator[Event]:
        async for lines, _ in self._chunks(run_id, after, batch):
            for event in decode_lines(lines):
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
        db, counted, end = self._db, 0, EVERY_EVENT
        with snapshot(db):
            for first, last in db.execute(SPANS_AFTER, (run_id, after)):
                counted += last - max(first, after + 1) + 1
                if counted >= limit:
                    end = last
                    break
            if not counted:
                return b"", 0, after
            try:
                blob, low, high, total = db.execute(JOINED, (run_id, after, end)).fetchone()
            except sqlite3.DataError:  # string or blob too big
                rows = db.execute(SEGMENTS_OF_CHUNK, (run_id, after, end)).fetchall()
                blob, low, high = b"\n".join([body for _, _, body in rows]), rows[0][0], rows[-1][1]
                total = sum(last - first + 1 for first, last, _ in rows)
        head = max(0, after + 1 - low)  # the first segment's events at or before ``after``
        tail = max(0, total - head - limit)  # the last segment's events past the limit
        return cut_blob(blob, head, tail), total - head - tail, high - tail

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
        for start in range(0, len(run_ids), IDS_PER_QUERY):
            chunk = run_ids[start:start + IDS_PER_QUERY]
            for row in self._db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id IN"
                                        f" ({', '.join('?' * len(chunk))})", chunk):
                found[row[0]] = self.with_expiry(run_info(row, _moment))
        return found

    async def logged_runs(self, run_ids: Sequence[str]) -> dict[str, LoggedRun]:
        return await self._call(self._logged_runs, list(dict.fromkeys(run_ids)))

    def _logged_runs(self, run_ids: list[str]) -> dict[str, LoggedRun]:
        found: dict[str, LoggedRun] = {}
        for start in range(0, len(run_ids), IDS_PER_QUERY):
            chunk = run_ids[start:start + IDS_PER_QUERY]
            for row in self._db.execute(f"SELECT {RUN_COLUMNS}, checkpoint FROM runs WHERE run_id IN"
                                        f" ({', '.join('?' * len(chunk))})", chunk):
                found[row[0]] = logged_run(self.with_expiry(run_info(row, _moment)), row[-1])
        return found

    async def claim_run(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        return await self._call(self._claim, run_id, tenant, root_id)

    def _claim(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        db = self._db
        with transaction(db):
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
            for start in range(0, len(ids), IDS_PER_QUERY // 2):
                chunk = ids[start:start + IDS_PER_QUERY // 2]
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
        with transaction(db):
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
            with transaction(db):
                deleted += db.execute(EVENTS_OF_RUNS, (ids_json.encode(some),)).fetchone()[0]
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
            with transaction(self._db):
                rows = self._db.execute(_EXPORT_CLAIM, (json.dumps(list(roots)), holder, now + hold_s, now)).fetchall()
            return {str(root): int(seq) for root, seq in rows}

        return await self._call(claim) if roots else {}

    async def export_commit(
        self, moves: Sequence[tuple[str, int, int]], holder: str, hold_s: float
    ) -> list[str]:
        def commit() -> list[str]:  # one statement for the whole batch of moves
            until = _epoch(self.clock()) + hold_s
            with transaction(self._db):
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
