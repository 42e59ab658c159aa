"""The PostgreSQL replay log down under an edge (``pg_ctl stop -m immediate`` on a server of the
test's own): ``/readyz`` names the store, a resume the hot tier covers is served from it, and a
resume that needs the log is refused with a 503 and ``Retry-After`` before its response starts —
never a stream that breaks off or a partial replay. All of it is served once the log is back."""

from __future__ import annotations

import asyncio

import httpx
import msgspec

from runwire.bus import open_bus
from runwire.store import open_store
from tests.edge.harness import append, publish, run_events, serve_edge
from tests.services import PostgresServer, RedisServer
from tests.waiting import until

HOT = "run-hot"
"""In the log and on the hot tier."""
LOGGED = "run-logged"
"""In the log only (its hot streams gone, as after the bus's grace)."""
TRIMMED = "run-trimmed"
"""In the log, its hot stream trimmed to seqs 6..10."""


async def _seqs(http: httpx.AsyncClient, run_id: str, after: int) -> tuple[int, str | None, list[int]]:
    """Status, ``Retry-After`` and the seqs of a raw NDJSON stream of ``run_id`` resumed after ``after``."""
    async with http.stream("GET", f"/v1/runs/{run_id}/stream", params={"detail": "full", "after": str(after)},
                           headers={"accept": "application/x-ndjson"}) as response:
        body = await response.aread()
    seqs = [msgspec.json.decode(line)["seq"] for line in body.splitlines() if line.strip()] \
        if response.status_code == 200 else []
    return response.status_code, response.headers.get("retry-after"), seqs


async def test_with_the_log_down_the_edge_serves_the_hot_tier_and_refuses_the_rest_with_503(
    own_redis: RedisServer, own_postgres: PostgresServer
) -> None:
    async with open_bus(own_redis.url) as bus, open_store(own_postgres.url) as store, \
            serve_edge(bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        await publish(bus, store, run_events(HOT, 10))
        await store.append(run_events(LOGGED, 10))
        trimmed = run_events(TRIMMED, 10)
        await store.append(trimmed)
        await append(bus, TRIMMED, trimmed[5:])
        assert await _seqs(http, HOT, 3) == (200, None, list(range(4, 11)))

        await asyncio.to_thread(own_postgres.stop)
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"ok": False, "store": "unavailable"})
        assert await _seqs(http, HOT, 3) == (200, None, list(range(4, 11)))  # the hot tier covers it
        assert await _seqs(http, TRIMMED, 7) == (200, None, [8, 9, 10])
        assert await _seqs(http, TRIMMED, 2) == (503, "1", [])  # seqs 3..5 are in the log only
        assert await _seqs(http, LOGGED, 3) == (503, "1", [])

        await asyncio.to_thread(own_postgres.resume)

        async def ready_again() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await until(ready_again, within=30, what="the edge ready again")
        assert await _seqs(http, TRIMMED, 2) == (200, None, list(range(3, 11)))
        assert await _seqs(http, LOGGED, 3) == (200, None, list(range(4, 11)))
