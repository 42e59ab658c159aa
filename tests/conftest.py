"""Session fixtures that give tests real services (see tests/services.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import (
    PostgresServer,
    RedisCluster,
    RedisServer,
    TansuBroker,
    provide,
)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis, shared by the session; tests use their own key prefixes or flush."""
    yield from provide("redis", "RUNWIRE_TEST_REDIS_URL", RedisServer)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, which the test may restart (data is lost on restart)."""
    server = RedisServer()
    try:
        server.start()
    except (AssertionError, OSError, RuntimeError) as exc:
        pytest.fail(f"cannot start redis-server: {exc}", pytrace=False)
    yield server
    server.close()


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
