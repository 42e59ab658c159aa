"""Replay log fixtures: every store test runs on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.events import T0


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _postgres_schemas(base: str) -> Iterator[Callable[[], str]]:
    import psycopg

    made: list[str] = []

    def new() -> str:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        made.append(schema)
        return f"{base}?options=-csearch_path%3D{schema}"

    yield new
    with psycopg.connect(base, autocommit=True) as conn:
        for schema in made:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def new_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Makes URLs of fresh, isolated replay logs (a file each, or a schema each)."""
    if request.param == "sqlite":
        counter = iter(range(1_000_000))
        yield lambda: f"sqlite:///{tmp_path}/replay-{next(counter)}.db"
        return
    yield from _postgres_schemas(request.getfixturevalue("postgres_url"))


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL schema of the test's own, ``(schema, url of a log in it)``; dropped afterwards."""
    schemas = _postgres_schemas(postgres_url)
    url = next(schemas)()
    yield url.rpartition("%3D")[2], url
    next(schemas, None)


@pytest.fixture
def store_url(new_store_url: Callable[[], str]) -> str:
    return new_store_url()


