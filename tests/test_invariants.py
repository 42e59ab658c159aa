"""The six invariants of docs/architecture.md, end to end on real services.

Each test runs the whole path: the publisher SDK → a Redis bus (a key prefix
of its own) → two workers sharing one consumer group (``run_worker``) →
delivery streams and the replay log (SQLite file or PostgreSQL) → the edge
served by uvicorn on a free port → SSE / NDJSON clients. See
``tests/e2e_harness.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import msgspec
import pytest
import redis.asyncio as aioredis

from runwire.bus import open_bus
from runwire.bus.keys import DATA_FIELD, ingest_key, lease_key, shard_for
from runwire.core import envelope
from runwire.edge import EdgeSettings
from runwire.processing import shaping
from tests.e2e_harness import (
    GROUP,
    bus_url,
    decoded,
    ndjson,
    pipeline,
    raw_stream_ids,
    same_shard,
    sse,
    unique,
    wait_for_stream_end,
    wait_for_terminal,
)
from tests.edge.harness import EdgeServer, read_sse
from tests.edge.test_backpressure import _sse_bodies, _stalled_sse
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'replay.db'}"


def child_and_call(event: dict[str, Any]) -> tuple[str | None, str]:
    return event.get("child_id"), event["payload"].get("call_id", event["type"])


# ---- 1 Order ---------------------------------------------------------------


async def test_invariant_1_order_clients_see_publish_order_and_each_childs_own_order(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 1 **Order**: "within a run, clients see events in publish order; within a parent,
    each child's events keep their own order (Koder agent stream §7 T5)". T5: "the client receives each child's
    events in per-child order" — here two children interleaved under one parent, over SSE and NDJSON."""
    parent_id = unique("order-parent")
    async with pipeline(redis_url, sqlite_url(tmp_path)) as pipe, httpx.AsyncClient(timeout=60) as http:
        pub = pipe.publisher
        parent = pub.run(parent_id, tenant="acme")
        kids = [pub.run(unique(f"order-child{i}"), parent=parent) for i in (1, 2)]
        published: list[tuple[str | None, str]] = []
        await parent.emit("run.lifecycle", {"state": "running"})
        published.append((None, "run.lifecycle"))
        for kid in kids:
            await parent.emit("child.spawn", {"child_id": kid.run_id})
            published.append((None, "child.spawn"))
        for step in range(40):
            kid = kids[(step * 7 // 3) % 2]  # an irregular interleaving
            call = f"{kid.run_id}:{step}"
            await kid.emit("tool.start", {"call_id": call, "tool": "search"})
            published.append((kid.run_id, call))
        for kid in kids:
            await kid.finish("done")
            published.append((kid.run_id, "run.lifecycle"))
        await parent.finish("done")
        published.append((None, "run.lifecycle"))
        await pub.flush()

        base = f"{pipe.edge.url}/v1/runs/{parent_id}"
        over_sse = decoded(await sse(http, f"{base}/stream?detail=full"))
        over_ndjson = await ndjson(http, f"{base}/stream?detail=full")
        child_alone = decoded(await sse(http, f"{pipe.edge.url}/v1/runs/{kids[0].run_id}/stream?detail=full"))

    for seen in (over_sse, over_ndjson):
        assert [child_and_call(e) for e in seen] == published  # the publish order, exactly
        assert [e["seq"] for e in seen] == list(range(1, len(published) + 1))
        assert all(e["run_id"] == parent_id for e in seen)
    for kid in kids:
        own = [call for child, call in published if child == kid.run_id]
        assert [child_and_call(e)[1] for e in over_sse if e.get("child_id") == kid.run_id] == own
    assert [child_and_call(e)[1] for e in child_alone] == [
        call for child, call in published if child == kids[0].run_id
    ]


# ---- 2 No loss, no duplicates ------------------------------------------------


@pytest.mark.slow
async def test_invariant_2_no_loss_no_duplicates_across_a_worker_crash_and_a_client_reconnect(
    redis_url: str, postgres_url: str
) -> None:
    """Invariant 2 **No loss, no duplicates**: "what a client and the replay log see is every published
    event exactly once — across worker crashes, rebalances, broker reconnects and client reconnects".
    A worker is killed mid-stream (its shards and pending entries move to the other member, then it
    comes back: a rebalance), a client disconnects mid-stream and resumes with ``Last-Event-ID`` on
    another edge instance (resume needs only shared state); the replay log is PostgreSQL."""
    runs = [unique(f"noloss{i}") for i in range(3)]
    per_run = 200
    async with pipeline(redis_url, postgres_url) as pipe, httpx.AsyncClient(timeout=60) as http:
        handles = [pipe.publisher.run(run_id, tenant="acme") for run_id in runs]
        published: dict[str, list[str]] = {run_id: [] for run_id in runs}

        async def publish(start: int, stop: int) -> None:
            for index in range(start, stop):
                for handle in handles:
                    if index == 0:
                        event = await handle.emit("run.lifecycle", {"state": "running"})
                    elif index == per_run - 1:
                        event = await handle.finish("done")
                    else:
                        event = await handle.emit("tool.start", {"call_id": f"c{index}", "tool": "t"})
                    published[handle.run_id].append(event.id)
                if index % 20 == 0:
                    await asyncio.sleep(0.01)  # an agent emits over time: the crash lands mid-stream
            await pipe.publisher.flush()

        watched = f"{pipe.edge.url}/v1/runs/{runs[0]}/stream?detail=full"
        first_half: list[dict[str, Any]] = []
        async with http.stream("GET", watched) as response:
            await publish(0, 60)
            async for line in response.aiter_lines():  # read a while, then drop the connection
                if line.startswith("data: "):
                    first_half.append(json.loads(line[6:]))
                    if len(first_half) == 40:
                        break
        publishing = asyncio.create_task(publish(60, 130))
        await until(lambda: len(published[runs[0]]) >= 70, what="publishing under way")
        assert pipe.workers[0].alive
        await pipe.workers[0].crash()  # killed while events are being published and processed
        await publishing
        pipe.workers[0].start()
        await publish(130, per_run)
        last_id = str(first_half[-1]["seq"])
        async with open_bus(pipe.url) as other_bus:  # the client comes back through another edge instance
            other = EdgeServer(other_bus, pipe.store, EdgeSettings())
            await other.start()
            try:
                elsewhere = watched.replace(pipe.edge.url, other.url)
                second_half = decoded(await sse(http, elsewhere, headers={"Last-Event-ID": last_id}))
            finally:
                await other.stop()
        for run_id in runs:
            await wait_for_terminal(pipe.store, run_id, within=60)
            await wait_for_stream_end(pipe.bus, run_id)  # views are written after the log
        logged = {run_id: [e.id for e in await pipe.store.read(run_id)] for run_id in runs}
        streams = {run_id: await raw_stream_ids(pipe.bus, run_id) for run_id in runs}

    client = first_half + second_half
    assert [e["id"] for e in client] == published[runs[0]]
    assert [e["seq"] for e in client] == list(range(1, per_run + 1))
    for run_id in runs:
        assert logged[run_id] == published[run_id], run_id
        assert streams[run_id] == published[run_id], run_id



async def test_invariant_2_a_restarted_consumer_rereads_its_pending_entries_before_new_ones(
    redis_url: str,
) -> None:
    """Invariant 2 at the bus seam (on restart, a consumer re-reads its own pending entries before asking
    for new ones): a worker that comes back under its old name while another member still holds every
    shard gets its unacked entries first once it owns their shard again, never newer ones before them."""
    run_id = unique("repend")
    async with open_bus(bus_url(redis_url, unique("e2e"))) as bus:
        events = [_event(run_id, seq) for seq in range(1, 21)]
        await bus.publish(events[:10])
        crashed = bus.consumer("g", "w1")
        assert [d.data for d in await crashed.fetch(100, block_ms=10)] == [envelope.encode(e) for e in events[:10]]
        await crashed.close()  # unacked: pending under "w1"
        survivor = bus.consumer("g", "w2")
        assert await survivor.fetch(100, block_ms=10) == []  # holds every shard; w1's entries not idle yet
        restarted = bus.consumer("g", "w1")
        assert await restarted.fetch(100, block_ms=10) == []  # owns nothing yet
        await bus.publish(events[10:])
        await survivor.close()
        fetched: list[int] = []
        async with asyncio.timeout(10):
            while len(fetched) < 20:
                batch = await restarted.fetch(100, block_ms=10)
                fetched += [envelope.decode(d.data).seq for d in batch]
                await restarted.ack(batch)
        await restarted.close()
    assert fetched == list(range(1, 21))


def _event(run_id: str, seq: int) -> envelope.Event:
    return envelope.make("tool.start", {"call_id": f"c{seq}", "tool": "t"}, id=f"evt_01JX{seq:022d}",
                         ts=envelope.now_ts(), run_id=run_id, seq=seq)


async def _has_entries_in_flight(
    client: aioredis.Redis, prefix: str, holders: list[bytes | None], member: bytes
) -> bool:
    """Whether ``member`` holds a shard lease and has entries of that shard delivered but not acked."""
    for shard, holder in enumerate(holders):
        if holder == member:
            consumers = await client.xinfo_consumers(ingest_key(prefix, shard), GROUP)
            if any(c["name"] in (member, member.decode()) and c["pending"] > 0 for c in consumers):
                return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_invariant_2_no_loss_no_duplicates_when_a_worker_process_is_killed(
    redis_url: str, postgres_url: str
) -> None:
    """Invariant 2 across a real crash: a ``runwire worker`` process owning shards is SIGKILLed mid-stream
    (no drain, no goodbye: its leases expire, its pending entries are claimed by the survivor). The
    replay log (PostgreSQL) and every raw stream still hold every published event exactly once."""
    async with pipeline(redis_url, postgres_url, workers=1) as pipe:
        shards = pipe.bus.shards  # type: ignore[attr-defined]
        runs: dict[int, str] = {}
        while len(runs) < shards:  # one run on every shard, so the killed worker surely owns some
            candidate = unique("killed")
            runs.setdefault(shard_for(candidate, shards), candidate)
        worker = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "runwire"), "worker", "--bus", pipe.url, "--store", postgres_url,
            "--group", GROUP, "--name", "w0", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            handles = [pipe.publisher.run(run_id, tenant="acme") for run_id in runs.values()]
            published: dict[str, list[str]] = {run_id: [] for run_id in runs.values()}
            client = aioredis.Redis.from_url(pipe.url.split("?", 1)[0])
            prefix = pipe.bus.options.prefix  # type: ignore[attr-defined]
            holders: list[bytes | None] = []
            killed_at: int | None = None
            try:
                # The process takes its share of the shards only once it has started and joined the
                # group, which on a loaded machine takes seconds: keep publishing until it holds a
                # lease and has entries of its own in flight, kill it then, and keep publishing.
                async with asyncio.timeout(90):
                    index = 0
                    while killed_at is None or index < killed_at + 150:
                        for handle in handles:
                            if index == 0:
                                event = await handle.emit("run.lifecycle", {"state": "running"})
                            else:
                                event = await handle.emit("tool.start", {"call_id": f"c{index}", "tool": "t"})
                            published[handle.run_id].append(event.id)
                        if b"w0" not in holders:  # (once it holds a shard: no pause, so its reads are busy)
                            await asyncio.sleep(0.01)
                        if killed_at is None and index >= 150:
                            holders = [await client.get(lease_key(prefix, GROUP, s)) for s in range(shards)]
                            if await _has_entries_in_flight(client, prefix, holders, b"w0"):
                                worker.kill()  # SIGKILL while events keep coming
                                await worker.wait()
                                killed_at = index
                        index += 1
                    for handle in handles:
                        published[handle.run_id].append((await handle.finish("done")).id)
            finally:
                await client.aclose()
            await pipe.publisher.flush()
            for run_id in runs.values():
                await wait_for_terminal(pipe.store, run_id, within=60)
                await wait_for_stream_end(pipe.bus, run_id)  # views are written after the log
            logged = {r: [e.id for e in await pipe.store.read(r)] for r in runs.values()}
            streams = {r: await raw_stream_ids(pipe.bus, r) for r in runs.values()}
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
    assert b"w0" in holders, holders  # the killed process was the writer of some runs
    for run_id in runs.values():
        assert logged[run_id] == published[run_id], run_id
        assert streams[run_id] == published[run_id], run_id

# ---- 3 Contiguous seq ------------------------------------------------------------


async def test_invariant_3_contiguous_seq_raw_and_shaped_and_a_publisher_gap_is_visible(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 3 **Contiguous seq**: "a delivery stream's seq has no gaps unless an event was dropped,
    and a client can tell (T2)". The raw view's seq is 1, 2, 3 …; the shaped view's spans tile the
    same seq space (a client checks ``span[0] == previous seq + 1``); an event the publisher lost
    shows up as ``x.gap {run_id, first, last}`` in both views."""
    run_id = unique("contig")
    async with pipeline(redis_url, sqlite_url(tmp_path)) as pipe, httpx.AsyncClient(timeout=60) as http:
        run = pipe.publisher.run(run_id, tenant="acme")
        await run.emit("run.lifecycle", {"state": "running"})
        words: list[str] = []
        for index in range(300):
            words.append(f"w{index} ")
            await run.emit("text.delta", {"text": words[-1]})
            if index == 150:
                await run.emit("tool.start", {"call_id": "c1", "tool": "search"})
        lost = run.event("tool.end", {"call_id": "c1", "ok": True})  # built, never published
        await run.emit("tool.end", {"call_id": "c1b", "ok": True})
        await run.finish("done")
        await pipe.publisher.flush()
        base = f"{pipe.edge.url}/v1/runs/{run_id}/stream"
        raw = decoded(await sse(http, f"{base}?detail=full"))
        shaped = decoded(await sse(http, base))

    assert [e["seq"] for e in raw] == list(range(1, len(raw) + 1))
    assert len(raw) == 1 + 300 + 1 + 1 + 1 + 1  # running, deltas, tool.start, x.gap, tool.end, done
    gap = [e["payload"] for e in raw if e["type"] == "x.gap"]
    assert gap == [{"run_id": run_id, "first": lost.seq, "last": lost.seq}]
    assert_tiles(shaped, raw[-1]["seq"])
    assert len(shaped) < len(raw)  # deltas were coalesced (R1), nothing between them went missing
    assert [e["payload"] for e in shaped if e["type"] == "x.gap"] == gap
    assert "".join(e["payload"]["text"] for e in shaped if e["type"] == "text.delta") == "".join(words)



async def test_invariant_3_contiguous_seq_survives_a_resume_from_the_replay_log(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 3 and docs/architecture.md "One seq space means one cursor": with the hot tier trimmed
    (``maxlen=20``), a client resuming with ``Last-Event-ID`` is served from the replay log, the shaped
    view recomputed — and gets exactly the seqs, spans and texts the live shaped client got after that
    cursor. The live client itself misses nothing although bursts longer than ``maxlen`` trim the hot
    stream between two of the edge's reads (no silent gaps)."""
    run_id = unique("relog")
    async with (
        pipeline(redis_url, sqlite_url(tmp_path), bus_options="maxlen=20") as pipe,
        httpx.AsyncClient(timeout=60) as http,
    ):
        url = f"{pipe.edge.url}/v1/runs/{run_id}/stream"
        run = pipe.publisher.run(run_id, tenant="acme")
        await run.emit("run.lifecycle", {"state": "running"})
        await pipe.publisher.flush()
        live_task = asyncio.create_task(sse(http, url))
        for burst in range(5):
            for index in range(40):
                await run.emit(("reasoning.delta", "text.delta")[index // 20], {"text": f"{burst}.{index} "})
                if index % 10 == 0:
                    await asyncio.sleep(0.03)
            for call in range(25):  # enough events for Redis's approximate trim to cut the shaped view too
                await run.emit("tool.start", {"call_id": f"c{burst}.{call}", "tool": "t"})
            await pipe.publisher.flush()
            await asyncio.sleep(0.4 if burst % 2 else 0.05)  # quiet spells: windows closed by the tick
        await run.finish("done")
        await pipe.publisher.flush()
        live = decoded(await asyncio.wait_for(live_task, 60))
        cursor = live[3]["seq"]
        for view in ("raw", "shaped"):
            assert (await pipe.bus.bounds((run_id, view)) or (0, 0))[0] > cursor + 1, f"{view} should be trimmed"
        resumed = decoded(await sse(http, url, headers={"Last-Event-ID": str(cursor)}))
        resumed_raw = decoded(await sse(http, f"{url}?detail=full", headers={"Last-Event-ID": "5"}))
        metrics = (await http.get(f"{pipe.edge.url}/metrics")).text
        logged = await pipe.store.read(run_id)

    assert_tiles(live, run.seq)  # the live client missed nothing while the hot tier was trimmed under it
    assert len(live) > 10 and resumed == live[4:]
    assert any(e.get("span") for e in resumed)  # shaped deltas, recomputed from the log
    assert [e["id"] for e in resumed_raw] == [e.id for e in logged][5:]
    assert [e["seq"] for e in resumed_raw] == list(range(6, run.seq + 1))
    from_log = [line for line in metrics.splitlines() if line.startswith('runwire_edge_resumes_total{source="log"}')]
    assert from_log and float(from_log[0].split()[-1]) >= 2, from_log


async def test_invariant_3_shaped_spans_stay_contiguous_across_a_crash_with_windows_open(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 3 across a takeover (docs/workers.md: the checkpoint carries "the open shaping windows
    (their deltas so far)", so "the shaped view after a takeover is what the dead worker would have
    produced"): both workers are killed while deltas stream, then restarted. The live shaped client's
    spans tile the seq space and equal ``shaping.shape`` of the logged raw events."""
    run_id = unique("windows")
    async with pipeline(redis_url, sqlite_url(tmp_path)) as pipe, httpx.AsyncClient(timeout=60) as http:
        run = pipe.publisher.run(run_id, tenant="acme")
        await run.emit("run.lifecycle", {"state": "running"})
        await pipe.publisher.flush()
        live_task = asyncio.create_task(sse(http, f"{pipe.edge.url}/v1/runs/{run_id}/stream"))
        for index in range(400):
            await run.emit(("reasoning.delta", "text.delta")[index // 100 % 2], {"text": f"{index} "})
            if index % 20 == 0:
                await pipe.publisher.flush()
                await asyncio.sleep(0.01)
            if index == 200:
                for worker in pipe.workers:
                    await worker.crash()
                for worker in pipe.workers:
                    worker.start()
        await run.emit("tool.start", {"call_id": "c", "tool": "t"})
        await run.finish("done")
        await pipe.publisher.flush()
        live = decoded(await asyncio.wait_for(live_task, 60))
        await wait_for_terminal(pipe.store, run_id)
        raw = await pipe.store.read(run_id)

    assert [e.seq for e in raw] == list(range(1, run.seq + 1))
    assert_tiles(live, run.seq)
    expected = shaping.shape(raw)
    assert [(e["seq"], e.get("span")) for e in live] == [(e.seq, list(e.span) if e.span else None) for e in expected]
    assert [e["payload"] for e in live] == [e.payload_dict() for e in expected]


def assert_tiles(events: list[dict[str, Any]], last: int) -> None:
    """T2 as a client checks it: each event starts right after the previous one (``span[0]`` for a
    shaped delta), from seq 1 to ``last`` — no hole anywhere."""
    previous = 0
    for event in events:
        first = event["span"][0] if event.get("span") else event["seq"]
        assert first == previous + 1, (event, previous)
        previous = event["seq"]
    assert previous == last


# ---- 4 Bounded memory ---------------------------------------------------------------


BIG = "x" * 8_000


@pytest.mark.slow
async def test_invariant_4_bounded_memory_a_slow_client_drops_per_r4_a_fast_one_gets_everything(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 4 **Bounded memory**: "a slow client, a flood of deltas or a dead consumer never grows a
    process without bound; drops follow R4 and are counted". R4: drop ``reasoning.delta`` first, then
    ``text.delta``, never tool/lifecycle events; the terminal event carries ``dropped_count``. The slow
    client's queue is sampled all along and never exceeds its bound; a fast client loses nothing."""
    run_id = unique("bounded")
    settings = EdgeSettings(client_queue_events=256, client_queue_bytes=2 << 20)
    async with pipeline(redis_url, sqlite_url(tmp_path), settings) as pipe, httpx.AsyncClient(timeout=60) as http:
        run = pipe.publisher.run(run_id, tenant="acme")
        await run.emit("run.lifecycle", {"state": "running"})
        await pipe.publisher.flush()
        url = f"{pipe.edge.url}/v1/runs/{run_id}/stream?detail=full"
        reader, writer = await _stalled_sse(url)
        assert pipe.edge.server is not None
        hub = pipe.edge.server.config.app.state.edge.hub
        peaks = {"frames": 0, "bytes": 0}

        async def sample_queues() -> None:
            while True:
                for stream in list(hub.streams.values()):
                    for feed in list(stream.feeds.values()):
                        for client in list(feed.clients):
                            peaks["frames"] = max(peaks["frames"], len(client))
                            peaks["bytes"] = max(peaks["bytes"], client.bytes)
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample_queues())
        async with http.stream("GET", url) as fast:
            fast_reader = asyncio.create_task(read_sse(fast))
            await until(lambda: pipe.edge.live_clients(run_id) == 2, what="both clients attached")
            for index in range(900):
                kind = ("reasoning.delta", "text.delta", "text.delta")[index % 3]
                await run.emit(kind, {"text": BIG})
                if index % 50 == 0:
                    await run.emit("tool.start", {"call_id": f"c{index}", "tool": "t"})
                if index % 3 == 0:
                    await asyncio.sleep(0.003)  # an agent's tokens come over time: pace it
            await run.finish("done")
            await pipe.publisher.flush()
            fast_events, _ = await asyncio.wait_for(fast_reader, 60)
        sampler.cancel()
        slow_raw = await asyncio.wait_for(reader.read(-1), 60)
        writer.close()

    fast_body = decoded(fast_events)
    assert [e["seq"] for e in fast_body] == list(range(1, run.seq + 1))
    assert "dropped_count" not in fast_body[-1]["payload"]
    slow = _sse_bodies(slow_raw)
    slow_seqs = {e["seq"] for e in slow}
    missing = [e for e in fast_body if e["seq"] not in slow_seqs]
    assert missing, "the stalled client should have lost some deltas"
    assert {e["type"] for e in missing} <= {"reasoning.delta", "text.delta"}
    assert [e["seq"] for e in slow if e["type"] == "tool.start"] == [
        e["seq"] for e in fast_body if e["type"] == "tool.start"
    ]
    assert slow[-1]["type"] == "run.lifecycle" and slow[-1]["payload"]["state"] == "done"
    assert slow[-1]["payload"]["dropped_count"] == len(missing)
    assert 0 < peaks["frames"] <= settings.client_queue_events
    assert peaks["bytes"] <= settings.client_queue_bytes


# ---- 5 Bad input never kills a process ------------------------------------------------


async def test_invariant_5_bad_input_is_dead_lettered_or_refused_and_the_run_goes_on(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 5 **Bad input never kills a process**: "it gets a clear error (HTTP 4xx with a
    ``KAI-STREAM-*`` code, or a dead-letter entry with the reason); valid events around it are
    unaffected". Poison entries on the bus are dead-lettered while both workers keep running;
    HTTP ingest answers 422 naming each bad line, and the good lines reach the client."""
    bus_run = unique("poison")
    http_run = unique("ingest")
    async with pipeline(redis_url, sqlite_url(tmp_path)) as pipe, httpx.AsyncClient(timeout=60) as http:
        run = pipe.publisher.run(bus_run, tenant="acme")
        await run.emit("run.lifecycle", {"state": "running"})
        await run.emit("tool.start", {"call_id": "before", "tool": "t"})
        await pipe.publisher.flush()
        bad_ts = run.event("tool.start", {"call_id": "bad-ts", "tool": "t"})
        month_13 = envelope.encode(bad_ts).replace(bad_ts.ts.encode(), b"2026-13-45T10:00:00.000Z")
        client = aioredis.Redis.from_url(pipe.url.split("?", 1)[0])
        try:
            key = ingest_key(pipe.bus.options.prefix, shard_for(bus_run, pipe.bus.shards))  # type: ignore[attr-defined]
            await client.xadd(key, {DATA_FIELD: b"}{ not json"})
            await client.xadd(key, {DATA_FIELD: month_13})
        finally:
            await client.aclose()
        await run.emit("tool.start", {"call_id": "after", "tool": "t"})
        await run.finish("done")
        await pipe.publisher.flush()
        seen = decoded(await sse(http, f"{pipe.edge.url}/v1/runs/{bus_run}/stream?detail=full"))
        reasons = [d.reason for d in await pipe.bus.dead_letters()]

        lines = [
            _koder(http_run, 1, "run.lifecycle", {"state": "running"}),
            b"{ this is not json",
            _koder(http_run, 2, "tool.start", {"call_id": "ok", "tool": "t"}),
            b'{"id":"evt_01JX0000000000000000000000","ts":"2026-01-01T00:00:00.000Z",'
            + f'"type":"nope","run_id":"{http_run}","seq":3,"payload":{{}}}}'.encode(),
            _koder(http_run, 3, "run.lifecycle", {"state": "done"}),
        ]
        response = await http.post(f"{pipe.edge.url}/v1/runs/{http_run}/events", content=b"\n".join(lines))
        ingested = decoded(await sse(http, f"{pipe.edge.url}/v1/runs/{http_run}/stream?detail=full"))
        assert all(worker.alive for worker in pipe.workers)

    assert [e["payload"].get("call_id") for e in seen if e["type"] == "tool.start"] == ["before", "after"]
    assert [e["payload"] for e in seen if e["type"] == "x.gap"] == [
        {"run_id": bus_run, "first": bad_ts.seq, "last": bad_ts.seq}
    ]
    assert any("KAI-STREAM-PROTO-0001" in r and "not valid JSON" in r for r in reasons), reasons
    assert any("2026-13-45" in r for r in reasons), reasons
    assert response.status_code == 422
    body = response.json()
    assert body["accepted"] == 3
    assert [(r["line"], r["code"]) for r in body["rejected"]] == [
        (2, "KAI-STREAM-PROTO-0001"), (4, "KAI-STREAM-PROTO-0002")
    ]
    assert [(e["type"], e["seq"]) for e in ingested] == [
        ("run.lifecycle", 1), ("tool.start", 2), ("run.lifecycle", 3)
    ]


async def test_invariant_5_every_timestamp_ingest_accepts_is_delivered_not_dead_lettered(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 5: what HTTP ingest accepts (200) a worker must carry, not dead-letter later.
    RFC 3339 §5.6 lets ``T`` and ``Z`` be lowercase; ingest and the worker read ``ts`` with one
    parser, so a lowercase ``z``, a lowercase ``t``, an offset and nanoseconds all reach the client."""
    run_id = unique("ts-forms")
    stamps = [
        "2026-11-24T10:00:00.000z",
        "2026-11-24t10:00:00.050Z",
        "2026-11-24T11:00:00.100+01:00",
        "2026-11-24T10:00:00.150000001z",
    ]
    lines = [_koder(run_id, 1, "run.lifecycle", {"state": "running"}, ts=stamps[0])]
    lines += [
        _koder(run_id, seq, "tool.start", {"call_id": f"c{seq}", "tool": "t"}, ts=stamps[seq - 1])
        for seq in (2, 3, 4)
    ]
    lines.append(_koder(run_id, 5, "run.lifecycle", {"state": "done"}))
    async with pipeline(redis_url, sqlite_url(tmp_path)) as pipe, httpx.AsyncClient(timeout=60) as http:
        response = await http.post(f"{pipe.edge.url}/v1/runs/{run_id}/events", content=b"\n".join(lines))
        assert response.status_code == 200, response.text
        seen = decoded(await sse(http, f"{pipe.edge.url}/v1/runs/{run_id}/stream?detail=full"))
        dead = [d.reason for d in await pipe.bus.dead_letters()]

    assert [(e["type"], e["seq"]) for e in seen] == [
        ("run.lifecycle", 1), ("tool.start", 2), ("tool.start", 3), ("tool.start", 4), ("run.lifecycle", 5)
    ]
    assert [e["ts"] for e in seen[:4]] == stamps  # carried verbatim
    assert dead == []


def _koder(run_id: str, seq: int, type: str, payload: dict[str, Any], **extra: Any) -> bytes:
    """One line of HTTP ingest in the canonical (koder) format."""
    extra.setdefault("ts", envelope.now_ts())
    return envelope.encode(envelope.make(
        type, payload, id=f"evt_01JX{seq:022d}", run_id=run_id, seq=seq, **extra
    ))


# ---- 6 Tenants are isolated -------------------------------------------------------------


SECRET = "e2e-secret-" + "k" * 32


def token(tenant: str, runs: str | list[str] = "*") -> dict[str, str]:
    claims = {"tenant": tenant, "runs": runs, "scopes": ["read", "write", "control"], "exp": int(time.time()) + 600}
    return {"Authorization": f"Bearer {jwt.encode(claims, SECRET, algorithm='HS256')}"}


async def test_invariant_6_tenants_are_isolated_a_token_cannot_touch_another_tenants_run(
    redis_url: str, tmp_path: Path
) -> None:
    """Invariant 6 **Tenants are isolated**: "a token for one tenant can't read, list, export or control
    another tenant's runs" (nor ingest into them). docs/edge.md: another tenant's run answers 404, "the
    same answer, so run ids can't be probed"; a write naming another tenant's run is refused with
KAI-STREAM-AUTH-0003 (docs/security.md § Authorization). Each refusal is checked against the owner's
success."""
    acme_run, globex_run = unique("acme"), unique("globex")
    settings = EdgeSettings(secret=SECRET)
    async with pipeline(redis_url, sqlite_url(tmp_path), settings) as pipe, httpx.AsyncClient(timeout=60) as http:
        for run_id, tenant in ((acme_run, "acme"), (globex_run, "globex")):
            run = pipe.publisher.run(run_id, tenant=tenant)
            await run.emit("run.lifecycle", {"state": "running"})
            await run.emit("tool.start", {"call_id": f"secret-of-{tenant}", "tool": "t"})
            await run.finish("done")
        await pipe.publisher.flush()
        for run_id in (acme_run, globex_run):
            await wait_for_terminal(pipe.store, run_id)
        acme, globex = token("acme"), token("globex")
        edge = pipe.edge.url

        async def status(method: str, path: str, headers: dict[str, str], **kwargs: Any) -> int:
            return (await http.request(method, f"{edge}{path}", headers=headers, **kwargs)).status_code

        stream = f"/v1/runs/{globex_run}/stream?detail=full"
        assert await status("GET", stream, acme) == 404
        assert await status("GET", f"{stream}&access_token={acme['Authorization'][7:]}", {}) == 404
        assert [e["payload"].get("call_id") for e in decoded(await sse(http, f"{edge}{stream}", headers=globex))
                if e["type"] == "tool.start"] == ["secret-of-globex"]

        listed = {
            name: [r["run_id"] for r in (await http.get(f"{edge}/v1/runs", headers=headers)).json()["runs"]]
            for name, headers in (("acme", acme), ("globex", globex))
        }
        assert acme_run in listed["acme"] and globex_run not in listed["acme"]
        assert globex_run in listed["globex"] and acme_run not in listed["globex"]

        export = f"/v1/runs/{globex_run}/events.jsonl"
        assert await status("GET", export, acme) == 404
        assert await status("GET", export, globex) == 200

        control = f"/v1/runs/{globex_run}/control"
        assert await status("POST", control, acme, json={"command": "cancel", "args": {}}) == 404
        assert await status("POST", control, globex, json={"command": "cancel", "args": {}}) == 409  # ended

        forged = _koder(globex_run, 4, "tool.start", {"call_id": "forged", "tool": "t"}, tenant="globex")
        assert await status("POST", f"/v1/runs/{globex_run}/events", acme, content=forged) == 403
        assert await status("GET", f"/v1/runs/{acme_run}/stream?detail=full", {}) == 401
        smuggled = _koder(unique("acme-new"), 1, "tool.start", {"call_id": "smuggled", "tool": "t"}, tenant="globex")
        run_of_smuggled = msgspec.json.decode(smuggled)["run_id"]
        answer = await http.post(f"{edge}/v1/runs/{run_of_smuggled}/events", headers=acme, content=smuggled)
        assert answer.status_code == 422, answer.text  # an event of another tenant is rejected
        assert [r["code"] for r in answer.json()["rejected"]] == ["KAI-STREAM-AUTH-0003"]
        narrow = token("acme", [acme_run])
        assert await status("GET", stream, narrow) == 404
        assert globex_run not in [r["run_id"] for r in (await http.get(f"{edge}/v1/runs", headers=narrow)).json()["runs"]]
        # a marker through the same entrance after it, on the forged event's ingest shard: once a
        # worker wrote the marker, it would have written the forged event before it
        marker_run = same_shard(pipe.bus, globex_run)
        marker = _koder(marker_run, 1, "run.lifecycle", {"state": "done"}, tenant="globex")
        assert await status("POST", f"/v1/runs/{marker_run}/events", globex, content=marker) == 200
        await wait_for_terminal(pipe.store, marker_run)
        logged = [e.payload_dict().get("call_id") for e in await pipe.store.read(globex_run)]

    assert "forged" not in logged
