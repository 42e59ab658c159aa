"""``http://``: the publisher SDK through an edge's HTTP ingest (an agent that can't reach the bus)."""

from __future__ import annotations

import pytest

from runwire import Publisher, open_bus
from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.errors import BusUnavailable, ConfigError, DeliveryTimeout
from runwire.edge import EdgeSettings, issue_token
from runwire.store.base import ReplayLog
from tests.edge.harness import serve_edge
from tests.services import free_port

SECRET = "http-bus-test-secret-0123456789abcdefghij"


async def published(bus: Bus) -> list[envelope.Event]:
    async with bus.consumer("watch", "c1") as consumer:
        return [envelope.decode(d.data) for d in await consumer.fetch(1000, block_ms=300)]


async def test_a_run_with_a_child_published_over_http_reaches_the_bus_as_published(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """The same events as on the bus itself: seqs, parent and root links, order per run."""
    memory_bus.consumer("watch", "c1")
    async with serve_edge(memory_bus, store) as edge, Publisher.connect(edge.url) as pub:
        run = pub.run(run_id)
        await run.emit("text.delta", {"text": "hello "})
        child = pub.run(f"{run_id}.child", parent=run)
        await run.emit("child.spawn", {"child_id": child.run_id})
        await child.emit("tool.start", {"call_id": "c1", "tool": "search"})
        await child.finish()
        await run.finish()
    got = [(e.run_id, e.seq, e.type, e.parent_id, e.root_id) for e in await published(memory_bus)]
    assert got == [
        (run_id, 1, "text.delta", None, None),
        (run_id, 2, "child.spawn", None, None),
        (f"{run_id}.child", 1, "tool.start", run_id, run_id),
        (f"{run_id}.child", 2, "run.lifecycle", run_id, run_id),
        (run_id, 3, "run.lifecycle", None, None),
    ]


async def test_the_token_in_the_url_is_the_bearer_and_a_refusal_is_not_retried(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """With auth on, ``?token=`` authorizes the writes (the edge stamps its tenant); without it the
    edge's 401 ends delivery at once — a refusal, not an outage to wait out."""
    memory_bus.consumer("watch", "c1")
    token = issue_token(SECRET, tenant="acme", scopes=("write",))
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        async with Publisher.connect(f"{edge.url}?token={token}") as pub:
            await pub.run(run_id).emit("text.delta", {"text": "mine"})
        refused = Publisher.connect(edge.url, delivery_timeout=30)
        with pytest.raises(DeliveryTimeout, match="401|token"):
            async with refused as pub:
                await pub.run(f"{run_id}-anon").emit("text.delta", {"text": "anonymous"})
    assert [(e.run_id, e.tenant) for e in await published(memory_bus)] == [(run_id, "acme")]


async def test_an_edge_that_is_not_there_is_unavailable_and_nothing_else_is_offered() -> None:
    bus = open_bus(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BusUnavailable, match="unreachable"):
        await bus.connect()
    await bus.close()
    with pytest.raises(ConfigError, match="only publishes"):
        bus.consumer("g", "c")
    with pytest.raises(ConfigError, match="only publishes"):
        await bus.read(("r", "raw"), 0)
