"""Forks at the edge: ``POST /v1/runs/{run_id}/fork`` and the Durable Streams fork (``PUT`` with
``Stream-Forked-From``, Durable Streams protocol §4.2), read on SSE and through the official Durable
Streams clients, continued by an SDK agent, with auth as every entrance."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope, limits
from runwire.edge import EdgeSettings
from runwire.jobs.replay import export_run
from runwire.processing.shaping import shape
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from runwire.store.outbox import NOTICE_TYPES, Subscription
from runwire.webhooks import notify
from runwire.workers.runtime import run_worker
from tests.workers.checks import run_tree

from .harness import (
    RUN_A,
    RUN_B,
    SECRET,
    decoded,
    event,
    publish,
    read_sse,
    run_events,
    serve_edge,
    token,
    two_tenants_runs,
)
from .test_durable_clients import node
from .test_durable_write import message

KEPT = ("id", "seq", "type", "ts", "child_id", "payload", "tenant")
"""What a fork keeps of each copied event (its run id is its own, and it is a root)."""


def kept(event: dict[str, Any]) -> dict[str, Any]:
    return {name: event.get(name) for name in KEPT}


async def sse(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    async with http.stream("GET", url) as response:
        assert response.status_code == 200
        events, _ = await read_sse(response)
    return decoded(events)


async def continue_fork(bus: Bus, fork_id: str) -> None:
    """An agent continuing the fork with the publisher SDK: its own seqs from 1, then done."""
    publisher = Publisher(bus)
    await publisher.start()
    run = publisher.run(fork_id)
    await run.emit("text.delta", {"text": "a different "})
    await run.emit("text.delta", {"text": "ending"})
    await run.finish("done")
    await publisher.flush()
    await publisher.close()


async def test_a_run_forked_mid_run_and_continued_reads_as_the_source_then_its_own_events(
    bus: Bus, store: ReplayLog
) -> None:
    """A live run tree forked at seq k while its source goes on; an SDK agent continues the fork.
    Read from seq 0 on SSE and through both official Durable Streams clients, and exported: the
    fork's first k events are the source's (children's with their ``child_id``), then its own from
    k+1; the source is unchanged; both runs' metadata say so."""
    from durable_streams import astream

    prefix = f"e{uuid.uuid4().hex[:8]}"
    events, _ = run_tree(prefix, deltas=8)
    source_id, fork_id = f"{prefix}_root", f"{prefix}_fork"
    half = len(events) // 2
    await bus.publish(events[:half])
    await run_worker(bus, store, group="g", name="w1", burst=True)
    k = (await store.require_run(source_id)).last_seq - 2
    async with serve_edge(bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=20) as http:
        made = await http.post(f"/v1/runs/{source_id}/fork", json={"at": k, "run_id": fork_id})
        assert made.status_code == 201, made.text
        assert made.json() == {"run_id": fork_id, "forked_from": {"run_id": source_id, "at": k}, "created": True}
        again = await http.post(f"/v1/runs/{source_id}/fork", json={"at": k, "run_id": fork_id})
        assert again.status_code == 200 and again.json()["created"] is False
        await bus.publish(events[half:])  # the source goes on
        await continue_fork(bus, fork_id)
        await run_worker(bus, store, group="g", name="w2", burst=True)

        source = await sse(http, f"/v1/runs/{source_id}/stream?detail=full")
        fork = await sse(http, f"/v1/runs/{fork_id}/stream?detail=full")
        shaped_fork = await sse(http, f"/v1/runs/{fork_id}/stream")
        ds: dict[str, list[dict[str, Any]]] = {}
        for run_id in (source_id, fork_id):
            async with astream(f"{edge.url}/v1/ds/runs/{run_id}", params={"detail": "full"}, live=False,
                               timeout=10) as response:
                ds[run_id] = [item async for item in response.iter_json()]
        by_node = {run_id: await node({"mode": "read", "url": f"{edge.url}/v1/ds/runs/{run_id}?detail=full",
                                       "live": False}) for run_id in (source_id, fork_id)}
        exported = {run_id: [json.loads(line) for line in
                             (await http.get(f"/v1/runs/{run_id}/events.jsonl")).text.splitlines()]
                    for run_id in (source_id, fork_id)}
        for run_id in (source_id, fork_id):  # what `runwire replay export` writes, byte for byte
            written = io.BytesIO()
            await export_run(store, run_id, written.write)
            assert (await http.get(f"/v1/runs/{run_id}/events.jsonl")).content == written.getvalue()
        fork_meta = (await http.get(f"/v1/runs/{fork_id}")).json()
        source_meta = (await http.get(f"/v1/runs/{source_id}")).json()
        listed = {r["run_id"]: r for r in (await http.get("/v1/runs")).json()["runs"]}

    logged_source = [json.loads(line) for line in
                     b"".join([chunk async for chunk, _ in store.iter_jsonl(source_id)]).splitlines()]
    assert source == logged_source and source[-1]["payload"] == {"state": "done"}  # the source, whole
    assert [e["seq"] for e in source] == list(range(1, len(source) + 1)) and len(source) > k + 2
    assert [kept(e) for e in fork[:k]] == [kept(e) for e in source[:k]]
    assert any(e.get("child_id") for e in fork[:k])
    assert {e["run_id"] for e in fork} == {fork_id}
    assert [e["seq"] for e in fork] == list(range(1, k + 4))
    assert [(e["type"], e.get("child_id")) for e in fork[k:]] == [
        ("text.delta", None), ("text.delta", None), ("run.lifecycle", None)]
    raw_fork = await store.read(fork_id)
    assert [json.loads(line) for line in
            b"".join([c async for c, _ in store.iter_jsonl(fork_id)]).splitlines()] == fork
    assert shaped_fork == [json.loads(envelope.encode(e)) for e in shape(raw_fork)]
    for run_id, read in ((source_id, source), (fork_id, fork)):
        assert ds[run_id] == read
        assert by_node[run_id]["items"] == read and by_node[run_id]["closed"] is True
        assert exported[run_id] == read
    assert fork_meta["forked_from"] == {"run_id": fork_id, "source_id": source_id, "at": k}
    assert source_meta["forks"] == [{"run_id": fork_id, "source_id": source_id, "at": k}]
    assert listed[fork_id]["forked_from"]["source_id"] == source_id
    assert listed[source_id]["forks"][0]["run_id"] == fork_id


async def test_a_durable_streams_fork_reads_through_the_official_clients_and_takes_appends(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """``PUT`` with ``Stream-Forked-From`` and a ``Stream-Fork-Offset`` a client was given (also as
    ``@durable-streams/client``'s and PyPI ``durable-streams``' create sends it): the fork's
    offsets are the source's up to there (read with both clients), a Durable Streams append
    continues after them; the same fork again is
    ``200``, another at that id ``409``, an offset past the tail ``400``, no source ``404``."""
    from durable_streams import astream

    await publish(memory_bus, store, run_events("ds-src", 5, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=20) as http:
        url = f"{edge.url}/v1/ds/runs"
        head = await node({"mode": "read", "url": f"{url}/ds-src?detail=full", "live": False})
        offset = head["offset"]
        await publish(memory_bus, store, run_events("ds-src", 3, start=6))  # the source goes on, and ends
        fork_headers = {"stream-forked-from": "/v1/ds/runs/ds-src", "stream-fork-offset": offset,
                        "content-type": "application/json"}
        created = await http.put("/v1/ds/runs/ds-fork", headers=fork_headers)
        assert created.status_code == 201, created.text
        assert created.headers["stream-next-offset"] == offset
        assert (await http.put("/v1/ds/runs/ds-fork", headers=fork_headers)).status_code == 200
        other = {**fork_headers, "stream-fork-offset": "0" * 19 + "3"}
        assert (await http.put("/v1/ds/runs/ds-fork", headers=other)).status_code == 409
        past = await http.put("/v1/ds/runs/ds-past", headers={**fork_headers, "stream-fork-offset": "0" * 18 + "99"})
        assert past.status_code == 400 and "past its end" in past.text
        assert (await http.put("/v1/ds/runs/plain", headers={"content-type": "application/json"})).status_code == 201
        assert (await http.put("/v1/ds/runs/plain", headers=fork_headers)).status_code == 409
        sub = await http.put("/v1/ds/runs/ds-sub", headers={**fork_headers, "stream-fork-sub-offset": "1"})
        assert sub.status_code == 400
        missing = await http.put("/v1/ds/runs/ds-none", headers={**fork_headers,
                                                                 "stream-forked-from": "/v1/ds/runs/nope"})
        assert missing.status_code == 404

        fork_of = {"Stream-Forked-From": "/v1/ds/runs/ds-src", "Stream-Fork-Offset": offset}
        by_node = await node({"mode": "create", "url": f"{url}/ds-fork-node", "headers": fork_of})
        assert by_node == {"created": True}
        from durable_streams import AsyncDurableStream

        handle = await AsyncDurableStream.create(f"{url}/ds-fork-py", content_type="application/json",
                                                 headers=fork_of)
        await handle.aclose()
        for made in ("ds-fork-node", "ds-fork-py"):
            async with astream(f"{url}/{made}", params={"detail": "full"}, live=False, timeout=10) as response:
                assert [item["id"] async for item in response.iter_json()] == [i["id"] for i in head["items"]]
        copied = await node({"mode": "read", "url": f"{url}/ds-fork?detail=full", "live": False})
        async with astream(f"{url}/ds-fork", params={"detail": "full"}, live=False, timeout=10) as response:
            by_python = [item async for item in response.iter_json()]
        appended = await http.post("/v1/ds/runs/ds-fork", json=[message("ds-fork", text="new")],
                                   headers={"stream-closed": "true"})
        assert appended.status_code in (200, 204), appended.text
        assert appended.headers["stream-next-offset"] > offset
        await run_worker(memory_bus, store, group="g", name="w", burst=True)
        whole = await node({"mode": "read", "url": f"{url}/ds-fork?detail=full", "live": False})
    assert [item["seq"] for item in head["items"]] == [1, 2, 3, 4, 5]
    assert copied["items"] == by_python == [{**item, "run_id": "ds-fork"} for item in head["items"]]
    assert copied["closed"] is False and copied["offset"] == offset
    assert [item["seq"] for item in whole["items"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [item["type"] for item in whole["items"][5:]] == ["text.delta", "run.lifecycle"]
    assert whole["closed"] is True and whole["offset"] > offset


async def test_a_fork_is_refused_like_a_read_and_written_like_any_run(memory_bus: Bus, store: ReplayLog) -> None:
    """Another tenant's run is refused as a read is (404); forking needs ``read`` on the source and
    ``write`` for the fork; the fork is the caller's tenant's; a seq past the end is a clear 400;
    an id that is another run's is refused; a bad body is 400."""
    await two_tenants_runs(memory_bus, store)
    a_rw = {"Authorization": f"Bearer {token('A', 'read', 'write')}"}
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        other = await http.post(f"/v1/runs/{RUN_B}/fork", json={"at": 2}, headers=a_rw)
        unknown = await http.post("/v1/runs/nope/fork", json={"at": 2}, headers=a_rw)
        read_only = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2},
                                    headers={"Authorization": f"Bearer {token('A', 'read')}"})
        anonymous = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2})
        past = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 5}, headers=a_rw)
        taken = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": RUN_B}, headers=a_rw)
        bad = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "when": "now"}, headers=a_rw)
        made = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2}, headers=a_rw)
        fork_id = made.json()["run_id"]
        b_reads = await http.get(f"/v1/runs/{fork_id}", headers={"Authorization": f"Bearer {token('B')}"})
        a_reads = await http.get(f"/v1/runs/{fork_id}", headers=a_rw)
    assert other.status_code == unknown.status_code == 404
    assert other.json()["code"] == unknown.json()["code"] == "KAI-STREAM-RUN-0001"
    assert read_only.status_code == 403 and anonymous.status_code == 401
    assert past.status_code == 400 and "past its end (its last seq is 4)" in past.json()["error"]
    assert taken.status_code in (403, 409)
    assert bad.status_code == 400
    assert made.status_code == 201 and fork_id.startswith("run_")
    assert b_reads.status_code == 404
    assert a_reads.json()["tenant"] == "A" and a_reads.json()["last_seq"] == 2
    assert a_reads.json()["forked_from"] == {"run_id": fork_id, "source_id": RUN_A, "at": 2}


async def test_a_fork_of_a_chats_run_is_the_threads_newest_run(memory_bus: Bus, store: ReplayLog) -> None:
    """The copied events keep their ``thread_id``: the fork is a run of the same thread, its newest,
    so a chat goes on from it; the fork of a finished run at an earlier seq is open."""
    await publish(memory_bus, store, run_events("chat-run", 5, thread_id="chat-1"))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        made = await http.post("/v1/runs/chat-run/fork", json={"at": 3, "run_id": "chat-retry"})
        listed = (await http.get("/v1/runs", params={"thread_id": "chat-1"})).json()["runs"]
        unknown = await http.get("/v1/runs/nope")
    assert made.status_code == 201
    assert [(r["run_id"], r["state"]) for r in listed] == [("chat-retry", "running"), ("chat-run", "done")]
    assert unknown.status_code == 404


async def test_a_forks_copied_history_notifies_nobody_and_its_own_events_do(memory_bus: Bus, store: ReplayLog) -> None:
    """The source's approval request and end, copied into a fork, are history: no webhook or A2A
    push hears of them as the fork's; the fork's own end is heard as any run's."""
    outbox = store.outbox()
    await outbox.add_webhook(Subscription(id="wh_all", tenant=None, url="https://example.com/hook",
                                          events=list(NOTICE_TYPES), secret="whsec_x", created_at=0.0))
    source = [event("notified", 1, "run.lifecycle", {"state": "running"}),
              event("notified", 2, "run.lifecycle", {"state": "awaiting_approval", "reason": "ok?"}),
              event("notified", 3, "text.delta", text="yes"),
              event("notified", 4, "run.lifecycle", {"state": "done"})]
    await publish(memory_bus, store, source)
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        whole = await http.post("/v1/runs/notified/fork", json={"at": 4, "run_id": "fork-whole"})
        mid = await http.post("/v1/runs/notified/fork", json={"at": 3, "run_id": "fork-mid"})
    assert whole.status_code == mid.status_code == 201
    await store.append([event("fork-mid", 4, "run.lifecycle", {"state": "error", "reason": "retried"})])
    while await outbox.fan_out(notify.build):
        pass
    heard = [json.loads(d.body)["data"] for d in await outbox.claim(100, 60.0)]
    assert sorted((h["run_id"], h["state"]) for h in heard) == [
        ("fork-mid", "error"), ("notified", "awaiting_approval"), ("notified", "done")]


async def test_forks_are_bounded_per_run_and_in_depth_and_a_refused_fork_claims_nothing(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``limits.FORKS_PER_RUN`` forks of a run; a chain of forks of forks stops at
    ``limits.FORK_DEPTH`` (the run at its end is refused a fork, one higher up is not): 429s that
    say why, and claim nothing."""
    monkeypatch.setattr(limits, "FORKS_PER_RUN", 2)
    monkeypatch.setattr(limits, "FORK_DEPTH", 2)
    await two_tenants_runs(memory_bus, store)
    a_rw = {"Authorization": f"Bearer {token('A', 'read', 'write')}"}
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10, headers=a_rw) as http:
        past = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 9, "run_id": "fork-past"})
        made = [await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": f"fork-{n}"}) for n in range(2)]
        again = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": "fork-0"})
        over = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": "fork-over"})
        second = await http.post("/v1/runs/fork-0/fork", json={"at": 2, "run_id": "depth-2"})
        third = await http.post("/v1/runs/depth-2/fork", json={"at": 1, "run_id": "depth-3"})
        beside = await http.post("/v1/runs/fork-0/fork", json={"at": 1, "run_id": "depth-2b"})
    assert past.status_code == 400
    assert [m.status_code for m in made] == [201, 201] and again.status_code == 200, "the same fork again is no new one"
    assert over.status_code == 429 and "2 forks" in over.json()["error"] and over.headers["retry-after"]
    assert await store.run_owner("fork-past") is None and await store.run_owner("fork-over") is None
    assert (await store.run_owner("fork-0")) is not None
    assert [second.status_code, beside.status_code] == [201, 201]
    assert third.status_code == 429 and third.headers["retry-after"]
    assert "2 deep" in third.json()["error"] and "depth-2" in third.json()["error"]
    assert await store.run_owner("depth-3") is None and await store.run("depth-3") is None


async def test_a_forks_copy_holds_one_of_the_tokens_streams(memory_bus: Bus, store: ReplayLog) -> None:
    """A token holding all its streams cannot start a copy (429) until it lets one go."""
    await two_tenants_runs(memory_bus, store)
    await publish(memory_bus, store, run_events("live-a", 2, end=None, tenant="A"))
    a_rw = {"Authorization": f"Bearer {token('A', 'read', 'write')}"}
    settings = EdgeSettings(secret=SECRET, streams_per_token=1)
    async with serve_edge(memory_bus, store, settings) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10, headers=a_rw) as http:
        async with http.stream("GET", "/v1/runs/live-a/stream") as held:
            assert held.status_code == 200
            refused = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": "fork-held"})
        claimed = await store.run_owner("fork-held")
        made = await http.post(f"/v1/runs/{RUN_A}/fork", json={"at": 2, "run_id": "fork-held"})
    assert refused.status_code == 429 and claimed is None, "a refused fork claims nothing"
    assert made.status_code == 201
