"""The outbox: signed HTTP deliveries kept in the replay log's store until a receiver took them.

Three tables, in the same SQLite file or PostgreSQL database as the events,
so a delivery outlives any process and is made in the same place as the
write that caused it:

* ``run_notices`` — written in the same transaction as a run's own
  ``run.lifecycle`` event whose state ends the run (``run.finished``, one per
  run: the key is the run id) or asks for approval (``run.awaiting_approval``,
  one per such event). Each is turned into deliveries by :meth:`Outbox.fan_out`
  and deleted in that same transaction — but for a fork's events copied from
  its source (at or before its ``forks.at_seq``), which notify nobody.
* ``webhooks`` — subscriptions: a tenant's URL, the event types it wants, an
  optional run filter, its signing secret (and the previous one for a while
  after a rotation), whether it is disabled and why, its last success and failure.
* ``deliveries`` — one JSON body for one URL, with the secrets to sign it
  with, its ``id`` (the Standard Webhooks ``webhook-id``, the same on every
  attempt), its ``channel`` (who it is for: a webhook's id, or another
  owner's name) and when it is next due. :meth:`Outbox.claim` leases due
  ones (their ``next_at`` moves past the lease, so a process that dies
  mid-send leaves them to be claimed again), :meth:`Outbox.settle` deletes
  the delivered, reschedules the failed and marks the exhausted. At least
  once: a row is deleted only after a receiver answered 2xx.

One implementation for both backends: the statements are written once with
``?`` placeholders (PostgreSQL's ``%s`` is substituted) and run as plain
DB-API calls through a :data:`Runner` — the SQLite log's own thread and
connection, or a PostgreSQL connection on a thread of its own
(``postgres/connection.py``). Times are epoch seconds (floats) in both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from .outbox_schema import (
    AWAITING_APPROVAL,
    FINISHED,
    INSERT_NOTICE,
    NOTICE_TYPES,
    POSTGRES,
    SQLITE,
    Delivery,
    Dialect,
    Notice,
    Outcome,
    Subscription,
    ddl,
    in_dialect,
    notice_rows,
)

T = TypeVar("T")

class Connection(Protocol):
    def execute(self, sql: Any, params: Sequence[Any] = ...) -> Any: ...
    def cursor(self) -> Any: ...


Runner = Callable[[Callable[[Any], T]], Awaitable[T]]
"""Runs a function of one DB-API connection where that connection lives (its thread), mapping the
driver's errors to ``StoreUnavailable`` / ``StoreError``."""


_SUBSCRIPTION_COLUMNS = ("id, tenant, url, events, run_id, secret, previous_secret, previous_until, created_at,"
                         " disabled_at, disabled_reason, last_success_at, last_failure_at, last_error, headers")
_DELIVERY_COLUMNS = "id, channel, url, body, secrets, headers, attempts, created_at"
_json = msgspec.json.Encoder()
_list = msgspec.json.Decoder(list[str])
_headers = msgspec.json.Decoder(dict[str, str])


def _subscription(row: Sequence[Any]) -> Subscription:
    return Subscription(
        id=row[0], tenant=row[1], url=row[2], events=_list.decode(row[3]), run_id=row[4], secret=row[5],
        previous_secret=row[6], previous_until=row[7], created_at=row[8], disabled_at=row[9],
        disabled_reason=row[10], last_success_at=row[11], last_failure_at=row[12], last_error=row[13],
        headers=_headers.decode(row[14]))


def _delivery(row: Sequence[Any]) -> Delivery:
    return Delivery(id=row[0], channel=row[1], url=row[2], body=bytes(row[3]), secrets=row[4],
                    headers=_headers.decode(row[5]), attempts=row[6], created_at=row[7])


Build = Callable[[Notice, list[Subscription]], list[Delivery]]
"""Turns one notice into deliveries for the subscriptions (of its tenant, enabled) that want it."""


__all__ = ["AWAITING_APPROVAL", "FINISHED", "INSERT_NOTICE", "NOTICE_TYPES", "POSTGRES", "SQLITE", "Build",
           "Delivery", "Dialect", "Notice", "Outbox", "Outcome", "Runner", "Subscription", "ddl", "in_dialect",
           "notice_rows"]


class Outbox:
    """The outbox of one replay log (:meth:`ReplayLog.outbox`); every method one transaction."""

    def __init__(self, run: Runner[Any], dialect: Dialect, clock: Callable[[], float]) -> None:
        self._run = run
        self.dialect = dialect
        self.clock = clock

    def _tx(self, conn: Connection, work: Callable[[Callable[..., Any]], T]) -> T:
        """``work(execute)`` in one transaction, rolled back on any error."""

        def execute(statement: str, params: Sequence[Any] = (), *, rows: Sequence[Sequence[Any]] = ()) -> Any:
            """One statement, or with ``rows`` one statement per row in one call (``executemany``:
            one round trip to PostgreSQL in pipeline mode)."""
            sql = in_dialect(statement, self.dialect.placeholder)
            if rows:
                return conn.cursor().executemany(sql, rows)
            return conn.execute(sql, params)

        conn.execute(self.dialect.begin)
        try:
            result = work(execute)
        except BaseException as error:
            try:
                conn.execute("ROLLBACK")
            except Exception as also:  # the driver ended the transaction itself
                error.add_note(f"ROLLBACK after it failed too: {also}")
            raise
        conn.execute("COMMIT")
        return result

    async def _do(self, work: Callable[[Callable[..., Any]], T]) -> T:
        result: T = await self._run(lambda conn: self._tx(conn, work))
        return result

    # ---- subscriptions ---------------------------------------------------------------
    async def add_webhook(self, sub: Subscription, *, most: int | None = None) -> bool:
        """Add a webhook; with ``most``, only while its tenant has fewer (False, and nothing added,
        else) — counted and added in one transaction that no other adding one for the tenant
        interleaves with, so concurrent adds, on one edge or several, never pass the bound."""

        def add(ex: Callable[..., Any]) -> bool:
            if most is not None:
                if self.dialect.serialize:
                    ex(self.dialect.serialize, (f"runwire.webhooks {sub.tenant or ''}",))
                where, params = ("tenant IS NULL", ()) if sub.tenant is None else ("tenant = ?", (sub.tenant,))
                if ex(f"SELECT count(*) FROM webhooks WHERE {where}", params).fetchone()[0] >= most:
                    return False
            ex(f"INSERT INTO webhooks ({_SUBSCRIPTION_COLUMNS}) VALUES ({', '.join('?' * 15)})",
               (sub.id, sub.tenant, sub.url, _json.encode(sub.events).decode(), sub.run_id, sub.secret,
                sub.previous_secret, sub.previous_until, sub.created_at, sub.disabled_at, sub.disabled_reason,
                sub.last_success_at, sub.last_failure_at, sub.last_error, _json.encode(sub.headers).decode()))
            return True

        return await self._do(add)

    async def webhooks(self, tenant: str | None, *, every: bool = False) -> list[Subscription]:
        """A tenant's webhooks (``every``: all of them, whoever's), oldest first."""
        where, params = ("", ()) if every else (
            ("WHERE tenant IS NULL", ()) if tenant is None else ("WHERE tenant = ?", (tenant,)))
        rows = await self._do(lambda ex: ex(
            f"SELECT {_SUBSCRIPTION_COLUMNS} FROM webhooks {where} ORDER BY created_at, id", params).fetchall())
        return [_subscription(row) for row in rows]

    async def webhook(self, webhook_id: str) -> Subscription | None:
        row = await self._do(lambda ex: ex(
            f"SELECT {_SUBSCRIPTION_COLUMNS} FROM webhooks WHERE id = ?", (webhook_id,)).fetchone())
        return None if row is None else _subscription(row)

    async def remove_webhook(self, webhook_id: str) -> bool:
        """Delete a webhook and what it still had to deliver; False when there was none."""

        def remove(ex: Callable[..., Any]) -> bool:
            ex("DELETE FROM deliveries WHERE channel = ?", (webhook_id,))
            return ex("DELETE FROM webhooks WHERE id = ? RETURNING id", (webhook_id,)).fetchone() is not None

        return await self._do(remove)

    async def rotate_webhook(self, webhook_id: str, secret: str, previous_until: float) -> Subscription | None:
        """A new secret; the old one is still signed with until ``previous_until``, on the deliveries
        already queued too (each is signed afresh at every attempt)."""

        def rotate(ex: Callable[..., Any]) -> Any:
            row = ex("SELECT secret FROM webhooks WHERE id = ?", (webhook_id,)).fetchone()
            if row is None:
                return None
            ex("UPDATE webhooks SET secret = ?, previous_secret = ?, previous_until = ? WHERE id = ?",
               (secret, row[0], previous_until, webhook_id))
            ex("UPDATE deliveries SET secrets = ? WHERE channel = ? AND failed_at IS NULL",
               (f"{secret} {row[0]}", webhook_id))
            return ex(f"SELECT {_SUBSCRIPTION_COLUMNS} FROM webhooks WHERE id = ?", (webhook_id,)).fetchone()

        row = await self._do(rotate)
        return None if row is None else _subscription(row)

    async def disable_channel(self, channel: str, reason: str) -> None:
        """Stop a channel: its webhook (if it is one) disabled with ``reason``, its queued deliveries
        marked failed (kept for :meth:`purge`)."""
        now = self.clock()
        await self._do(lambda ex: _disable(ex, channel, reason, now))

    # ---- notices -----------------------------------------------------------------------
    async def fan_out(self, build: Build, limit: int = 500) -> int:
        """Turn up to ``limit`` notices into deliveries (``build``) and delete them, atomically;
        how many notices were taken. Concurrent callers take different notices."""
        now = self.clock()

        def take(ex: Callable[..., Any]) -> int:
            rows = ex("SELECT key, type, run_id, root_id, coalesce(tenant, (SELECT r.tenant FROM runs r"
                      " WHERE r.run_id = run_notices.run_id)), state, seq, ts FROM run_notices"
                      f" ORDER BY created_at LIMIT ?{self.dialect.lock}", (limit,)).fetchall()
            if not rows:
                return 0
            taken = [Notice(key=r[0], type=r[1], run_id=r[2], root_id=r[3], tenant=r[4], state=r[5],
                            seq=r[6], ts=r[7]) for r in rows]
            copied = _fork_points(ex, sorted({n.run_id for n in taken}))
            notices = [n for n in taken if n.seq > copied.get(n.run_id, 0)]  # a fork's copied history is history
            tenants = sorted({n.tenant for n in notices if n.tenant is not None})
            subs = [_subscription(row) for row in ex(
                f"SELECT {_SUBSCRIPTION_COLUMNS} FROM webhooks WHERE disabled_at IS NULL AND"
                f" (tenant IS NULL OR tenant IN ({', '.join(['?'] * len(tenants)) or 'NULL'}))",
                tenants).fetchall()]
            deliveries = [d for notice in notices for d in build(notice, subs)] if subs else []
            self._insert(ex, deliveries, now)
            for start in range(0, len(taken), 500):
                keys = [n.key for n in taken[start:start + 500]]
                ex(f"DELETE FROM run_notices WHERE key IN ({', '.join(['?'] * len(keys))})", keys)
            return len(taken)

        return await self._do(take)

    # ---- deliveries --------------------------------------------------------------------
    def _insert(self, ex: Callable[..., Any], deliveries: Sequence[Delivery], now: float) -> None:
        if deliveries:
            ex(f"INSERT INTO deliveries ({_DELIVERY_COLUMNS}, next_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
               " ON CONFLICT (id) DO NOTHING",
               rows=[(d.id, d.channel, d.url, d.body, d.secrets, _json.encode(d.headers).decode(), d.attempts,
                      d.created_at or now, now) for d in deliveries])

    async def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        """Queue deliveries, due now; one already queued under its id is left as it is."""
        if deliveries:
            now = self.clock()
            await self._do(lambda ex: self._insert(ex, deliveries, now))

    async def claim(self, limit: int, lease_s: float, *, per_channel: int | None = None,
                    rooms: Mapping[str, int] | None = None) -> list[Delivery]:
        """Up to ``limit`` due deliveries, earliest first, leased for ``lease_s`` (due again after it,
        unless settled); with ``per_channel``, at most that many of one channel, or its ``rooms``
        entry (what is left of its share while some of its attempts are under way), taken from the
        earliest ``2 * limit`` due deliveries of the channels with room, so a claim's work does not grow
        with what waits behind them (a full channel's rows before them are stepped over)."""
        now = self.clock()
        params: list[Any]
        if per_channel is None:
            where, params = "", [now, limit]
        else:
            full = [channel for channel, room in (rooms or {}).items() if room <= 0]
            busy = [(channel, room) for channel, room in (rooms or {}).items() if room > 0]
            skip = f" AND channel NOT IN ({', '.join(['?'] * len(full))})" if full else ""
            cap = "coalesce((SELECT room FROM busy WHERE busy.channel = due.channel), ?)" if busy else "?"
            with_busy = f"WITH busy (channel, room) AS (VALUES {', '.join(['(?, ?)'] * len(busy))}) " if busy else ""
            where = (f"AND id IN ({with_busy}SELECT id FROM (SELECT id, next_at, row_number() OVER (PARTITION BY"
                     " channel ORDER BY next_at, id) AS nth, channel FROM (SELECT id, channel, next_at FROM deliveries"
                     f" WHERE failed_at IS NULL AND next_at <= ?{skip} ORDER BY next_at LIMIT ?) AS candidates) AS due"
                     f" WHERE nth <= {cap} ORDER BY next_at LIMIT ?)")
            params = [now, *(v for pair in busy for v in pair), now, *full, max(2 * limit, 32), per_channel,
                      limit, limit]

        def claim(ex: Callable[..., Any]) -> list[Delivery]:
            rows = ex(f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE failed_at IS NULL AND next_at <= ? {where}"
                      f" ORDER BY next_at LIMIT ?{self.dialect.lock}", params).fetchall()
            for start in range(0, len(rows), 500):
                ids = [row[0] for row in rows[start:start + 500]]
                ex(f"UPDATE deliveries SET next_at = ? WHERE id IN ({', '.join(['?'] * len(ids))})",
                   (now + lease_s, *ids))
            return [_delivery(row) for row in rows]

        return await self._do(claim)

    async def settle(self, delivered: Sequence[Outcome], retries: Sequence[tuple[Outcome, float]],
                     exhausted: Sequence[Outcome], refused: Sequence[Outcome] = ()) -> None:
        """Record attempts: delivered ones deleted, failed ones due again at their time, exhausted
        ones marked failed and their channel disabled (:meth:`disable_channel`), refused ones (no
        attempt can succeed: the target is refused) too, with the refusal as the reason; each
        channel's webhook (if it is one) keeps its last success and failure."""

        def settle(ex: Callable[..., Any]) -> None:
            for start in range(0, len(delivered), 500):
                ids = [o[0] for o in delivered[start:start + 500]]
                ex(f"DELETE FROM deliveries WHERE id IN ({', '.join(['?'] * len(ids))})", ids)
            if retries:
                ex("UPDATE deliveries SET attempts = attempts + 1, next_at = ?, last_error = ? WHERE id = ?",
                   rows=[(due, error, delivery_id) for (delivery_id, _, _, error), due in retries])
            for delivery_id, channel, at, error in exhausted:
                ex("UPDATE deliveries SET attempts = attempts + 1, failed_at = ?, last_error = ? WHERE id = ?",
                   (at, error, delivery_id))
                _disable(ex, channel, f"delivery {delivery_id} failed for good: {error}", at)
            for delivery_id, channel, at, error in refused:
                ex("UPDATE deliveries SET attempts = attempts + 1, failed_at = ?, last_error = ? WHERE id = ?",
                   (at, error, delivery_id))
                _disable(ex, channel, error or "refused", at)
            for channel, at in _latest(delivered).items():
                ex("UPDATE webhooks SET last_success_at = ? WHERE id = ?", (at, channel))
            failures = [*(o for o, _ in retries), *exhausted, *refused]
            for channel, at in _latest(failures).items():
                error = next(o[3] for o in reversed(failures) if o[1] == channel)
                ex("UPDATE webhooks SET last_failure_at = ?, last_error = ? WHERE id = ?", (at, error, channel))

        if delivered or retries or exhausted or refused:
            await self._do(settle)

    async def counts(self, channel: str) -> tuple[int, int]:
        """``(queued, failed)`` deliveries of a channel."""
        row = await self._do(lambda ex: ex(
            "SELECT count(*) - count(failed_at), count(failed_at) FROM deliveries WHERE channel = ?",
            (channel,)).fetchone())
        return int(row[0] or 0), int(row[1] or 0)

    async def purge(self, failed_before: float, notices_before: float) -> None:
        """Forget deliveries that failed before ``failed_before``, and notices nobody took before
        ``notices_before`` (no process fans out: nobody is subscribed through this log)."""

        def purge(ex: Callable[..., Any]) -> None:
            ex("DELETE FROM deliveries WHERE failed_at IS NOT NULL AND failed_at < ?", (failed_before,))
            ex("DELETE FROM run_notices WHERE created_at < ?", (notices_before,))

        await self._do(purge)


def _fork_points(ex: Callable[..., Any], run_ids: Sequence[str]) -> dict[str, int]:
    """The seq each of ``run_ids`` that is a fork was copied up to (``forks``, the replay log's table):
    its notices up to there are of events copied from its source, not its own."""
    found: dict[str, int] = {}
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start:start + 500]
        found.update((row[0], int(row[1])) for row in ex(
            f"SELECT run_id, at_seq FROM forks WHERE run_id IN ({', '.join(['?'] * len(chunk))})", chunk).fetchall())
    return found


def _disable(ex: Callable[..., Any], channel: str, reason: str, now: float) -> None:
    ex("UPDATE webhooks SET disabled_at = ?, disabled_reason = ? WHERE id = ? AND disabled_at IS NULL",
       (now, reason, channel))
    ex("UPDATE deliveries SET failed_at = ?, last_error = coalesce(last_error, ?)"
       " WHERE channel = ? AND failed_at IS NULL", (now, reason, channel))


def _latest(outcomes: Sequence[Outcome]) -> dict[str, float]:
    latest: dict[str, float] = {}
    for _, channel, at, _ in outcomes:
        latest[channel] = max(at, latest.get(channel, at))
    return latest
