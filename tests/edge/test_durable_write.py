"""Durable Streams write side onto runwire's ingest (Durable Streams protocol §5.1 create, §5.2 append,
§5.2.1 idempotent producers, §9.1 JSON mode)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.ulid import new_event_id
from runwire.store import open_store
from runwire.store.base import ReplayLog
from tests.e2e_harness import pipeline, unique, wait_for_terminal

from .harness import append, run_events, serve_edge
from .test_durable_clients import node

JSON_HEADERS = {"Content-Type": "application/json"}


def message(run_id: str, type: str = "text.delta", **payload: Any) -> dict[str, Any]:
    """A canonical envelope as a producer writes it (its seq is renumbered by the stream)."""
    body = payload or ({"text": "x"} if type.endswith(".delta") else {"state": "running"})
    event = envelope.make(type, body, id=new_event_id(), ts=envelope.now_ts(), run_id=run_id, seq=1)
    return envelope.to_builtins(event)


def producer(seq: int, epoch: int = 0, name: str = "p1") -> dict[str, str]:
    return {**JSON_HEADERS, "Producer-Id": name, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def test_put_creates_a_stream_once_and_refuses_a_run_written_elsewhere(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    await append(memory_bus, "sdk-run", run_events("sdk-run", 2))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        created = await http.put(url, headers=JSON_HEADERS)
        again = await http.put(url, headers=JSON_HEADERS)
        head = await http.head(url)
        elsewhere = await http.put(f"{edge.url}/v1/ds/runs/sdk-run", headers=JSON_HEADERS)
        not_json = await http.put(url, content=b"hello", headers={"Content-Type": "text/plain"})
        missing = await http.post(f"{edge.url}/v1/ds/runs/never-created", json=[message("never-created")])
    assert created.status_code == 201 and created.headers["location"].endswith(f"/v1/ds/runs/{run_id}")
    assert again.status_code == 200
    assert head.status_code == 200 and head.headers["stream-next-offset"] == "0" * 20
    assert elsewhere.status_code == 409
    assert not_json.status_code == 400
    assert missing.status_code == 404


async def test_idempotent_producer_retry_stale_epoch_and_gap(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """§5.2.1: a retried batch 204 (acknowledged, not applied again), a gap 409 with the expected seq, a
    stale epoch 403 with the current one, a new epoch starting past 0 is 400; bad JSON and [] are 400."""
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        await http.put(url, headers=JSON_HEADERS)
        batch = json.dumps([message(run_id, "run.lifecycle"), message(run_id)])
        first = await http.post(url, content=batch, headers=producer(0))
        retried = await http.post(url, content=batch, headers=producer(0))
        gap = await http.post(url, content=batch, headers=producer(2))
        bumped = await http.post(url, content=batch, headers=producer(0, epoch=1))
        stale = await http.post(url, content=batch, headers=producer(1, epoch=0))
        bad_start = await http.post(url, content=batch, headers=producer(3, epoch=2))
        bad_json = await http.post(url, content=b"{nope", headers=producer(1, epoch=1))
        empty = await http.post(url, content=b"[]", headers=producer(1, epoch=1))
        partial = await http.post(url, content=batch, headers={**JSON_HEADERS, "Producer-Id": "p1"})
    assert first.status_code == 200
    assert (first.headers["producer-epoch"], first.headers["producer-seq"]) == ("0", "0")
    assert first.headers["stream-next-offset"] == f"{2:020d}"
    assert retried.status_code == 204
    assert gap.status_code == 409
    assert (gap.headers["producer-expected-seq"], gap.headers["producer-received-seq"]) == ("1", "2")
    assert bumped.status_code == 200 and bumped.headers["stream-next-offset"] == f"{4:020d}"
    assert stale.status_code == 403 and stale.headers["producer-epoch"] == "1"
    assert bad_start.status_code == 400
    assert bad_json.status_code == 400 and empty.status_code == 400 and partial.status_code == 400


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_producer_state_survives_an_edge_restart_and_is_shared_by_every_edge(
    memory_bus: Bus, tmp_path: Path, run_id: str, backend: str, request: pytest.FixtureRequest
) -> None:
    """The dedupe state is in the replay log: a batch acknowledged by edge A is a duplicate on edge B and
    on an edge started afterwards on a fresh connection to the same log (SQLite file, PostgreSQL)."""
    if backend == "sqlite":
        url_of_log = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        url_of_log = request.getfixturevalue("postgres_url")
    batch = json.dumps([message(run_id, "run.lifecycle")])
    async with open_store(url_of_log) as store_a, open_store(url_of_log) as store_b:
        async with serve_edge(memory_bus, store_a) as a, serve_edge(memory_bus, store_b) as b:
            async with httpx.AsyncClient(timeout=10) as http:
                await http.put(f"{a.url}/v1/ds/runs/{run_id}", headers=JSON_HEADERS)
                on_a = await http.post(f"{a.url}/v1/ds/runs/{run_id}", content=batch, headers=producer(0))
                on_b = await http.post(f"{b.url}/v1/ds/runs/{run_id}", content=batch, headers=producer(0))
    async with open_store(url_of_log) as store_c, serve_edge(memory_bus, store_c) as c:
        async with httpx.AsyncClient(timeout=10) as http:
            after_restart = await http.post(f"{c.url}/v1/ds/runs/{run_id}", content=batch, headers=producer(0))
            next_one = await http.post(f"{c.url}/v1/ds/runs/{run_id}", content=batch, headers=producer(1))
    assert on_a.status_code == 200
    assert on_b.status_code == 204
    assert after_restart.status_code == 204
    assert next_one.status_code == 200 and next_one.headers["stream-next-offset"] == f"{2:020d}"


async def test_ds_idempotent_producer_appends_through_a_retried_request_without_a_duplicate(
    redis_url: str, tmp_path: Path
) -> None:
    """``@durable-streams/client``'s ``IdempotentProducer`` under node, through a fetch that sends one
    batch twice (its first answer lost): the second gets 204, and the run — read back through workers,
    the replay log and the Durable Streams read side — has every message exactly once, then closes."""
    run_id = unique("ds-write")
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}") as pipe, httpx.AsyncClient(timeout=30) as http:
        url = f"{pipe.edge.url}/v1/ds/runs/{run_id}"
        assert (await http.put(url, headers=JSON_HEADERS)).status_code == 201
        texts = ["one ", "two ", "three "]
        messages = [message(run_id, "run.lifecycle")] + [message(run_id, text=t) for t in texts]
        answer = await node({"mode": "produce", "url": url, "producer": "agent-1", "messages": messages,
                             "repeat_seq": 1, "close": True})
        await wait_for_terminal(pipe.store, run_id)
        read = await http.get(url, params={"offset": "-1", "detail": "full"})
    assert answer["statuses"][:3] == [200, 200, 204]  # seq 0, seq 1, seq 1 again
    events = read.json()
    assert [e["type"] for e in events] == ["run.lifecycle", "text.delta", "text.delta", "text.delta", "run.lifecycle"]
    assert [e["payload"].get("text") for e in events[1:4]] == texts
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert read.headers["stream-closed"] == "true"


async def test_pipelined_batches_land_once_and_in_order(redis_url: str, tmp_path: Path) -> None:
    """``IdempotentProducer`` with five batches in flight (§5.2.1 "HTTP requests can arrive out of
    order"): a batch that arrives before its predecessor gets 409 and is retried by the client; every
    message lands once, in append order."""
    run_id = unique("ds-pipelined")
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}") as pipe, httpx.AsyncClient(timeout=30) as http:
        url = f"{pipe.edge.url}/v1/ds/runs/{run_id}"
        assert (await http.put(url, headers=JSON_HEADERS)).status_code == 201
        texts = [f"t{i} " for i in range(60)]
        messages = [message(run_id, "run.lifecycle")] + [message(run_id, text=t) for t in texts]
        answer = await node({"mode": "produce", "url": url, "producer": "agent-2", "messages": messages,
                             "repeat_seq": -1, "close": True, "pipelined": True, "in_flight": 5, "batch_bytes": 600})
        await wait_for_terminal(pipe.store, run_id)
        read = await http.get(url, params={"offset": "-1", "detail": "full"})
    assert len(answer["statuses"]) >= 10  # many batches, several in flight at once
    events = read.json()
    assert [e["payload"].get("text") for e in events[1:-1]] == texts
    assert [e["seq"] for e in events] == list(range(1, len(texts) + 3))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_retry_with_a_different_body_is_refused_not_dropped(
    memory_bus: Bus, tmp_path: Path, run_id: str, backend: str, request: pytest.FixtureRequest
) -> None:
    """Producer fencing (§5.2.1): one ``(producer, epoch, seq)`` names one batch. A "retry" of the
    latest batch with other messages is 409 with the code — never acknowledged while its messages
    are silently dropped — and the true retry is still 204; the stream holds the first batch only."""
    url_of_log = f"sqlite:///{tmp_path / 'fence.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    first = json.dumps([message(run_id, "run.lifecycle"), message(run_id, text="kept")])
    other = json.dumps([message(run_id, text="smuggled"), message(run_id, "run.lifecycle", state="done")])
    async with open_store(url_of_log) as log, serve_edge(memory_bus, log) as edge, \
            httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        await http.put(url, headers=JSON_HEADERS)
        accepted = await http.post(url, content=first, headers=producer(0))
        changed = await http.post(url, content=other, headers=producer(0))
        retried = await http.post(url, content=first, headers=producer(0))
    assert accepted.status_code == 200
    assert changed.status_code == 409 and changed.json()["code"] == "KAI-STREAM-REQ-0003"
    assert "producer-expected-seq" not in changed.headers
    assert retried.status_code == 204
    async with memory_bus.consumer("check", "c") as consumer:
        got = [envelope.decode(d.data) for d in await consumer.fetch(100, block_ms=100)]
    texts = [e.payload_dict().get("text") for e in got if e.type == "text.delta"]
    assert "smuggled" not in texts and texts.count("kept") >= 1


async def test_a_stream_remembers_a_bounded_number_of_producers(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Producer ids are the writer's to invent, so a stream keeps at most ``MAX_PRODUCERS`` of them:
    a new one past it is 429 with the quota code; the producers it has go on."""
    from runwire.store.producers import MAX_PRODUCERS

    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        await http.put(url, headers=JSON_HEADERS)
        statuses = []
        for index in range(MAX_PRODUCERS + 1):
            batch = json.dumps([message(run_id, text=f"m{index}")])
            statuses.append((await http.post(url, content=batch, headers=producer(0, name=f"p{index}"))).status_code)
        over = await http.post(url, content=json.dumps([message(run_id)]), headers=producer(0, name="late"))
        known = await http.post(url, content=json.dumps([message(run_id)]), headers=producer(1, name="p0"))
    assert statuses[:MAX_PRODUCERS] == [200] * MAX_PRODUCERS and statuses[-1] == 429
    assert over.status_code == 429 and over.json()["code"] == "KAI-STREAM-REQ-0005"
    assert over.headers["retry-after"] == "1"
    assert known.status_code == 200
