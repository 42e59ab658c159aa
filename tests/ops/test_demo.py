"""The demo runs `runwire up --demo` publishes look like real agent runs, deterministically."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec

from runwire.bus.base import Consumer
from runwire.bus.memory.bus import MemoryBus
from runwire.core import envelope
from runwire.jobs.demo import DemoScript, keep_publishing, publish_runs
from runwire.sdk.publisher import Publisher
from tests.waiting import until


async def _no_wait(_: float) -> None:
    await asyncio.sleep(0)


async def published(bus: MemoryBus) -> list[Any]:
    """Every event published on ``bus`` since :func:`inspecting` (or since now, on a fresh bus):
    a group's entries stay until it acks them, while those every existing group acked leave."""
    consumer = inspecting(bus)
    events: list[Any] = []
    while batch := await consumer.fetch(10_000, block_ms=50):
        events += [envelope.decode(d.data) for d in batch]
        await consumer.ack(batch)
    await consumer.close()
    return events


async def demo_events(seed: int, runs: int) -> list[Any]:
    async with MemoryBus("memory://") as bus:
        async with Publisher(bus) as pub:
            script = DemoScript(pub, seed=seed, sleep=_no_wait)
            for number in range(runs):
                await script.run(f"r{number}", number)
        return await published(bus)


def inspecting(bus: MemoryBus) -> Consumer:
    """The group :func:`published` reads; make it before publishing when another group acks too."""
    return bus.consumer("inspect", "c1")


async def until_started(bus: MemoryBus, runs: int) -> None:
    """Until ``runs`` runs have started on the bus (a group of its own watches)."""
    watch, started = bus.consumer("watch", "c1"), set()

    async def enough() -> bool:
        batch = await watch.fetch(10_000, block_ms=50)
        started.update(e.run_id for e in map(envelope.decode, (d.data for d in batch)) if not e.parent_id)
        await watch.ack(batch)
        return len(started) >= runs

    try:
        await until(enough, what=f"{runs} runs started")
    finally:
        await watch.close()


def shape(events: list[Any]) -> list[tuple[str, str, int, bytes]]:
    """Events without their ids and timestamps (what the seed determines)."""
    return [(e.run_id, e.type, e.seq, msgspec.json.encode(e.payload)) for e in events]


async def test_a_demo_run_has_every_kind_of_event() -> None:
    events = await demo_events(seed=1, runs=5)
    types = Counter(e.type for e in events)
    for kind in (
        "reasoning.delta",
        "text.delta",
        "tool.start",
        "tool.end",
        "plan.proposal",
        "step.boundary",
        "child.spawn",
        "run.lifecycle",
        "x.usage",
    ):
        assert types[kind] > 0, kind
    failed = [e for e in events if e.type == "tool.end" and not e.payload.ok]
    assert failed and all(e.payload.error for e in failed)
    terminal = {
        e.run_id: e.payload.state
        for e in events
        if e.type == "run.lifecycle" and e.payload.state in envelope.TERMINAL_STATES
    }
    assert terminal["r4"] == "aborted"
    assert list(terminal.values()).count("aborted") == 1
    spawned = {e.payload.child_id: e.run_id for e in events if e.type == "child.spawn"}
    children = {e.run_id: e.parent_id for e in events if e.parent_id}
    assert spawned == children and len(children) == 8
    assert all(terminal[child] == "done" for child in children)
    assert len(terminal) == 5 + 8


async def test_each_run_is_published_in_seq_order_from_1() -> None:
    events = await demo_events(seed=2, runs=3)
    by_run: dict[str, list[int]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event.seq)
    for seqs in by_run.values():
        assert seqs == list(range(1, len(seqs) + 1))


async def test_same_seed_same_runs_other_seed_other_runs() -> None:
    first = shape(await demo_events(seed=7, runs=2))
    assert first == shape(await demo_events(seed=7, runs=2))
    assert first != shape(await demo_events(seed=8, runs=2))


async def test_stopping_the_demo_ends_open_runs_as_aborted() -> None:
    """No run of the demo is left without a terminal event when it stops."""
    async with MemoryBus("memory://") as bus:
        await inspecting(bus).close()  # the group exists: what "watch" acks stays for it
        async with Publisher(bus) as pub:
            stop = asyncio.Event()
            task = asyncio.create_task(publish_runs(pub, stop, rate=20, pace=0.005, prefix="d"))
            await until_started(bus, 2)
            stop.set()
            started = await task
        events = await published(bus)
    assert started >= 2
    runs = {e.run_id for e in events}
    ended = {
        e.run_id
        for e in events
        if e.type == "run.lifecycle" and e.payload.state in envelope.TERMINAL_STATES
    }
    assert runs == ended
    assert any(e.payload.reason == "demo stopped" for e in events if e.type == "run.lifecycle")


async def test_keep_publishing_connects_by_url_and_keeps_starting_runs() -> None:
    """`keep_publishing(url, stop, rate=…)` publishes onto the bus at the URL until stopped."""
    async with MemoryBus("memory://demo-keep") as bus:
        await inspecting(bus).close()  # the group exists: what "watch" acks stays for it
        stop = asyncio.Event()
        task = asyncio.create_task(keep_publishing("memory://demo-keep", stop, rate=10, pace=0.001))
        await until_started(bus, 3)
        stop.set()
        started = await task
        events = await published(bus)
    roots = {e.run_id for e in events if not e.parent_id}
    assert started >= 3 and len(roots) == started
