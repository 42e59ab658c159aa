"""A fork continued by an agent: the workers number its events after the copied ones, on every bus
and with both worker runtimes, whether the fork's hot views were written with it or not."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from runwire.bus import Bus, open_bus
from runwire.core.envelope import Event
from runwire.jobs.fork import fork_run
from runwire.processing.shaping import shape
from runwire.sdk.publisher import Publisher
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.waiting import until
from tests.workers.checks import assert_r1_r3, read_all, run_tree

CASES = [(runtime, views, "sqlite") for runtime in ("memory", "redis", "kafka") for views in (True, False)]
CASES += [("kafka-faust", True, "sqlite"), ("memory", True, "postgres"), ("memory", False, "postgres")]
"""(runtime, whether the fork job wrote the hot views, replay log): the faust runtime's table never
holds a fork's checkpoint, so it continues every fork from the replay log's, with or without views;
the checkpoint of record is the log's, so PostgreSQL's once is enough."""


def bus_url(runtime: str, request: pytest.FixtureRequest, prefix: str) -> str:
    if runtime == "memory":
        return "memory://?shards=2"
    if runtime == "redis":
        return f"{request.getfixturevalue('redis_url')}?shards=2&prefix={prefix}"
    return f"{request.getfixturevalue('kafka_url')}?prefix={prefix}&session_timeout_ms=2000&shards=2"


async def drain(runtime: str, bus: Bus, store: ReplayLog, name: str, tmp_path: Path, run_id: str) -> None:
    """Run the runtime's worker until ``run_id`` ended in the replay log and on the hot tier (a
    burst worker on Kafka may stop before a new member's first fetch finds anything)."""
    stop = asyncio.Event()
    group = f"{tmp_path.name}-g"
    if runtime == "kafka-faust":
        from runwire.processing.faust.worker import FaustWorker

        faust = FaustWorker(bus, store, group=group, name=name, stop=stop, data_dir=tmp_path / "faust")
        worker: asyncio.Task[object] = asyncio.create_task(faust.run())
    else:
        worker = asyncio.create_task(run_worker(bus, store, group=group, name=name, stop=stop))

    async def ended() -> bool:
        info = await store.run(run_id)
        bounds = await bus.bounds((run_id, "raw"))
        return bool(info and info.terminal and bounds and bounds[1] == info.last_seq) or worker.done()

    try:
        await until(ended, within=90, what=f"{run_id} ended")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)


def strip(event: Event) -> tuple[object, ...]:
    """What a fork keeps of a source's event: all but its run and its place in a tree."""
    return (event.id, event.seq, event.type, event.child_id, event.ts, event.payload_dict())


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "views", "backend"), CASES,
                         ids=[f"{runtime}-{'views' if views else 'log-only'}-{log}" for runtime, views, log in CASES])
async def test_an_agent_continues_a_fork_after_the_copied_seqs(
    runtime: str, views: bool, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A run tree (children fanned in) forked mid-run at seq k; an SDK agent publishes to the fork from
    its own seq 1: the fork's raw view — replay log and hot tier alike — is the source's first k
    events (children's with their ``child_id``), then the agent's as k+1 …, contiguous, once each;
    its shaped view is ``shape`` of its raw view; the source is unchanged. With ``views`` the fork
    job wrote the fork's hot views; without (``runwire replay fork`` with no bus) the worker that
    continues the fork rebuilds them from the replay log's checkpoint of record."""
    prefix = f"k{uuid.uuid4().hex[:8]}"
    events, _ = run_tree(prefix, deltas=12)
    source_id, fork_id = f"{prefix}_root", f"{prefix}_fork"
    log_url = (request.getfixturevalue("postgres_schema_url") if backend == "postgres"
               else f"sqlite:///{tmp_path}/replay.db")
    async with open_bus(bus_url(runtime, request, prefix)) as bus, open_store(log_url) as store:
        await bus.publish(events)
        await drain(runtime, bus, store, "w1", tmp_path, source_id)
        source = await store.read(source_id)
        source_hot = await read_all(bus, source_id)
        k = len(source) // 2
        assert any(e.child_id for e in source[:k])

        result = await fork_run(store, source_id, at=k, run_id=fork_id, bus=bus if views else None)
        assert result.created and result.fork.at == k

        publisher = Publisher(bus)
        await publisher.start()
        run = publisher.run(fork_id)
        for word in ("a", "second", "answer"):
            await run.emit("text.delta", {"text": f"{word} "})
        await run.emit("tool.start", {"call_id": "again", "tool": "search"})
        await run.finish("done")
        await publisher.flush()
        await publisher.close()
        await drain(runtime, bus, store, "w2", tmp_path, fork_id)

        logged = await store.read(fork_id)
        hot = await read_all(bus, fork_id)
        shaped = await bus.read((fork_id, "shaped"), 0, limit=10_000)
        info = await store.run(fork_id)
        assert await store.read(source_id) == source
        assert await read_all(bus, source_id) == source_hot
    assert [strip(e) for e in logged[:k]] == [strip(e) for e in source[:k]]
    assert {e.run_id for e in logged} == {fork_id}
    assert all(e.parent_id is None and e.root_id is None for e in logged)
    own = logged[k:]
    assert [e.seq for e in logged] == list(range(1, k + 6))
    assert [e.type for e in own] == ["text.delta"] * 3 + ["tool.start", "run.lifecycle"]
    assert all(e.child_id is None for e in own)
    assert hot == logged
    assert shaped == shape(hot)
    assert_r1_r3(hot, shaped)
    assert info is not None and info.state == "done" and info.last_seq == k + 5
