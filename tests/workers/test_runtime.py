"""The consumer-group runtime on real buses and real replay logs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from runwire.bus import Bus, open_bus
from runwire.core.envelope import encode
from runwire.core.errors import StoreError
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.workers.checks import assert_delivered_exactly_once, read_all, run_tree
from tests.workers.events import RunScript


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[ReplayLog]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/replay.db"
    else:
        url = request.getfixturevalue("postgres_schema_url")  # its own: the successor sweeps the whole log
    async with open_store(url) as log:
        yield log


@pytest.fixture(params=["memory", "redis"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    if request.param == "memory":
        url = "memory://"
    else:
        base = request.getfixturevalue("redis_url")
        url = f"{base}{'&' if '?' in base else '?'}prefix=t{uuid.uuid4().hex[:10]}"
    async with open_bus(url) as opened:
        yield opened


def prefix() -> str:
    return f"r{uuid.uuid4().hex[:8]}"


async def test_published_run_tree_reaches_streams_and_replay_log_exactly_once(
    bus: Bus, store: ReplayLog
) -> None:
    """Fan-in, contiguous seq, shaped view and replay log for a root, two children, a grandchild."""
    events, ancestry = run_tree(prefix())
    await bus.publish(events)
    await bus.publish(events[10:40])  # the bus delivers some entries twice
    stats = await run_worker(bus, store, group="g", name="w1", burst=True)
    assert stats.duplicates >= 30
    await assert_delivered_exactly_once(bus, store, events, ancestry)


async def test_poison_entries_are_dead_lettered_with_the_reason_and_the_run_goes_on(
    bus: Bus, store: ReplayLog
) -> None:
    """Invariant 5 (bad input never kills a process): bad input gets a dead-letter entry with the reason; valid events around it are unaffected."""
    run = RunScript(f"{prefix()}_poison")
    before = run.tool_start("before")
    bad_ts = run.tool_start("bad-ts")
    after = run.tool_start("after")
    await bus.publish([before])
    await _publish_raw(bus, run.run_id, b"}{ not json")
    month_13 = encode(bad_ts).replace(bad_ts.ts.encode(), b"2026-13-45T10:00:00.000Z")
    await _publish_raw(bus, run.run_id, month_13)
    await bus.publish([after])
    stats = await run_worker(bus, store, group="g", name="w1", burst=True)
    assert stats.dead_lettered == 2
    reasons = [d.reason for d in await bus.dead_letters()]
    assert any("KAI-STREAM-PROTO-0001" in r and "not valid JSON" in r for r in reasons)
    assert any("2026-13-45" in r for r in reasons)
    raw = await read_all(bus, run.run_id)
    calls = [e.payload_dict().get("call_id") for e in raw if e.type == "tool.start"]
    assert calls == ["before", "after"]
    gaps = [e.payload_dict() for e in raw if e.type == "x.gap"]
    assert gaps == [{"run_id": run.run_id, "first": 2, "last": 2}]  # Koder agent stream §7 T2: the lost event is visible
    assert [e.id for e in await store.read(run.run_id)] == [e.id for e in raw]


async def test_a_bad_event_inside_an_entry_of_several_is_dead_lettered_alone(
    redis_url: str, store: ReplayLog
) -> None:
    """A worker takes a Redis entry of several events whole; one undecodable line and one
    event another tenant's (refused while processing) are each dead-lettered on their own,
    the entry's other events are processed, and the entry is acked once all of it is done."""
    import msgspec
    from redis.asyncio import Redis

    from runwire.bus.keys import ingest_key, shard_for
    from runwire.bus.redis.entries import INGEST_MANY_FIELD

    url = f"{redis_url}?prefix=t{uuid.uuid4().hex[:10]}"
    run = RunScript(f"{prefix()}_entry")
    events = [msgspec.structs.replace(run.tool_start(f"c{i}"), tenant="acme") for i in range(5)]
    foreign = msgspec.structs.replace(events[1], tenant="other")
    entries = [[encode(events[0]), encode(foreign), encode(events[2])],  # decodes: refused in processing
               [b"}{ not json", encode(events[3]), encode(events[4])]]
    async with open_bus(url) as bus:
        shard = shard_for(run.run_id, bus.shards)
        key = ingest_key(bus.options.prefix, shard)  # type: ignore[attr-defined]
        client = Redis.from_url(redis_url)
        try:
            for lines in entries:
                await client.xadd(key, {INGEST_MANY_FIELD: b"\n".join(lines)})
                stats = await run_worker(bus, store, group="g", name="w1", burst=True)
                assert int((await client.xpending(key, "g"))["pending"]) == 0
                assert stats.dead_lettered == 1 and stats.entries == 3
        finally:
            await client.aclose()
        assert sorted(d.data for d in await bus.dead_letters()) == sorted([b"}{ not json", encode(foreign)])
        raw = await read_all(bus, run.run_id)
    calls = [e.payload_dict().get("call_id") for e in raw if e.type == "tool.start"]
    assert calls == ["c0", "c2", "c3", "c4"]


async def test_a_silent_run_is_ended_as_error(bus: Bus, store: ReplayLog) -> None:
    """When the producer dies the stream still ends, with state=error."""
    run = RunScript(f"{prefix()}_silent")
    await bus.publish([run.lifecycle("running"), run.text("half a sent")])
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(bus, store, group="g", name="w1", stop=stop, silence_s=0.5)
    )
    try:
        for _ in range(100):
            raw = await read_all(bus, run.run_id)
            if raw and raw[-1].type == "run.lifecycle" and raw[-1].payload_dict()["state"] == "error":
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        stats = await worker
    assert raw[-1].payload_dict() == {
        "state": "error",
        "reason": "no events for 0.5s (agent presumed dead)",
    }
    assert stats.silenced >= 1  # (a shared replay log may hold other orphaned runs too)
    shaped = await bus.read((run.run_id, "shaped"), 0)
    assert [e.type for e in shaped] == ["run.lifecycle", "text.delta", "run.lifecycle"]
    info = await store.run(run.run_id)
    assert info is not None and info.state == "error" and info.terminal


async def _publish_raw(bus: Bus, run_id: str, data: bytes) -> None:
    """Put undecodable bytes on the run's ingest shard, as a broken producer would."""
    from runwire.bus.keys import shard_for

    shard = shard_for(run_id, bus.shards)
    if bus.url.startswith("memory"):
        state = bus.state  # type: ignore[attr-defined]
        state.shards[shard].append(data)
        state.backlog += 1
        state.ingest_changed.notify()
    else:
        import redis.asyncio as aioredis

        from runwire.bus.keys import DATA_FIELD, ingest_key

        client = aioredis.Redis.from_url(bus.url.split("?", 1)[0])
        try:
            await client.xadd(ingest_key(bus.options.prefix, shard), {DATA_FIELD: data})  # type: ignore[attr-defined]
        finally:
            await client.aclose()


async def test_a_run_already_silent_when_its_worker_left_is_ended_by_the_successor(
    bus: Bus, store: ReplayLog
) -> None:
    """A successor knows only runs it has seen; it finds silent unfinished runs in the replay log."""
    run = RunScript(f"{prefix()}_orphan")
    await bus.publish([run.lifecycle("running"), run.tool_start("t")])
    first = await run_worker(bus, store, group="g", name="w1", burst=True)
    assert first.silenced == 0
    stop = asyncio.Event()
    successor = asyncio.create_task(
        run_worker(bus, store, group="g", name="w2", stop=stop, silence_s=0.5)
    )
    try:
        for _ in range(100):
            info = await store.run(run.run_id)
            if info is not None and info.terminal:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await successor
    raw = await read_all(bus, run.run_id)
    assert [e.seq for e in raw] == [1, 2, 3]
    assert raw[-1].payload_dict()["state"] == "error"


async def test_append_many_is_append_in_order_and_idempotent(bus: Bus) -> None:
    """The workers write a batch's delivery appends together (one pipeline on Redis)."""
    run = RunScript(f"{prefix()}_many")
    first, second = run.tool_start("a"), run.tool_start("b")
    other = f"{run.run_id}_other"
    counts = await bus.append_many([
        ((run.run_id, "raw"), [first, second], None, b"s2"),
        ((other, "raw"), [], None, b"only-state"),
        ((run.run_id, "raw"), [first], None, b"s2"),  # a replay: skipped by seq
    ])
    assert counts == [2, 0, 0]
    assert [e.seq for e in await read_all(bus, run.run_id)] == [1, 2]
    assert (await bus.load_states([(run.run_id, "raw")]))[0] == b"s2"
    assert (await bus.load_states([(other, "raw")]))[0] == b"only-state"


async def test_a_failed_write_is_redone_whole_never_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A write that fails for good ends the worker without a later write's checkpoint
    covering it: a successor redoes it from the stored checkpoints, and the streams and
    the replay log have no hole (the failing write's events would otherwise be taken
    for duplicates of the checkpoint and never stored)."""
    async with open_bus("memory://?shards=1") as bus, \
            open_store(f"sqlite:///{tmp_path}/log.db") as store:
        run = RunScript("r-fail")
        events = [run.tool_start(f"c{i}", ms=i) for i in range(1, 3001)]
        await bus.publish(events)
        real = store.append_streams
        calls = 0

        async def failing_second_write(rows):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            if calls == 2:
                await asyncio.sleep(0.2)  # the loop processes more batches meanwhile
                raise StoreError("disk I/O error")  # not retriable
            return await real(rows)

        store.append_streams = failing_second_write  # type: ignore[method-assign]
        with pytest.raises(StoreError):
            await run_worker(bus, store, group="g", name="w1", burst=True, batch=100)
        store.append_streams = real  # type: ignore[method-assign]
        await run_worker(bus, store, group="g", name="w2", burst=True, batch=100,
                         claim_idle_ms=1)
        raw = await read_all(bus, "r-fail")
        logged = await store.read("r-fail")
    assert [e.seq for e in raw] == list(range(1, 3001))
    assert [e.id for e in raw] == [e.id for e in events]
    assert [(e.seq, e.id) for e in logged] == [(e.seq, e.id) for e in raw]
