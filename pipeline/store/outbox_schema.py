"""The outbox's rows and tables: what a notice, a webhook and a delivery hold, and their DDL in
each dialect (``outbox.py`` works on them).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec

FINISHED = "run.finished"
AWAITING_APPROVAL = "run.awaiting_approval"
NOTICE_TYPES = (FINISHED, AWAITING_APPROVAL)
"""The run event types a subscription can ask for."""


class Notice(msgspec.Struct, kw_only=True, frozen=True):
    """A run event to notify subscribers of: written with the event that caused it."""

    key: str
    """Once per key: the run id for ``run.finished``; run id and seq for an approval."""
    type: str
    run_id: str
    root_id: str
    tenant: str | None
    state: str
    seq: int
    ts: str
    """The ``run.lifecycle`` event's own time (RFC 3339)."""


class Subscription(msgspec.Struct, kw_only=True):
    """A webhook: where a tenant wants to hear of which run events."""

    id: str
    tenant: str | None
    """The subscribing tenant; None (with auth off) hears of every tenant's runs."""
    url: str
    events: list[str]
    run_id: str | None = None
    """Only this run and the runs under it (their root), when set."""
    secret: str
    previous_secret: str | None = None
    previous_until: float | None = None
    created_at: float
    disabled_at: float | None = None
    disabled_reason: str | None = None
    last_success_at: float | None = None
    last_failure_at: float | None = None
    last_error: str | None = None
    headers: dict[str, str] = {}
    """Request headers every delivery carries (an A2A push config's token and ``Authorization``):
    secrets, never shown by ``/v1/webhooks``."""

    def secrets(self, now: float) -> str:
        """The secrets to sign with now, space-separated: the current one, and the previous one
        while it is still honoured after a rotation."""
        if self.previous_secret and (self.previous_until or 0.0) > now:
            return f"{self.secret} {self.previous_secret}"
        return self.secret


class Delivery(msgspec.Struct, kw_only=True):
    """One JSON body for one URL, signed with ``secrets``, delivered at least once."""

    id: str
    """The ``webhook-id``: the same on every attempt, so receivers dedupe on it."""
    channel: str
    """Who it is for (a webhook's id): what a failure that exhausts the schedule disables."""
    url: str
    body: bytes
    secrets: str = ""
    """Space-separated ``whsec_…`` secrets to sign with (empty: sent unsigned)."""
    headers: dict[str, str] = {}
    """More request headers (an owner's own authentication, say)."""
    attempts: int = 0
    """Attempts that failed so far."""
    created_at: float = 0.0


Outcome = tuple[str, str, float, str | None]
"""A settled attempt: ``(delivery id, channel, at, error)`` — ``error`` None when delivered."""


class Dialect(msgspec.Struct, frozen=True):
    placeholder: str
    begin: str
    lock: str
    """What a claiming SELECT ends with so concurrent claimers skip each other's rows."""
    real: str
    blob: str
    integer: str
    serialize: str
    """A statement that makes the transaction the only one at work on a key (``?``) until it ends, or
    "" where every writing transaction already is (SQLite's ``BEGIN IMMEDIATE``)."""


SQLITE = Dialect(placeholder="?", begin="BEGIN IMMEDIATE", lock="", real="REAL", blob="BLOB", integer="INTEGER",
                 serialize="")
POSTGRES = Dialect(placeholder="%s", begin="BEGIN", lock=" FOR UPDATE SKIP LOCKED", real="double precision",
                   blob="bytea", integer="bigint", serialize="SELECT pg_advisory_xact_lock(hashtext(?))")

_DDL = """
CREATE TABLE IF NOT EXISTS run_notices (
    key        TEXT PRIMARY KEY,
    type       TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    root_id    TEXT NOT NULL,
    tenant     TEXT,
    state      TEXT NOT NULL,
    seq        {integer} NOT NULL,
    ts         TEXT NOT NULL,
    created_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS run_notices_created ON run_notices (created_at);
CREATE TABLE IF NOT EXISTS webhooks (
    id              TEXT PRIMARY KEY,
    tenant          TEXT,
    url             TEXT NOT NULL,
    events          TEXT NOT NULL,
    run_id          TEXT,
    secret          TEXT NOT NULL,
    previous_secret TEXT,
    previous_until  {real},
    created_at      {real} NOT NULL,
    disabled_at     {real},
    disabled_reason TEXT,
    last_success_at {real},
    last_failure_at {real},
    last_error      TEXT,
    headers         TEXT NOT NULL DEFAULT '{{}}'
);
CREATE INDEX IF NOT EXISTS webhooks_tenant ON webhooks (tenant);
CREATE TABLE IF NOT EXISTS deliveries (
    id         TEXT PRIMARY KEY,
    channel    TEXT NOT NULL,
    url        TEXT NOT NULL,
    body       {blob} NOT NULL,
    secrets    TEXT NOT NULL DEFAULT '',
    headers    TEXT NOT NULL DEFAULT '{{}}',
    attempts   {integer} NOT NULL DEFAULT 0,
    next_at    {real} NOT NULL,
    failed_at  {real},
    last_error TEXT,
    created_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (next_at) WHERE failed_at IS NULL;
CREATE INDEX IF NOT EXISTS deliveries_channel ON deliveries (channel);
"""


@functools.lru_cache(maxsize=256)
def in_dialect(statement: str, placeholder: str) -> str:
    """A statement written with ``?`` placeholders, with the dialect's."""
    return statement.replace("?", placeholder)


def ddl(dialect: Dialect) -> str:
    """The outbox's tables in a dialect (``CREATE … IF NOT EXISTS``: run on every open)."""
    return _DDL.format(real=dialect.real, blob=dialect.blob, integer=dialect.integer)


INSERT_NOTICE = ("INSERT INTO run_notices (key, type, run_id, root_id, tenant, state, seq, ts, created_at)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING")
"""A notice, once per key (``?`` placeholders: see :func:`notice_rows`)."""


def notice_rows(notices: Sequence[Notice], now: float) -> list[tuple[Any, ...]]:
    """:data:`INSERT_NOTICE`'s parameters for each notice."""
    return [(n.key, n.type, n.run_id, n.root_id, n.tenant, n.state, n.seq, n.ts, now) for n in notices]
