"""Fixtures for the gRPC edge: a bus (memory and real Redis), a replay log (SQLite), a run id."""

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
    url = "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")
    async with open_bus(url) as opened:
        yield opened


@pytest.fixture
async def memory_bus() -> AsyncIterator[Bus]:
    async with open_bus("memory://") as opened:
        yield opened


@pytest.fixture
async def redis_bus(redis_url: str) -> AsyncIterator[Bus]:
    async with open_bus(redis_url) as opened:
        yield opened


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReplayLog]:
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as opened:
        yield opened


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"
