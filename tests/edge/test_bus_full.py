"""Invariant 8 at the edge: Redis at ``maxmemory`` (set on a redis-server of the test's own)
is a pause the edge names: ``/readyz`` says the bus is full, writes are refused with a 503 the
client retries (nothing half-published), a metric counts it, and all of it ends when memory
is raised."""

from __future__ import annotations

import httpx
from redis.asyncio import Redis

from runwire.bus import open_bus
from runwire.store import ReplayLog
from tests.edge.harness import run_events, serve_edge
from tests.services import RedisServer


def _ndjson(run_id: str) -> bytes:
    from runwire.core.envelope import encode

    return b"\n".join(encode(e) for e in run_events(run_id, 5))


def _paused(metrics: str, part: str, reason: str) -> float:
    prefix = f'runwire_edge_paused_total{{part="{part}",reason="{reason}"}} '
    values = [float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


async def test_the_edge_says_the_bus_is_full_refuses_writes_with_503_and_recovers(
    own_redis: RedisServer, store: ReplayLog
) -> None:
    admin = Redis.from_url(own_redis.url)
    try:
        async with open_bus(own_redis.url) as bus, serve_edge(bus, store) as edge, \
                httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
            assert (await http.get("/readyz")).json() == {"ok": True}
            await admin.config_set("maxmemory", 1)

            ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json() == {"ok": False, "bus": "full"}
            refused = await http.post("/v1/runs/run-full/events", content=_ndjson("run-full"))
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["accepted"] == 0
            assert _paused((await http.get("/metrics")).text, "bus", "full") >= 2

            await admin.config_set("maxmemory", 0)
            assert (await http.get("/readyz")).json() == {"ok": True}
            accepted = await http.post("/v1/runs/run-full/events", content=_ndjson("run-full"))
            assert accepted.status_code == 200 and accepted.json()["accepted"] == 5
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()
