"""The SQLite log's multi-row statements: every row written once, whatever their number and
whatever the SQLite build's limit on a statement's parameters."""

from __future__ import annotations

import sqlite3

import pytest

from runwire.store.sqlite.statements import ROWS_PER_STATEMENT, execute_rows


@pytest.mark.parametrize("limit", [999, 32766])
def test_rows_go_in_statements_that_hold_each_row_once(limit: int) -> None:
    db = sqlite3.connect(":memory:")
    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
    db.execute("CREATE TABLE t (a INTEGER NOT NULL, b TEXT, c BLOB)")
    written = 0
    for count in (0, 1, 3, 52, 53, ROWS_PER_STATEMENT - 1, ROWS_PER_STATEMENT, ROWS_PER_STATEMENT + 1, 1337):
        rows = [(written + index, f"r{index}", bytes([index % 256])) for index in range(count)]
        execute_rows(db, "INSERT INTO t (a, b, c) ", 3, [value for row in rows for value in row])
        written += count
        assert db.execute("SELECT a, b, c FROM t WHERE a >= ? ORDER BY a", (written - count,)).fetchall() == rows
    assert db.execute("SELECT count(*), count(DISTINCT a) FROM t").fetchone() == (written, written)
