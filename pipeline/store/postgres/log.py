"""The production replay log on PostgreSQL (psycopg 3, async).

``postgresql://user:pass@host:5432/db`` (``postgres://`` too); any libpq
parameter in the query string is passed on (``?options=-csearch_path%3Dreplay``
puts the tables in another schema), retention parameters as in
:mod:`.retention`.

Tables (Koder agent stream §6 plus what runwire needs):

* ``events`` — ``id, run_id, tenant, child_id, seq, type, ts timestamptz,
  payload jsonb`` and ``body bytea`` (the canonical envelope bytes, so export
  streams them without re-encoding); primary key ``(run_id, seq)`` (the
  idempotency key), index ``(tenant, ts)``.
* ``runs`` — one row of metadata per run (``thread_id`` since schema 2),
  maintained on append, and the checkpoint of record of the run's raw
  delivery stream (``checkpoint``, since schema 3: see ``ReplayLog.logged_runs``).
* ``runwire_schema`` — the schema version.

One connection writes (appends, sweeps) and one reads, each used by one
coroutine at a time; appends of more than a few hundred events go through
``COPY`` into a temporary table and one ``INSERT … ON CONFLICT DO NOTHING``.

Longer than ~400 lines: one backend (schema, its two connections, bulk append,
queries); what it shares with SQLite is in ``runmeta.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from ...core import envelope
from ...core.envelope import Event
from ...core.errors import StoreError
from ..base import (
    ForkPoint,
    LoggedRun,
    LogStream,
    ReplayLog,
    RunInfo,
    RunOwner,
    SweepResult,
    stream_checkpoint,
)
from ..outbox import POSTGRES, Notice, Outbox, notice_rows
from ..producers import ProducerState, Reservation, reserve
from ..runmeta import (
    RUN_COLUMNS,
    RunDelta,
    logged_run,
    run_info,
    summarize,
    with_checkpoint,
)
from .connection import ThreadConnection, unavailable
from .schema import migrate
from .statements import (
    CLAIM,
    COPY_THRESHOLD,
    FROM_ARRAYS,
    FROM_STAGE,
    NOTICE_INSERT,
    STAGE,
    STAGE_TYPES,
    UPSERT_RUN,
    stage_row,
)


class _Conn:
    """One connection used by one coroutine at a time, re-opened after it broke."""

    def __init__(self, open: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]) -> None:
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.lock = asyncio.Lock()
        self._open = open

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self.conn is None:
            raise StoreError("the PostgreSQL replay log is not connected")
        if self.conn.closed or self.conn.broken:
            self.conn = await self._open()
        return self.conn


class PostgresLog(ReplayLog):
    """The replay log in PostgreSQL."""

    def _locate(self, location: str) -> None:
        self.dsn = "postgresql://" + location.split("://", 1)[1]
        self._writer = _Conn(self._open_writer)
        self._reader = _Conn(self._open)
        self._outbox: ThreadConnection | None = None

    def outbox(self) -> Outbox:
        """The outbox in this database, on a connection of its own (``postgres/connection.py``)."""
        if self._outbox is None:
            self._outbox = ThreadConnection(self.dsn)
        return Outbox(self._outbox, POSTGRES, lambda: self.clock().timestamp())

    # ---- plumbing ------------------------------------------------------
    async def _open(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise unavailable(exc, "PostgreSQL unreachable") from exc

    async def _open_writer(self) -> psycopg.AsyncConnection[Any]:
        conn = await self._open()
        await conn.execute(STAGE)
        return conn

    async def connect(self) -> None:
        if self._writer.conn is not None:
            return
        writer = await self._open()
        try:
            await self._migrate(writer)
            self._reader.conn = await self._open()
        except BaseException:
            await writer.close()
            raise
        self._writer.conn = writer

    async def _migrate(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await migrate(conn)
        await conn.execute(STAGE)

    async def close(self) -> None:
        if self._outbox is not None:
            await self._outbox.close()
            self._outbox = None
        for slot in (self._writer, self._reader):
            if slot.conn is not None:
                await slot.conn.close()
                slot.conn = None

    async def ping(self) -> None:
        await self._fetch("SELECT 1", ())

    async def _fetch(
        self, sql: str, args: Sequence[Any] | dict[str, Any], *, again: bool = True
    ) -> list[tuple[Any, ...]]:
        """Run one statement on the reading connection. A connection that broke since its last
        use (the server restarted) is opened again and the statement run once more on it when
        ``again`` (statements whose repeat answers the same), so the first read after a restart
        does not fail; a server still down is ``StoreUnavailable``."""
        async with self._reader.lock:
            try:
                conn = await self._reader.get()
                try:
                    cursor = await conn.execute(sql, args, binary=True)
                except psycopg.OperationalError:
                    if not (again and conn.broken):
                        raise
                    cursor = await (await self._reader.get()).execute(sql, args, binary=True)
                return await cursor.fetchall()
            except psycopg.OperationalError as exc:
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc

    # ---- append --------------------------------------------------------
    async def append(self, events: Sequence[Event]) -> int:
        return await self.append_encoded([(e, envelope.encode(e)) for e in events])

    async def append_encoded(self, rows: Sequence[tuple[Event, bytes]]) -> int:
        return await self._append(rows, {})

    async def append_streams(self, streams: Sequence[LogStream]) -> int:
        rows = [row for stream in streams for row in zip(stream[1], stream[2], strict=True)]
        checkpoints: dict[str, tuple[bytes, int]] = {}
        for stream in streams:
            checkpoint = stream_checkpoint(stream)
            if checkpoint is not None and stream[1]:
                last = max(event.seq for event in stream[1])
                if checkpoints.get(stream[0], (b"", -1))[1] <= last:
                    checkpoints[stream[0]] = (checkpoint, last)
        return await self._append(rows, checkpoints)

    async def _append(
        self, rows: Sequence[tuple[Event, bytes]], checkpoints: dict[str, tuple[bytes, int]]
    ) -> int:
        """Store the new rows and merge their runs' metadata (with each run's checkpoint, if given,
        and its part's last seq)."""
        if not rows:
            return 0
        async with self._writer.lock:
            conn = await self._writer.get()
            try:
                async with conn.transaction():
                    stored = await self._insert(conn, rows)
                    fresh = [row[0] for row in rows if (row[0].run_id, row[0].seq) in stored]
                    now = self.clock()
                    notices: list[Notice] = []
                    for run_id, delta in summarize(fresh).items():
                        if run_id in checkpoints:
                            with_checkpoint(delta, *checkpoints[run_id])
                        await self._merge_run(conn, delta, now)
                        notices += delta.notices
                    if notices:
                        async with conn.cursor() as cursor:
                            await cursor.executemany(NOTICE_INSERT, notice_rows(notices, now.timestamp()))
            except psycopg.OperationalError as exc:
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc
        return len(stored)

    async def _insert(
        self, conn: psycopg.AsyncConnection[Any], rows: Sequence[tuple[Event, bytes]]
    ) -> set[tuple[str, int]]:
        """Insert new rows; the ``(run_id, seq)`` of those actually stored."""
        async with conn.cursor() as cursor:
            if len(rows) >= COPY_THRESHOLD:
                async with cursor.copy(
                    "COPY runwire_stage (id, run_id, tenant, child_id, seq, type, ts, body)"
                    " FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(STAGE_TYPES)
                    for event, body in rows:
                        await copy.write_row(stage_row(event, body))
                await cursor.execute(FROM_STAGE.format(source="runwire_stage"))
            else:
                columns = list(zip(*(stage_row(e, b) for e, b in rows), strict=True))
                await cursor.execute(FROM_ARRAYS, [list(c) for c in columns])
            return {(run_id, seq) for run_id, seq in await cursor.fetchall()}

    async def _merge_run(
        self, conn: psycopg.AsyncConnection[Any], delta: RunDelta, now: datetime
    ) -> None:
        cursor = await conn.execute(
            UPSERT_RUN,
            (delta.run_id, delta.tenant, delta.parent_id, delta.root_id, delta.thread_id, delta.state,
             delta.state_seq, delta.terminal, delta.events, delta.last_seq,
             delta.input_tokens, delta.output_tokens, delta.dropped, delta.first_ts,
             delta.last_ts, now, now, delta.checkpoint),
        )
        row = await cursor.fetchone()
        assert row is not None
        tenant, state, updated = row
        await conn.execute(
            "UPDATE runs SET expires_at = %s WHERE run_id = %s",
            (self.expiry(tenant, state, updated), delta.run_id),
        )

    # ---- read ----------------------------------------------------------
    async def _bodies(self, run_id: str, after: int, limit: int | None) -> list[tuple[Any, ...]]:
        sql = "SELECT seq, body FROM events WHERE run_id = %s AND seq > %s ORDER BY seq"
        if limit is None:
            return await self._fetch(sql, (run_id, after))
        return await self._fetch(sql + " LIMIT %s", (run_id, after, limit))

    async def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        return [envelope.decode(body, max_depth=None) for _, body in await self._bodies(run_id, after, limit)]

    async def _batches(
        self, run_id: str, after: int, batch: int
    ) -> AsyncIterator[list[tuple[Any, ...]]]:
        while True:
            rows = await self._bodies(run_id, after, batch)
            if not rows:
                return
            yield rows
            if len(rows) < batch:
                return
            after = rows[-1][0]

    async def iter_events(
        self, run_id: str, after: int = 0, batch: int = 5000
    ) -> AsyncIterator[Event]:
        async for rows in self._batches(run_id, after, batch):
            for _, body in rows:
                yield envelope.decode(body, max_depth=None)

    async def iter_jsonl(
        self, run_id: str, after: int = 0, batch: int = 20_000
    ) -> AsyncIterator[tuple[bytes, int]]:
        async for rows in self._batches(run_id, after, batch):
            yield b"\n".join([body for _, body in rows]) + b"\n", len(rows)

    async def first_seq(self, run_id: str) -> int | None:
        rows = await self._fetch("SELECT min(seq) FROM events WHERE run_id = %s", (run_id,))
        value: int | None = rows[0][0]
        return value

    async def run(self, run_id: str) -> RunInfo | None:
        rows = await self._fetch(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = %s", (run_id,))
        return self.with_expiry(run_info(rows[0])) if rows else None

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        rows = await self._fetch(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ANY(%s)",
                                 (list(dict.fromkeys(run_ids)),))
        return {row[0]: self.with_expiry(run_info(row)) for row in rows}

    async def logged_runs(self, run_ids: Sequence[str]) -> dict[str, LoggedRun]:
        rows = await self._fetch(f"SELECT {RUN_COLUMNS}, checkpoint FROM runs WHERE run_id = ANY(%s)",
                                 (list(dict.fromkeys(run_ids)),))
        return {row[0]: logged_run(self.with_expiry(run_info(row)), row[-1]) for row in rows}

    async def claim_run(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        args = {"run": run_id, "tenant": tenant, "root": root_id}
        for _ in range(3):
            # empty only when a concurrent claim committed after this statement's snapshot
            rows = await self._fetch(CLAIM, args)
            if rows:
                return RunOwner(tenant=rows[0][0], root_id=rows[0][1])
        raise StoreError(f"could not claim run {run_id!r}")

    # ---- forks -----------------------------------------------------------------
    async def record_fork(self, fork: ForkPoint) -> ForkPoint:
        rows = await self._fetch(
            "WITH added AS (INSERT INTO forks (run_id, source_id, at_seq) VALUES (%(run)s, %(source)s, %(at)s)"
            " ON CONFLICT (run_id) DO NOTHING RETURNING source_id, at_seq)"
            " SELECT source_id, at_seq FROM added"
            " UNION ALL SELECT source_id, at_seq FROM forks WHERE run_id = %(run)s",
            {"run": fork.run_id, "source": fork.source_id, "at": fork.at},
        )
        return ForkPoint(run_id=fork.run_id, source_id=rows[0][0], at=int(rows[0][1]))

    async def fork_points(self, run_ids: Sequence[str]) -> list[ForkPoint]:
        ids = list(dict.fromkeys(run_ids))
        rows = await self._fetch(
            "SELECT run_id, source_id, at_seq FROM forks WHERE run_id = ANY(%(ids)s) OR source_id = ANY(%(ids)s)",
            {"ids": ids},
        )
        return [ForkPoint(run_id=row[0], source_id=row[1], at=int(row[2])) for row in rows]

    # ---- Durable Streams write state ---------------------------------------
    async def stream_create(self, run_id: str) -> bool:
        rows = await self._fetch(
            "INSERT INTO ds_streams (run_id) VALUES (%s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            (run_id,), again=False,  # run again after a commit whose answer was lost, it would say "exists"
        )
        return bool(rows)

    async def stream_state(self, run_id: str) -> tuple[int, bool] | None:
        rows = await self._fetch("SELECT next_seq, closed FROM ds_streams WHERE run_id = %s", (run_id,))
        return (int(rows[0][0]), bool(rows[0][1])) if rows else None

    async def stream_reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, *, close: bool, hold_s: float,
        digest: str = "",
    ) -> Reservation:
        async with self._writer.lock:
            conn = await self._writer.get()
            try:
                async with conn.transaction():
                    return await self._reserve(conn, run_id, producer, count, close, hold_s, digest)
            except psycopg.OperationalError as exc:
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc

    async def _reserve(
        self, conn: psycopg.AsyncConnection[Any], run_id: str, producer: tuple[str, int, int] | None,
        count: int, close: bool, hold_s: float, digest: str = "",
    ) -> Reservation:
        row = await (await conn.execute(  # the row lock orders batches across edges
            "SELECT next_seq, closed, busy_until FROM ds_streams WHERE run_id = %s FOR UPDATE", (run_id,)
        )).fetchone()
        stream = (int(row[0]), int(row[1]), float(row[2])) if row else None
        state = None
        if row is not None and producer is not None:
            found = await (await conn.execute(
                "SELECT epoch, last_seq, last_base, last_digest FROM ds_producers"
                " WHERE run_id = %s AND producer_id = %s",
                (run_id, producer[0]),
            )).fetchone()
            state = (ProducerState(epoch=found[0], last_seq=found[1], last_base=found[2], last_digest=found[3])
                     if found else None)
        producers = 0
        if row is not None and producer is not None and state is None:
            counted = await (await conn.execute(
                "SELECT count(*) FROM ds_producers WHERE run_id = %s", (run_id,))).fetchone()
            producers = int(counted[0]) if counted else 0
        decision = reserve(stream, state, producer, time.time(), digest, producers)
        if decision.outcome == "append":
            await conn.execute(
                "UPDATE ds_streams SET next_seq = %s, closed = closed OR %s, busy_until = %s WHERE run_id = %s",
                (decision.base + count, close, time.time() + hold_s, run_id),
            )
            if producer is not None:
                await conn.execute(
                    "INSERT INTO ds_producers VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run_id, producer_id)"
                    " DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq,"
                    " last_base = excluded.last_base, last_digest = excluded.last_digest",
                    (run_id, producer[0], producer[1], producer[2], decision.base, digest),
                )
        return decision

    async def stream_release(self, run_id: str) -> None:
        await self._fetch("UPDATE ds_streams SET busy_until = 0 WHERE run_id = %s RETURNING run_id", (run_id,))

    async def run_owner(self, run_id: str) -> RunOwner | None:
        rows = await self._fetch("SELECT tenant, root_id FROM run_owners WHERE run_id = %s", (run_id,))
        return RunOwner(tenant=rows[0][0], root_id=rows[0][1]) if rows else None

    async def _count_runs(self, conditions: list[tuple[str, Sequence[str | datetime]]], cap: int) -> int:
        where = " AND ".join(["true", *(sql.replace("{}", "%s") for sql, _ in conditions)])
        args = [v for _, values in conditions for v in values]
        rows = await self._fetch(f"SELECT count(*) FROM (SELECT 1 FROM runs WHERE {where} LIMIT %s) AS matched",
                                 (*args, cap))
        return int(rows[0][0])

    async def _runs(self, filters: dict[str, str | datetime], limit: int) -> list[RunInfo]:
        where = " AND ".join(["true", *(sql.format("%s") for sql in filters)])
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY updated_at DESC, run_id LIMIT %s"
        return [self.with_expiry(run_info(row)) for row in await self._fetch(sql, (*filters.values(), limit))]

    # ---- retention -----------------------------------------------------
    async def _expired(
        self, conn: psycopg.AsyncConnection[Any], now: datetime
    ) -> list[tuple[str, int]]:
        cursor = await conn.execute(
            "SELECT run_id, tenant, state, updated_at, events FROM runs WHERE updated_at <= %s",
            (now - self.shortest_retention(),),
        )
        return [
            (run_id, events)
            for run_id, tenant, state, updated, events in await cursor.fetchall()
            if self.expiry(tenant, state, updated) <= now
        ]

    async def sweep(self, *, now: datetime | None = None, dry_run: bool = False) -> SweepResult:
        async with self._writer.lock:
            try:
                return await self._sweep(now or self.clock(), dry_run)
            except psycopg.OperationalError as exc:
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc

    async def _sweep(self, moment: datetime, dry_run: bool) -> SweepResult:
        conn = await self._writer.get()
        expired = await self._expired(conn, moment)
        run_ids = [run_id for run_id, _ in expired]
        if dry_run:
            return SweepResult(runs=run_ids, events=sum(n for _, n in expired))
        deleted = 0
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start:start + 500]
            async with conn.transaction():
                cursor = await conn.execute("DELETE FROM events WHERE run_id = ANY(%s)", (chunk,))
                deleted += cursor.rowcount
                await conn.execute("DELETE FROM runs WHERE run_id = ANY(%s)", (chunk,))
                await conn.execute("DELETE FROM run_owners WHERE run_id = ANY(%s)", (chunk,))
                await conn.execute("DELETE FROM ds_streams WHERE run_id = ANY(%s)", (chunk,))
                await conn.execute("DELETE FROM ds_producers WHERE run_id = ANY(%s)", (chunk,))
                await conn.execute("DELETE FROM forks WHERE run_id = ANY(%s)", (chunk,))
                await conn.execute("DELETE FROM span_exports WHERE root_id = ANY(%s)", (chunk,))
        await conn.execute(  # claims of runs that never reached the log
            "DELETE FROM run_owners o WHERE created_at <= %s"
            " AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = o.run_id)",
            (moment - self.retention.unfinished,),
        )
        await conn.execute(  # Durable Streams created and never written: their stream and producer rows
            "DELETE FROM ds_streams s WHERE created_at <= %s"
            " AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id)",
            (moment - self.retention.unfinished,),
        )
        await conn.execute(
            "DELETE FROM ds_producers p WHERE NOT EXISTS (SELECT 1 FROM ds_streams s WHERE s.run_id = p.run_id)"
        )
        await conn.execute(  # forks recorded and never copied (their copy failed and was not retried)
            "DELETE FROM forks f WHERE created_at <= %s"
            " AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = f.run_id)",
            (moment - self.retention.unfinished,),
        )
        return SweepResult(runs=run_ids, events=deleted)

    # ---- span export cursors -------------------------------------------
    async def export_claim(self, roots: Sequence[str], holder: str, hold_s: float) -> dict[str, int]:
        if not roots:
            return {}
        now = self.clock().timestamp()
        rows = await self._write(
            "INSERT INTO span_exports AS x (root_id, seq, holder, held_until)"
            " SELECT root, 0, %(holder)s, %(until)s FROM unnest(%(roots)s::text[]) AS root"
            " ON CONFLICT (root_id) DO UPDATE SET holder = excluded.holder, held_until = excluded.held_until"
            " WHERE x.holder = excluded.holder OR x.held_until < %(now)s RETURNING root_id, seq",
            {"roots": list(roots), "holder": holder, "until": now + hold_s, "now": now})
        return {str(root): int(seq) for root, seq in rows}

    async def export_commit(
        self, moves: Sequence[tuple[str, int, int]], holder: str, hold_s: float
    ) -> list[str]:
        if not moves:
            return []
        rows = await self._write(
            "UPDATE span_exports AS x SET seq = m.after, held_until = %(until)s"
            " FROM unnest(%(roots)s::text[], %(befores)s::bigint[], %(afters)s::bigint[]) AS m(root, before, after)"
            " WHERE x.root_id = m.root AND x.holder = %(holder)s AND x.seq = m.before RETURNING x.root_id",
            {"roots": [m[0] for m in moves], "befores": [m[1] for m in moves], "afters": [m[2] for m in moves],
             "holder": holder, "until": self.clock().timestamp() + hold_s})
        return [str(row[0]) for row in rows]

    async def export_behind(self, since: datetime, until: datetime, limit: int) -> list[str]:
        rows = await self._fetch(
            "SELECT r.run_id FROM runs r LEFT JOIN span_exports x ON x.root_id = r.run_id"
            " WHERE r.parent_id IS NULL AND r.updated_at >= %s AND r.updated_at <= %s"
            " AND r.last_seq > coalesce(x.seq, 0) ORDER BY r.updated_at LIMIT %s", (since, until, limit))
        return [str(row[0]) for row in rows]

    async def _write(self, sql: str, args: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement on the writing connection, in its own transaction."""
        async with self._writer.lock:
            conn = await self._writer.get()
            try:
                async with conn.transaction():
                    return await (await conn.execute(sql, args)).fetchall()
            except psycopg.OperationalError as exc:
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL: {exc}") from exc
