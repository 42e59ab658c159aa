"""``postgresql://``: the replay log on PostgreSQL (psycopg 3, async), for production.

``log`` (the :class:`~runwire.store.base.ReplayLog`: its two connections, the bulk append, the
queries), ``schema`` (the tables, made or migrated on connect), ``statements`` (the SQL and the
rows it takes), ``connection`` (the outbox's own connection on a thread, the error classes).
"""

from .log import PostgresLog

__all__ = ["PostgresLog"]
