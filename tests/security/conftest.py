"""Fixtures for the security tests: buses and replay logs on real services, edges served for real."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pipeline.bus import open_bus
from pipeline.bus.base import Bus
from pipeline.store import open_store
from pipeline.store.base import ReplayLog

SECRET = "security-test-secret-0123456789abcdefghij"


@pytest.fixture
async def memory_bus() -> AsyncIterator[Bus]:
    async with open_bus("memory://") as opened:
        yield opened


@pytest.fixture(params=["memory", "redis"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """The bus in-process and on a real Redis."""
    url = "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")
    async with open_bus(url) as opened:
        yield opened


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReplayLog]:
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh replay log: a SQLite file, or a schema of its own on a real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'replay.db'}"
        return
    import psycopg

    base: str = request.getfixturevalue("postgres_url")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{base}?options=-csearch_path%3D{schema}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def new_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
