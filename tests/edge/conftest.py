"""Fixtures for the edge: a bus (memory and real Redis) and a replay log (SQLite)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.bus import open_bus
from pipeline.bus.base import Bus
from pipeline.store import open_store
from pipeline.store.base import ReplayLog


@pytest.fixture(params=["memory", "redis"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """The bus on each backend: in-process and real Redis."""
    if request.param == "memory":
        url = "memory://"
    else:
        redis_url: str = request.getfixturevalue("redis_url")
        url = redis_url
    async with open_bus(url) as opened:
        yield opened


@pytest.fixture
async def memory_bus() -> AsyncIterator[Bus]:
    async with open_bus("memory://") as opened:
        yield opened


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReplayLog]:
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as opened:
        yield opened


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"
