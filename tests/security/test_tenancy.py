"""One write rule at every entrance: an event writes only to runs of the caller's tenant.

Invariant 6 (tenants are isolated) for writes: every run an event
writes to — its ``run_id``, ``parent_id`` and ``root_id`` — is claimed for
the caller's tenant the first time any entrance sees it, atomically in the
replay log shared by every edge, and a writer of another tenant is refused
with ``KAI-STREAM-AUTH-0003``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.edge import EdgeSettings, issue_token
from runwire.store import open_store
from runwire.store.base import ReplayLog
from tests.edge.harness import EdgeServer, append, run_events, serve_edge
from tests.events import event

from .conftest import SECRET, new_id

REFUSED = "KAI-STREAM-AUTH-0003"


def bearer(tenant: str, *scopes: str, runs: list[str] | None = None) -> dict[str, str]:
    token = issue_token(SECRET, tenant=tenant, runs=runs, scopes=scopes or ("read", "write"))
    return {"Authorization": f"Bearer {token}"}


def ndjson(*events: Event) -> bytes:
    return b"".join(envelope.encode(e) + b"\n" for e in events)


async def published(bus: Bus, group: str) -> list[Event]:
    consumer = bus.consumer(group, "c1")
    try:
        return [envelope.decode(d.data) for d in await consumer.fetch(1000, block_ms=300)]
    finally:
        await consumer.close()


@pytest.fixture
async def live_b(memory_bus: Bus, store: ReplayLog) -> AsyncIterator[tuple[EdgeServer, str]]:
    """Tenant B's live run (logged and in the hot tier, not finished) behind an edge with auth."""
    run_b = new_id("b")
    events = run_events(run_b, 3, end=None, tenant="B")
    await store.append(events)
    await append(memory_bus, run_b, events)
    memory_bus.consumer("watch", "c1")  # the group exists before anything is posted
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        yield edge, run_b


async def test_an_event_naming_another_tenants_run_is_refused_even_when_it_names_the_callers_run(
    live_b: tuple[EdgeServer, str], memory_bus: Bus
) -> None:
    """Tenant A, with a write token for its own run, posts events whose ``run_id`` is B's live run and
    whose ``root_id`` is A's run: text, a seq far ahead (10^15, which would make B's later events look
    like duplicates) and an ``aborted`` lifecycle. Each is refused with a code; nothing reaches B's run."""
    edge, run_b = live_b
    run_a = new_id("a")
    hostile = [
        event(run_b, 4, "text.delta", {"text": "injected"}, root_id=run_a),
        event(run_b, 10**15, "text.delta", {"text": "far ahead"}, parent_id=run_a, root_id=run_a),
        event(run_b, 5, "run.lifecycle", {"state": "aborted"}, root_id=run_a),
    ]
    own = event(run_a, 1, "run.lifecycle", {"state": "running"})
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        response = await http.post(f"/v1/runs/{run_a}/events", content=ndjson(own, *hostile),
                                   headers=bearer("A", runs=[run_a]))
        star = await http.post(f"/v1/runs/{run_a}/events", content=ndjson(*hostile), headers=bearer("A"))
    assert response.status_code == 422, response.text
    assert response.json()["accepted"] == 1
    assert [(r["line"], r["code"]) for r in response.json()["rejected"]] == [(2, REFUSED), (3, REFUSED), (4, REFUSED)]
    assert star.status_code == 422 and star.json()["accepted"] == 0
    assert {e.run_id for e in await published(memory_bus, "watch")} == {run_a}


async def test_a_child_can_only_be_attached_to_a_parent_of_the_same_tenant(
    live_b: tuple[EdgeServer, str], memory_bus: Bus
) -> None:
    """A child run of tenant A that claims B's run as its parent (or root) is refused, and the
    refused child id is not claimed by the attempt (ancestors are checked first)."""
    edge, run_b = live_b
    child = new_id("child")
    as_parent = event(child, 1, "run.lifecycle", {"state": "running"}, parent_id=run_b, root_id=run_b)
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        refused = await http.post(f"/v1/runs/{child}/events", content=ndjson(as_parent), headers=bearer("A"))
        mine = event(child, 1, "run.lifecycle", {"state": "running"})
        later = await http.post(f"/v1/runs/{child}/events", content=ndjson(mine), headers=bearer("A"))
    assert refused.status_code == 422
    assert [r["code"] for r in refused.json()["rejected"]] == [REFUSED]
    assert later.status_code == 200, later.text
    assert [(e.run_id, e.tenant) for e in await published(memory_bus, "watch")] == [(child, "A")]


async def test_writing_to_another_tenants_run_by_its_url_is_a_coded_403(live_b: tuple[EdgeServer, str]) -> None:
    """A write whose path names a run of another tenant is refused before the body is read."""
    edge, run_b = live_b
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        response = await http.post(f"/v1/runs/{run_b}/events", content=ndjson(event(run_b, 9)), headers=bearer("A"))
    assert response.status_code == 403
    assert response.json()["code"] == REFUSED


async def test_two_tenants_posting_to_a_fresh_run_at_once_through_two_edges_one_wins(
    memory_bus: Bus, store_url: str
) -> None:
    """Two edge instances (each with its own connection to the shared replay log), the ingest backlog
    unprocessed (no worker): tenants A and B post to the same fresh run id at the same moment. Exactly
    one is accepted; the other is refused with a code, also after both edges restart."""
    run = new_id("fresh")
    async with open_store(store_url) as log_1, open_store(store_url) as log_2:
        settings = EdgeSettings(secret=SECRET)
        memory_bus.consumer("watch", "c1")
        async with serve_edge(memory_bus, log_1, settings) as one, serve_edge(memory_bus, log_2, settings) as two:
            async with httpx.AsyncClient(timeout=10) as http:
                answers = await asyncio.gather(*(
                    http.post(f"{edge.url}/v1/runs/{run}/events", headers=bearer(tenant),
                              content=ndjson(event(run, 1, "run.lifecycle", {"state": "running"})))
                    for edge, tenant in ((one, "A"), (two, "B"))
                ))
        statuses = sorted(a.status_code for a in answers)
        assert statuses in ([200, 403], [200, 422]), [a.text for a in answers]
        winner = "A" if answers[0].status_code == 200 else "B"
        loser = "B" if winner == "A" else "A"
        refused = next(a for a in answers if a.status_code != 200).json()
        assert refused.get("code") == REFUSED or [r["code"] for r in refused["rejected"]] == [REFUSED]
        assert {(e.run_id, e.tenant) for e in await published(memory_bus, "watch")} == {(run, winner)}
    async with open_store(store_url) as log_3, serve_edge(memory_bus, log_3, EdgeSettings(secret=SECRET)) as three:
        async with httpx.AsyncClient(timeout=10) as http:
            again = await http.post(f"{three.url}/v1/runs/{run}/events", headers=bearer(loser),
                                    content=ndjson(event(run, 2)))
    assert again.status_code == 403 and again.json()["code"] == REFUSED


async def test_a_token_for_one_run_may_create_children_under_it_but_not_write_to_other_runs(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """A token limited to ``runs=[root]`` writes the root and child runs it creates under it (also in
    a later request, to the child's own path), but can't reach another run of its own tenant by
    naming its root as the event's ``root_id``."""
    root, child, other = new_id("root"), new_id("child"), new_id("other")
    await store.append(run_events(other, 2, end=None, tenant="A"))
    narrow = bearer("A", runs=[root])
    spawn = event(child, 1, "run.lifecycle", {"state": "running"}, parent_id=root, root_id=root)
    more = event(child, 2, "text.delta", parent_id=root, root_id=root)
    sneaky = event(other, 3, "text.delta", root_id=root)
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        first = await http.post(f"/v1/runs/{root}/events", content=ndjson(event(root, 1), spawn), headers=narrow)
        second = await http.post(f"/v1/runs/{child}/events", content=ndjson(more), headers=narrow)
        third = await http.post(f"/v1/runs/{root}/events", content=ndjson(sneaky), headers=narrow)
    assert (first.status_code, second.status_code) == (200, 200), (first.text, second.text)
    assert third.status_code == 422
    assert [r["code"] for r in third.json()["rejected"]] == [REFUSED]


async def test_a_run_claimed_by_one_tenant_is_not_readable_by_another(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """A run known only by its claim (posted, not yet processed by a worker) is the claimant's:
    another tenant's token naming it reads 404, exactly like a run that does not exist."""
    run = new_id("claimed")
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        posted = await http.post(f"/v1/runs/{run}/events", content=ndjson(event(run, 1)), headers=bearer("A"))
        other = await http.get(f"/v1/runs/{run}/events.jsonl", headers=bearer("B", "read", runs=[run]))
        missing = await http.get(f"/v1/runs/{new_id()}/events.jsonl", headers=bearer("B", "read"))
    assert posted.status_code == 200
    assert (other.status_code, other.json()["code"]) == (missing.status_code, missing.json()["code"])
    assert (other.status_code, other.json()["code"]) == (404, "KAI-STREAM-RUN-0001")


async def test_claims_are_atomic_and_first_wins_on_every_replay_log(store_url: str) -> None:
    """``claim_run`` from many connections at once: one owner, the same answer for everyone."""
    run = new_id("race")
    logs = [open_store(store_url) for _ in range(4)]
    for log in logs:
        await log.connect()
    try:
        owners = await asyncio.gather(*(
            log.claim_run(run, tenant, run) for log in logs for tenant in ("A", "B", "C")
        ))
        assert len({o.tenant for o in owners}) == 1
        again = await logs[0].claim_run(run, "Z", "elsewhere")
        assert again == owners[0] == await logs[1].run_owner(run)
    finally:
        for log in logs:
            await log.close()


