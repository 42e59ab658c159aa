"""``sqlite://``: the replay log in one SQLite file, the embedded default.

``log`` (the :class:`~runwire.store.base.ReplayLog`: the writer thread's batched statements and
the queries), ``schema`` (the tables and the migrations), ``connection`` (transactions, the
busy timeout, WAL).
"""

from .log import SQLiteLog

__all__ = ["SQLiteLog"]
