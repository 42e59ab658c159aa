"""Fixtures for the security tests: buses and replay logs on real services, edges served for real."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SECRET = "security-test-secret-0123456789abcdefghij"


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



def new_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
