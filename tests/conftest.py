"""Session fixtures that give tests real services (see tests/services.py)."""

from __future__ import annotations

import contextlib
import gc
import subprocess
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.store import open_store
from runwire.store.base import ReplayLog
from tests.services import (
    HINTS,
    PostgresServer,
    RedisCluster,
    RedisServer,
    TansuBroker,
    own_server,
    provide,
)


@pytest.fixture(autouse=True)
def _kafka_clients_closed(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the Kafka broker leaves no Kafka client's connection open: after it (and after its
    event loop closed), what became garbage is collected here, and an unclosed connection fails
    this test. Left to the collector, it warned inside whichever test ran when the collector did,
    naming nothing of the test that left it."""
    yield
    if "kafka_url" not in request.fixturenames:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    unclosed = sorted({str(found.message) for found in caught if issubclass(found.category, ResourceWarning)})
    assert not unclosed, f"this test left clients or connections open: {unclosed}"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis, shared by the session; tests use their own key prefixes or flush."""
    yield from provide("redis", "RUNWIRE_TEST_REDIS_URL", RedisServer)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, which the test may restart (data is lost on restart)."""
    yield from own_server(RedisServer())


@pytest.fixture
async def admin(own_redis: RedisServer) -> AsyncIterator[Redis]:
    """A client of the test's own Redis for ``CONFIG SET maxmemory``; the limit is lifted after
    (unless the test left the server stopped)."""
    client = Redis.from_url(own_redis.url)
    try:
        yield client
    finally:
        with contextlib.suppress(RedisError):
            await client.config_set("maxmemory", 0)
        await client.aclose()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    yield from provide("redis", "RUNWIRE_TEST_REDIS_CLUSTER_URL", RedisCluster)


@pytest.fixture(scope="session")
def kafka_url() -> Iterator[str]:
    """A real Kafka-protocol broker (Tansu): consumer groups yes, idempotent producers no."""
    yield from provide("kafka", "RUNWIRE_TEST_KAFKA_URL", TansuBroker)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    yield from provide("postgres", "RUNWIRE_TEST_POSTGRES_URL", PostgresServer)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own (``synchronous_commit`` on, as deployed), which the test may
    stop (``pg_ctl stop -m immediate``) and start again (``resume``) with its data."""
    server = PostgresServer(durable=True)
    try:
        server.start()
    except (AssertionError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        server.close()
        pytest.fail(f"cannot start PostgreSQL: {exc}; {HINTS['postgres']}", pytrace=False)
    yield server
    server.close()


# ---- a bus, a replay log and a run id for a test (a directory's conftest may override) ----


@pytest.fixture(params=["memory", "redis"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """The bus on each backend: in-process and real Redis (keys under a prefix of its own)."""
    url = "memory://" if request.param == "memory" else _own_prefix(request.getfixturevalue("redis_url"))
    async with open_bus(url) as opened:
        yield opened


@pytest.fixture
async def memory_bus() -> AsyncIterator[Bus]:
    async with open_bus("memory://") as opened:
        yield opened


@pytest.fixture
async def redis_bus(redis_url: str) -> AsyncIterator[Bus]:
    async with open_bus(_own_prefix(redis_url)) as opened:
        yield opened


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL replay log of this test's own: a fresh schema on the session's server, dropped after.

    Tests that look at the whole log (a worker's sweep for silent runs, listings) must not see
    what earlier tests left in a shared database.
    """
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{postgres_url}{'&' if '?' in postgres_url else '?'}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReplayLog]:
    """A fresh SQLite replay log."""
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as opened:
        yield opened


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def _own_prefix(redis_url: str) -> str:
    return f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=t{uuid.uuid4().hex[:10]}"
