"""The publisher SDK on every bus: ids and seq, batching, the bound, retries, flush, child runs.

Koder agent stream §2: "id — ULID, monotonic per stream"; "seq — monotonically increasing
per run"; invariant 4 (bounded memory, docs/architecture.md): a slow or absent bus makes
``emit`` wait, it never grows the process or drops silently.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import pytest

from runwire import Publisher
from runwire.bus import ControlCommand, open_bus
from runwire.core.envelope import Event, encode, parse_ts
from runwire.core.errors import DeliveryTimeout, MalformedFrame, UnknownEventType
from tests.bus.reading import consume
from tests.services import RedisServer
from tests.waiting import until, until_received


def _unique() -> str:
    return "p" + uuid.uuid4().hex[:12]


def by_run(events: list[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        out[event.run_id].append(event)
    return out


async def test_seq_from_one_ids_monotonic_ts_assigned(sdk_url: str) -> None:
    """Seq counts from 1 per run, ids are monotonic ULIDs, ts is RFC 3339 — and
    what ``emit`` returns is exactly what consumers read."""
    returned: list[Event] = []
    async with Publisher.connect(sdk_url) as pub:
        runs = [pub.run(f"run-{i}") for i in range(3)]
        for n in range(40):
            for run in runs:
                returned.append(await run.emit("text.delta", {"text": f"{run.run_id}/{n}"}))
    got = await consume(sdk_url, 120)
    assert sorted(got, key=lambda e: e.id) == sorted(returned, key=lambda e: e.id)
    for run_id, events in by_run(got).items():
        assert [e.seq for e in events] == list(range(1, 41)), run_id
        ids = [e.id for e in events]
        assert ids == sorted(ids) and len(set(ids)) == 40
        assert all(i.startswith("evt_") and len(i) == 30 for i in ids)
        parse_ts(events[0].ts)


async def test_emits_are_batched(sdk_url: str) -> None:
    """Many quick emits go out in few bus calls (short linger, max batch)."""
    async with Publisher.connect(sdk_url, linger_ms=5, max_batch=500) as pub:
        run = pub.run("run-batch")
        for n in range(2000):
            await run.emit("text.delta", {"text": str(n)})
        await pub.flush()
        assert pub.published == 2000
        assert pub.batches <= 40
    got = await consume(sdk_url, 2000)
    assert [e.seq for e in got] == list(range(1, 2001))


async def test_flush_sends_what_is_queued_at_once_not_after_the_linger(sdk_url: str) -> None:
    """``flush`` (and so ``close``) sends the queued batch now: a long ``linger_ms`` is how long
    events may wait for company, not a delay every flush pays."""
    async with Publisher.connect(sdk_url, linger_ms=600_000) as pub:
        run = pub.run(_unique())
        await run.emit("text.delta", {"text": "now"})
        await until(lambda: pub._lingering is not None, what="the flusher lingering for more")
        async with asyncio.timeout(30):  # the linger is 10 minutes
            await pub.flush()
        assert pub.published == 1 and pub.pending == 0
        await run.emit("text.delta", {"text": "and at close"})
    assert [e.payload.text for e in await consume(sdk_url, 2)] == ["now", "and at close"]


async def test_close_flushes_what_is_queued(sdk_url: str) -> None:
    """Graceful close: leaving the block delivers every queued event."""
    async with Publisher.connect(sdk_url, linger_ms=50) as pub:
        run = pub.run("run-close")
        for n in range(300):
            await run.emit("reasoning.delta", {"text": str(n)})
        await run.finish("done")
        assert pub.pending > 0  # still queued when the block ends
    got = await consume(sdk_url, 301)
    assert [e.seq for e in got] == list(range(1, 302))
    assert got[-1].type == "run.lifecycle"


async def test_child_runs_carry_parent_root_and_tenant(sdk_url: str) -> None:
    """Child runs carry parent_id and root_id on every event, so workers fan them in,
    and share the root's ingest shard (one owner for the whole tree)."""
    async with Publisher.connect(sdk_url) as pub:
        root = pub.run("run-root", tenant="acme")
        child = pub.run("run-child", parent=root)
        grandchild = pub.run("run-grand", parent=child)
        by_id = pub.run("run-by-id", parent="run-child", root="run-root")
        orphan = pub.run("run-orphan", parent="run-elsewhere")
        for run in (root, child, grandchild, by_id, orphan):
            await run.emit("step.boundary", {"step_index": 0, "step_kind": "plan"})
            await run.emit("text.delta", {"text": "x"})
    got = by_run(await consume(sdk_url, 10))
    expect = {
        "run-root": (None, None, "acme"),
        "run-child": ("run-root", "run-root", "acme"),
        "run-grand": ("run-child", "run-root", "acme"),
        "run-by-id": ("run-child", "run-root", "acme"),  # a run this publisher started: its tenant
        "run-orphan": ("run-elsewhere", "run-elsewhere", None),
    }
    for run_id, (parent_id, root_id, tenant) in expect.items():
        assert [(e.parent_id, e.root_id, e.tenant) for e in got[run_id]] == [
            (parent_id, root_id, tenant)
        ] * 2
    async with open_bus(sdk_url) as bus:
        shards = {bus.shard_of(e) for run_id in ("run-root", "run-child", "run-grand")
                  for e in got[run_id]}
    assert len(shards) == 1


async def test_a_runs_thread_travels_on_every_event_and_children_have_their_own(sdk_url: str) -> None:
    """``pub.run(..., thread=)`` puts ``thread_id`` on each of the run's events (the worker
    writes run metadata from them); a child run is not one of the thread's turns."""
    async with Publisher.connect(sdk_url) as pub:
        turn = pub.run("run-turn", tenant="acme", thread="chat-1")
        child = pub.run("run-helper", parent=turn)
        for run in (turn, child):
            await run.emit("text.delta", {"text": "x"})
            await run.finish()
    got = by_run(await consume(sdk_url, 4))
    assert [e.thread_id for e in got["run-turn"]] == ["chat-1", "chat-1"]
    assert [e.thread_id for e in got["run-helper"]] == [None, None]


async def test_invalid_events_are_rejected_before_queueing() -> None:
    """A bad payload or type raises the protocol error; the run's seq is not used up."""
    async with Publisher.connect(f"memory://{_unique()}") as pub:
        run = pub.run("run-bad")
        with pytest.raises(MalformedFrame):
            await run.emit("tool.start", {"tool": "grep"})  # call_id missing
        with pytest.raises(UnknownEventType):
            await run.emit("no.such.type", {})
        with pytest.raises(ValueError):
            await run.finish("running")
        good = await run.emit("x.acme.note", {"any": ["json", 1]})
        assert good.seq == 1 and pub.pending + pub.published == 1


async def test_a_lone_surrogate_is_refused_before_it_takes_a_seq() -> None:
    """A string no UTF-8 encodes (a lone surrogate) is refused as malformed by every way of
    publishing, before a seq is taken: the run goes on with no gap in its seqs."""
    name = f"memory://{_unique()}"
    async with Publisher.connect(name) as pub:
        run = pub.run("run-surrogate")
        await run.emit("text.delta", {"text": "before"})
        with pytest.raises(MalformedFrame, match="not valid Unicode"):
            await run.emit("text.delta", {"text": "bad \ud800"})
        with pytest.raises(MalformedFrame, match="not valid Unicode"):
            run.emit_nowait("tool.start", {"call_id": "c1", "tool": "t", "input": {"q": "\udfff"}})
        with pytest.raises(MalformedFrame, match="not valid Unicode"):
            run.delta_nowait("text.delta", "\ud800 bad")
        assert run.seq == 1
        assert run.delta_nowait("text.delta", "after")
        await run.finish()
        await pub.flush()
        got = await consume(name, 3)
    assert [(e.seq, e.type) for e in got] == [(1, "text.delta"), (2, "text.delta"), (3, "run.lifecycle")]


async def test_run_controls_receive_commands(sdk_url: str) -> None:
    """The agent reads its run's control channel (cancel, pause …) through the SDK."""
    async with Publisher.connect(sdk_url) as pub:
        run = pub.run("run-ctl")
        live = run.controls()
        async with open_bus(sdk_url) as client_side:
            marker = ControlCommand(command="pause", run_id="run-ctl", by="marker")
            await until_received(anext(live), lambda: client_side.send_control(marker))
            await client_side.send_control(ControlCommand(command="cancel", run_id="run-ctl"))
            command = await asyncio.wait_for(anext(c async for c in live if c.by != "marker"), 10)
        await live.aclose()  # type: ignore[attr-defined]
    assert (command.command, command.run_id) == ("cancel", "run-ctl")


@pytest.mark.slow
async def test_bound_holds_while_redis_is_down_then_recovers(own_redis: RedisServer) -> None:
    """Invariant 4: with the bus down, emit waits once the bound is reached (the queue
    does not grow), DeliveryTimeout names every (run_id, seq) not delivered, and
    publishing resumes when the server is back."""
    async with Publisher.connect(
        own_redis.url, max_pending=50, max_batch=10, delivery_timeout=1.5, linger_ms=1,
        backoff_cap=0.2,
    ) as pub:
        run = pub.run("run-down")
        await run.emit("text.delta", {"text": "before"})
        await pub.flush()
        own_redis.stop()
        emitted = 0

        async def emit_forever() -> None:
            nonlocal emitted
            while True:
                await run.emit("text.delta", {"text": str(emitted)})
                emitted += 1

        emitter = asyncio.create_task(emit_forever())
        await until(lambda: pub.pending == 60, what="50 queued + one batch of 10 in flight: the bound")
        with pytest.raises(DeliveryTimeout) as failure:
            await asyncio.wait_for(emitter, 10)
        assert emitted == 60  # waited at the bound until the deadline, not growing
        assert failure.value.undelivered == [("run-down", s) for s in range(2, 63)]
        assert "run-down seq 2..61" in str(failure.value)
        assert "run-down seq 62" in str(failure.value)  # the emit that was waiting for room
        assert pub.pending == 0

        own_redis.start()
        after = await run.emit("text.delta", {"text": "after"})
        await pub.flush()
    assert after.seq == 63
    got = await consume(own_redis.url, 2)
    # the restart lost seq 1, which no group had read: the publisher kept it and sent it again first
    assert [(e.run_id, e.seq) for e in got] == [("run-down", 1), ("run-down", 63)]


@pytest.mark.slow
async def test_emit_waits_out_a_short_outage_without_loss(own_redis: RedisServer) -> None:
    """Retries with backoff: an outage shorter than the deadline loses nothing."""
    async with Publisher.connect(own_redis.url, delivery_timeout=20, backoff_cap=0.2) as pub:
        own_redis.stop()
        run = pub.run("run-blip")
        for n in range(20):
            await run.emit("text.delta", {"text": str(n)})
        await until(lambda: sum(pub.outage.retried.values()) >= 3, what="three retries in the outage")
        own_redis.start()
        await asyncio.wait_for(pub.flush(), 15)
        assert pub.published == 20
    got = await consume(own_redis.url, 20)
    assert [e.seq for e in got] == list(range(1, 21))


async def test_bound_in_bytes_holds_while_the_bus_is_slow() -> None:
    """Invariant 4: a bus that doesn't take events (a full memory backlog) makes emit
    wait once ``max_pending_bytes`` is queued; it goes on as soon as the bus drains."""
    url = f"memory://{_unique()}?max_backlog=5"
    async with open_bus(url) as bus, bus.consumer("g", "c") as consumer:
        await consumer.fetch(block_ms=0)  # a group that keeps entries until acked
        async with Publisher.connect(url, max_pending_bytes=4000, linger_ms=0, max_batch=5) as pub:
            run = pub.run("run-slow")
            emitted = 0

            async def emit_forever() -> None:
                nonlocal emitted
                while True:
                    await run.emit("text.delta", {"text": "x" * 100})
                    emitted += 1

            one = len(encode(run.event("text.delta", {"text": "x" * 100})))
            run.seq -= 1  # that event was only measured
            task = asyncio.create_task(emit_forever())
            await until(lambda: pub.pending_bytes > 4000 - one, what="the bound in bytes reached")
            stuck_at = emitted
            # 4000 bytes queued + one batch (5 events) in flight
            assert 4000 - one < pub.pending_bytes <= 4000 + 5 * one and stuck_at < 60
            for _ in range(100):  # the emitter had every chance to run (it needs no I/O)
                await asyncio.sleep(0)
            assert emitted == stuck_at  # waiting, not growing
            drained = 0
            while drained < 100:
                batch = await consumer.fetch(max_count=50, block_ms=200)
                await consumer.ack(batch)
                drained += len(batch)
            assert emitted >= 100 - pub.pending
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

            async def keep_draining() -> None:
                while True:
                    await consumer.ack(await consumer.fetch(max_count=50, block_ms=50))

            drainer = asyncio.create_task(keep_draining())
            await asyncio.wait_for(pub.flush(), 10)
        drainer.cancel()
        await asyncio.gather(drainer, return_exceptions=True)


def test_ids_stay_monotonic_across_carries_and_clock_steps() -> None:
    """Koder agent stream: "ULID, monotonic per stream" — also when the random part's last
    base32 digit carries and when the wall clock steps back."""
    from runwire.core.ulid import ulid_timestamp_ms
    from runwire.sdk.publisher import _Clock

    clock = _Clock()
    first, _ = clock.stamp()
    clock._rand |= 0b11111_11111  # the next id carries out of the last two digits
    ids = [first] + [clock.stamp()[0] for _ in range(5000)]
    clock._last_ms += 60_000  # the wall clock is now a minute behind the last id
    ids += [clock.stamp()[0] for _ in range(10)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 30 and i.startswith("evt_") for i in ids)
    assert abs(ulid_timestamp_ms(ids[0]) - time.time() * 1000) < 5000
