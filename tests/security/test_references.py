"""References inside events never cross tenants (invariant 6; docs/security.md § References inside events).

An event names runs beyond its envelope's ``run_id``: ``parent_id`` and ``root_id``, the child a
``child.spawn`` attaches, a client-set ``child_id``. Each one is authorized like the run itself at
every entrance, and the worker — which links runs for fan-in — never links runs of two tenants,
whatever reached the bus (a publisher on the bus is not checked by any edge).

The attack these pin: tenant A publishes into its own run a ``child.spawn`` naming a run that
tenant B streams to; if fan-in trusted the link, A's live stream would carry B's deltas and tool
inputs, and B's tree would be rerouted under A's root.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.edge import EdgeSettings, issue_token
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from runwire.workers.runtime import run_worker
from tests.edge.harness import append, run_events, serve_edge
from tests.events import event
from tests.workers.checks import read_all

from .conftest import SECRET, new_id

REFUSED = "KAI-STREAM-AUTH-0003"


def bearer(tenant: str) -> dict[str, str]:
    token = issue_token(SECRET, tenant=tenant, scopes=("read", "write"))
    return {"Authorization": f"Bearer {token}"}


def ndjson(*events: Event) -> bytes:
    return b"".join(envelope.encode(e) + b"\n" for e in events)


async def _published(bus: Bus) -> list[Event]:
    consumer = bus.consumer("watch", "c1")
    try:
        return [envelope.decode(d.data) for d in await consumer.fetch(1000, block_ms=300)]
    finally:
        await consumer.close()


def hostile(run_a: str, run_b: str) -> list[Event]:
    """A's own run, then references to B's run from inside A's events."""
    return [
        event(run_a, 1, "run.lifecycle", {"state": "running"}),
        event(run_a, 2, "child.spawn", {"child_id": run_b}),
        event(run_a, 3, "text.delta", {"text": "as if from B"}, child_id=run_b),
    ]


async def _post_ingest(http: httpx.AsyncClient, run_a: str, run_b: str) -> list[tuple[int, str]]:
    response = await http.post(f"/v1/runs/{run_a}/events", content=ndjson(*hostile(run_a, run_b)),
                               headers=bearer("A"))
    assert response.status_code == 422, response.text
    assert response.json()["accepted"] == 1
    return [(r["line"], r["code"]) for r in response.json()["rejected"]]


async def _post_durable(http: httpx.AsyncClient, run_a: str, run_b: str) -> list[tuple[int, str]]:
    url = f"/v1/ds/runs/{run_a}"
    headers = {**bearer("A"), "Content-Type": "application/json"}
    created = await http.put(url, headers=headers)
    assert created.status_code in (200, 201), created.text
    refused: list[tuple[int, str]] = []
    for line, sent in enumerate(hostile(run_a, run_b)[1:], 2):
        response = await http.post(url, content=b"[" + envelope.encode(sent) + b"]", headers=headers)
        if response.status_code >= 300:
            assert response.status_code == 403, response.text
            refused.extend((line, r["code"]) for r in response.json()["rejected"])
    return refused


@pytest.mark.parametrize("entrance", ["ingest", "durable"])
async def test_a_spawn_or_child_id_naming_another_tenants_run_is_refused_at_the_entrance(
    memory_bus: Bus, store: ReplayLog, entrance: str
) -> None:
    """A ``child.spawn`` whose child is B's run, and an event claiming to come from B's run
    (``child_id``), are refused with ``KAI-STREAM-AUTH-0003``; A's own event goes through."""
    run_b, run_a = new_id("b"), new_id("a")
    events = run_events(run_b, 3, end=None, tenant="B")
    await store.append(events)
    await append(memory_bus, run_b, events)
    memory_bus.consumer("watch", "c1")
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        post = _post_ingest if entrance == "ingest" else _post_durable
        assert await post(http, run_a, run_b) == [(2, REFUSED), (3, REFUSED)]
    assert all(e.run_id == run_a and e.child_id is None and e.type != "child.spawn"
               for e in await _published(memory_bus))


async def test_a_spawn_claims_the_child_it_names_for_the_spawning_tenant(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """A fresh child id named by A's spawn is A's from then on: B cannot write to it later
    (the run id cannot be squatted the other way round either — the first writer decides)."""
    run_a, child = new_id("a"), new_id("child")
    spawn = [event(run_a, 1, "run.lifecycle", {"state": "running"}), event(run_a, 2, "child.spawn", {"child_id": child})]
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        mine = await http.post(f"/v1/runs/{run_a}/events", content=ndjson(*spawn), headers=bearer("A"))
        theirs = await http.post(f"/v1/runs/{child}/events",
                                 content=ndjson(event(child, 1, "text.delta", {"text": "squat"})),
                                 headers=bearer("B"))
    assert mine.status_code == 200, mine.text
    assert theirs.status_code == 403 and theirs.json()["code"] == REFUSED


async def _pull_attempt(bus: Bus) -> tuple[str, str, str, str]:
    """B streams a tree (root, child); A spawns B's root and B's child as its own children and
    starts a run claiming B's child as its parent. Returns (root_b, child_b, run_a, intruder)."""
    root_b, child_b, run_a, intruder_id = new_id("rootb"), new_id("childb"), new_id("a"), new_id("intruder")
    async with Publisher(bus) as pub_b, Publisher(bus) as pub_a:
        b = pub_b.run(root_b, tenant="B")
        bc = pub_b.run(child_b, parent=b)
        a = pub_a.run(run_a, tenant="A")
        await b.emit("text.delta", {"text": "b-root-1"})
        await bc.emit("text.delta", {"text": "b-child-1"})
        await pub_b.flush()  # B's tree is B's on the bus before A tries anything
        await a.emit("child.spawn", {"child_id": root_b})
        await a.emit("child.spawn", {"child_id": child_b})
        intruder = pub_a.run(intruder_id, tenant="A", parent=child_b, root=root_b)
        await intruder.emit("text.delta", {"text": "written into B's tree"})
        await bc.emit("tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "secret"}})
        await bc.emit("text.delta", {"text": "b-child-2"})
        await b.emit("text.delta", {"text": "b-root-2"})
        await bc.finish()
        await b.finish()
        await a.finish()
    return root_b, child_b, run_a, intruder_id


async def _nothing_pulled(bus: Bus, store: ReplayLog, runs: tuple[str, str, str, str]) -> None:
    root_b, child_b, run_a, intruder_id = runs
    assert [e.payload_dict()["text"] for e in await read_all(bus, intruder_id)] == ["written into B's tree"]
    streamed_a = await read_all(bus, run_a)
    assert [e.type for e in streamed_a] == ["child.spawn", "child.spawn", "run.lifecycle"]
    assert {e.tenant for e in streamed_a} == {"A"}
    tree_b = await read_all(bus, root_b)
    assert {e.tenant for e in tree_b} == {"B"}
    assert [(e.child_id, e.type) for e in tree_b] == [
        (None, "text.delta"), (child_b, "text.delta"), (child_b, "tool.start"), (child_b, "text.delta"),
        (None, "text.delta"), (child_b, "run.lifecycle"), (None, "run.lifecycle"),
    ]
    assert all(e.root_id is None for e in tree_b)
    assert {e.tenant for e in await read_all(bus, child_b)} == {"B"}
    assert {e.tenant for e in await store.read(run_a, limit=1000)} == {"A"}


async def test_a_bus_publisher_cannot_pull_another_tenants_tree_into_its_own(
    redis_bus: Bus, store: ReplayLog
) -> None:
    """On the bus no edge checks anything. The worker links none of A's references to B's runs:
    A's stream holds A's events only, B's tree is neither rerouted nor joined by A's events, and
    every one of B's events reaches B's streams exactly once."""
    runs = await _pull_attempt(redis_bus)
    stats = await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert stats.dead_lettered == 0
    await _nothing_pulled(redis_bus, store, runs)


@pytest.mark.slow
async def test_the_kafka_worker_links_no_run_of_another_tenant_either(
    kafka_url: str, tmp_path: Path, store: ReplayLog
) -> None:
    """The same attempt on Kafka, through the faust worker."""
    from runwire.bus import open_bus
    from runwire.processing.faust.worker import FaustWorker

    prefix = f"r{uuid.uuid4().hex[:8]}"
    async with open_bus(f"{kafka_url}?prefix={prefix}&session_timeout_ms=2000") as bus:
        runs = await _pull_attempt(bus)
        worker = FaustWorker(bus, store, group=f"{prefix}-g", name="f1", burst=True, data_dir=tmp_path / "data")
        stats = await asyncio.wait_for(worker.run(), 60)
        assert stats.dead_lettered == 0
        await _nothing_pulled(bus, store, runs)


async def test_an_event_of_another_tenant_on_a_run_is_dead_lettered_not_written(
    redis_bus: Bus, store: ReplayLog
) -> None:
    """A run belongs to its first writer's tenant on the bus too: a publisher of another tenant
    writing to it is dead-lettered with the reason, and the owner's events around it go on."""
    run_b = new_id("b")
    async with Publisher(redis_bus) as pub_b, Publisher(redis_bus) as pub_a:
        b = pub_b.run(run_b, tenant="B")
        await b.emit("text.delta", {"text": "one"})
        await pub_b.flush()  # B writes the run first (two publishers' batches race otherwise)
        forged = pub_a.run(run_b, tenant="A")
        await forged.emit("text.delta", {"text": "forged"})
        await b.emit("text.delta", {"text": "two"})
        await b.finish()
    stats = await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert stats.dead_lettered == 1 and stats.foreign == 1
    texts = [e.payload_dict().get("text") for e in await read_all(redis_bus, run_b)]
    assert texts == ["one", "two", None]


async def test_a_squatted_run_id_reads_nothing_of_the_other_tenant(redis_bus: Bus, store: ReplayLog) -> None:
    """Run-id squatting, both orders. A posts first to an id B's bus publisher uses later: B's
    events are dead-lettered (the run is A's) and A's stream holds A's events only. B publishes
    first to an id A then posts to: A's write is refused and A's read is a 404."""
    squatted, taken = new_id("squat"), new_id("taken")
    async with Publisher(redis_bus) as pub_b:
        await pub_b.run(taken, tenant="B").emit("text.delta", {"text": "B's first"})
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    async with serve_edge(redis_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        posted = await http.post(f"/v1/runs/{squatted}/events", headers=bearer("A"), content=ndjson(
            event(squatted, 1, "run.lifecycle", {"state": "running"})))
        assert posted.status_code == 200, posted.text
        async with Publisher(redis_bus) as pub_b:
            late = pub_b.run(squatted, tenant="B")
            await late.emit("tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "B's secret"}})
            await late.finish()
        stats = await run_worker(redis_bus, store, group="g", name="w", burst=True)
        refused = await http.post(f"/v1/runs/{taken}/events", headers=bearer("A"), content=ndjson(
            event(taken, 2, "text.delta", {"text": "A into B's"})))
        read = await http.get(f"/v1/runs/{taken}/stream?detail=full", headers=bearer("A"))
    assert stats.dead_lettered == 2 and stats.foreign == 2
    assert {e.tenant for e in await read_all(redis_bus, squatted)} == {"A"}
    assert refused.status_code == 403 and refused.json()["code"] == REFUSED
    assert read.status_code == 404


async def test_replay_play_cannot_write_into_another_tenants_run(redis_bus: Bus, store: ReplayLog) -> None:
    """A logged run of tenant A whose events name B's run as their ``child_id`` (set by a client, or
    logged before references were checked) is played in place: its "child" events go out as events
    of B's run, and the workers refuse them — B's run holds B's events only."""
    from runwire.jobs.replay import play_run

    run_a, run_b = new_id("a"), new_id("b")
    async with Publisher(redis_bus) as pub_b:
        b = pub_b.run(run_b, tenant="B")
        await b.emit("text.delta", {"text": "B's own"})
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    await store.append([
        event(run_a, 1, "run.lifecycle", {"state": "running"}, tenant="A"),
        event(run_a, 2, "text.delta", {"text": "A as if B"}, child_id=run_b, tenant="A"),
        event(run_a, 3, "run.lifecycle", {"state": "done"}, tenant="A"),
    ])
    sent = await play_run(store, redis_bus, run_a, speed=0)
    stats = await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert sent == 3 and stats.foreign >= 1
    assert [(e.tenant, e.type) for e in await read_all(redis_bus, run_b)] == [("B", "text.delta")]
