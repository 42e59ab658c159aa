"""``bus_url``: one URL per backend under the contract (tests/bus/test_contract.py).

Each URL gets its own key prefix / name so tests sharing a session server
never see each other's entries, and small timeouts so claims happen fast.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from runwire.bus import open_bus

FAST = "claim_idle_ms=500&lease_ms=1000&max_deliveries=3"

CONTRACT_BACKENDS: list[str] = ["memory", "redis", "redis-cluster", "kafka"]
"""Backends the contract suite runs against; a backend joins by adding its name
here and a URL builder to ``URL_BUILDERS`` below."""

OUT_OF_PROCESS_BACKENDS = [b for b in CONTRACT_BACKENDS if b != "memory"]
"""Backends a separate process can share (the SIGKILL scenario)."""

READ_ON_FETCH_BACKENDS = [b for b in CONTRACT_BACKENDS if b != "kafka"]
"""Backends whose fetch reads the entries on the server when called, so every entry published
before it is ready to it; a Kafka consumer's are the records its client has fetched so far
(aiokafka fetches in the background), which a test can't see."""


def _unique() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _memory(request: pytest.FixtureRequest) -> str:
    return f"memory://{_unique()}?{FAST}"


def _redis(request: pytest.FixtureRequest) -> str:
    base: str = request.getfixturevalue("redis_url")
    return f"{base}?prefix={_unique()}&{FAST}"


def _redis_cluster(request: pytest.FixtureRequest) -> str:
    base: str = request.getfixturevalue("serving_redis_cluster_url")
    return f"{base}?prefix={_unique()}&{FAST}"


@pytest.fixture(scope="session")
def serving_redis_cluster_url(redis_cluster_url: str) -> str:
    """The cluster once every node agrees it is up (a new cluster answers CLUSTERDOWN
    on some nodes for a moment after ``cluster_state:ok`` on the first)."""
    from redis.cluster import RedisCluster
    from redis.exceptions import RedisError

    client = RedisCluster.from_url(redis_cluster_url.replace("redis+cluster://", "redis://"))
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                for node in client.get_primaries():
                    assert client.cluster_info(target_nodes=node)["cluster_state"] == "ok"
                for shard in range(64):
                    client.set(f"{{ready:{shard}}}", 1, px=1000)
                return redis_cluster_url
            except (AssertionError, RedisError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        client.close()


def _kafka(request: pytest.FixtureRequest) -> str:
    base: str = request.getfixturevalue("kafka_url")
    # a group session below the 6 s default so dead members leave fast, with margin for
    # heartbeats delayed on a busy machine
    return f"{base}?prefix={_unique()}&{FAST}&session_timeout_ms=2000"


URL_BUILDERS: dict[str, Callable[[pytest.FixtureRequest], str]] = {
    "memory": _memory,
    "redis": _redis,
    "redis-cluster": _redis_cluster,
    "kafka": _kafka,
}


@pytest.fixture(params=CONTRACT_BACKENDS)
def bus_url(request: pytest.FixtureRequest) -> str:
    """A fresh bus URL on each contract backend (``claim_idle_ms=500``, ``max_deliveries=3``)."""
    return URL_BUILDERS[request.param](request)


@pytest.fixture(params=OUT_OF_PROCESS_BACKENDS)
def shared_bus_url(request: pytest.FixtureRequest) -> str:
    """Like ``bus_url``, for backends another process can reach."""
    return URL_BUILDERS[request.param](request)


@pytest.fixture(params=READ_ON_FETCH_BACKENDS)
def read_on_fetch_bus_url(request: pytest.FixtureRequest) -> str:
    """Like ``bus_url``, for backends whose fetch reads what is on the server when called."""
    return URL_BUILDERS[request.param](request)


SDK_BACKENDS = ["memory", "redis", "kafka"]
"""Backends the publisher SDK and the requests channel are tested on."""


@pytest.fixture(params=SDK_BACKENDS)
async def sdk_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh bus URL on each SDK backend, with the backend's default timeouts (Kafka's
    group session shortened); a named memory bus lives while the fixture holds it."""
    if request.param == "memory":
        url = f"memory://{_unique()}"
        async with open_bus(url):
            yield url
        return
    base = request.getfixturevalue(f"{request.param}_url")
    fast = "&session_timeout_ms=2000" if request.param == "kafka" else ""
    yield f"{base}?prefix={_unique()}{fast}"
