"""The replay log, selected by URL scheme; PostgreSQL's client loads only when used.

=========================  =================================
``sqlite:///path/to.db``   embedded default (``sqlite://:memory:`` in-process)
``postgresql://…``         production (``postgres://`` too)
=========================  =================================
"""

from __future__ import annotations

from typing import Any

from ..core.loader import load_entry, url_scheme
from .base import ReplayLog, RunInfo, SweepResult
from .retention import RetentionPolicy

BACKENDS: dict[str, str] = {
    "sqlite": "runwire.store.sqlite.log:SQLiteLog",
    "postgresql": "runwire.store.postgres.log:PostgresLog",
    "postgres": "runwire.store.postgres.log:PostgresLog",
}


def open_store(url: str, **options: Any) -> ReplayLog:
    """The replay log for ``url`` (not yet connected: ``async with open_store(url) as log``)."""
    unknown = f"unsupported store URL {url!r}; use sqlite:///path or postgresql://user@host/db"
    log: ReplayLog = load_entry(BACKENDS, url_scheme(url), unknown)(url, **options)
    return log


__all__ = ["BACKENDS", "ReplayLog", "RetentionPolicy", "RunInfo", "SweepResult", "open_store"]
