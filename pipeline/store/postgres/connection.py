"""The PostgreSQL outbox's connection: one blocking psycopg connection on a thread of its own.

The outbox's statements are written once for both backends as DB-API calls
(``outbox.py``); SQLite runs them on the log's own thread, and PostgreSQL on
this one, apart from the log's two async connections, so a delivery loop's
claims and settles never wait behind a worker's append. The connection is
opened on first use and again after it broke (the server restarted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from ...core.errors import StoreError, StoreFull, StoreUnavailable

T = TypeVar("T")

DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE ``disk_full`` ("could not extend file …", "could not write to file
\"pg_wal/…\"": No space left on device)."""


def unavailable(exc: psycopg.OperationalError, what: str = "PostgreSQL") -> StoreUnavailable:
    """The retriable error of a failed statement or connection: :class:`StoreFull` when the
    server refused it for want of disk (a pause until there is room), else
    :class:`StoreUnavailable`."""
    kind = StoreFull if exc.sqlstate == DISK_FULL else StoreUnavailable
    return kind(f"{what}: {exc}")

class ThreadConnection:
    """Runs functions of one psycopg connection (autocommit: the outbox begins its own
    transactions) on one thread."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="runwire-outbox")

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        return self._conn

    def _work(self, fn: Callable[[Any], T]) -> T:
        try:
            return fn(self._connection())
        except psycopg.OperationalError as exc:
            raise unavailable(exc) from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc

    async def __call__(self, fn: Callable[[Any], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._work, fn)

    async def close(self) -> None:
        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=True)
