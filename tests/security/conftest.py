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
    yield request.getfixturevalue("postgres_schema_url")



def new_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
