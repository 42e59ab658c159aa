"""How the SQLite replay log talks to its file: the busy timeout, the write and read
transactions (an error never replaced by the rollback's), the switch to WAL."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

BUSY_TIMEOUT_S = 10.0
"""How long a statement waits for another connection's lock (opening included) before
"database is locked" (``StoreUnavailable``)."""


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error, which is then re-raised.

    ``IMMEDIATE`` takes the write lock up front: one writer across the
    processes sharing the file. Every write transaction of this module is one
    of these, so none can hide its first error (see :func:`undo`).
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException as error:
        undo(db, error, "ROLLBACK")
        raise


@contextmanager
def snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """A read transaction: the statements inside see one state of the file, whatever
    other processes commit meanwhile (WAL: no lock is taken from writers)."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("COMMIT")


def undo(db: sqlite3.Connection, error: BaseException, *statements: str) -> None:
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


def switch_to_wal(conn: sqlite3.Connection) -> None:
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
