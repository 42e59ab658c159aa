"""gRPC Control, Ingest and ListRuns: the HTTP endpoints' code paths, gRPC status codes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from tests.edge.harness import controls_received, run_events
from tests.events import event

from .harness import serve


def message(run_id: str, seq: int, type: str = "text.delta", payload: str = '{"text": "hi"}') -> pb.Event:
    return pb.Event(id=f"01J{seq:023d}", ts="2026-01-01T00:00:00Z", type=type, run_id=run_id, seq=seq, payload=payload)


async def test_control_reaches_the_agents_run_controls(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """Control → the run's control channel → ``async for cmd in run.controls()`` in the agent,
    with its args; an unknown command or args that are not a JSON object are INVALID_ARGUMENT, a run
    nobody has seen NOT_FOUND."""
    publisher = Publisher(memory_bus)
    await publisher.start()
    run = publisher.run(run_id)
    received, listener = controls_received(run, 2)
    await memory_bus.append((run_id, "raw"), run_events(run_id, 2, end=None))  # a live run: control needs one
    async with serve(memory_bus, store) as edge:
        client = edge.client()
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await client.control("run-nobody-has-seen", "pause")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        for command, args in (("explode", ""), ("pause", "[1]"), ("pause", "{not json")):
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await client.control(run_id, command, args)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = await client.control(run_id, "pause")
        assert reply.command == "pause" and reply.id
        await client.control(run_id, "redirect", '{"prompt": "shorter"}')
    await asyncio.wait_for(listener, 5)
    await publisher.close()
    assert received == [("pause", {}), ("redirect", {"prompt": "shorter"})]


async def test_ingest_publishes_every_valid_event_and_rejects_each_bad_one_with_its_code(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Partial acceptance as HTTP ingest: valid events are published in order; an unknown type
    comes back as KAI-STREAM-PROTO-0002, a payload that is not JSON or an event without a run
    as KAI-STREAM-PROTO-0001, each with its 1-based index in the call."""
    consumer = memory_bus.consumer("test-grpc-ingest", "c1")
    sent = [
        message(run_id, 1),
        message(run_id, 2, type="nope.nope"),
        message(run_id, 3, payload="{not json"),
        message(run_id, 4, payload='{"text":\n "two lines"}'),
        message("", 5),
        message(run_id, 6, type="tool.start", payload='{"call_id": "c", "tool": "t"}'),
    ]
    async with serve(memory_bus, store) as edge:
        reply = await edge.client().ingest(sent)
    assert reply.accepted == 3
    assert [(r.index, r.code) for r in reply.rejected] == [
        (2, "KAI-STREAM-PROTO-0002"), (3, "KAI-STREAM-PROTO-0001"), (5, "KAI-STREAM-PROTO-0001"),
    ]
    delivered = [envelope.decode(d.data) for d in await consumer.fetch(100, block_ms=500)]
    await consumer.close()
    assert [(e.seq, e.type) for e in delivered] == [(1, "text.delta"), (4, "text.delta"), (6, "tool.start")]
    assert delivered[1].payload.text == "two lines"  # type: ignore[union-attr]


async def test_list_runs_filters_by_state(memory_bus: Bus, store: ReplayLog) -> None:
    """ListRuns is GET /v1/runs: newest first, state filter, a bad time is INVALID_ARGUMENT."""
    await store.append(run_events("r-done", 4, end="done"))
    await store.append(run_events("r-open", 3, end=None))
    await store.append([event("r-error", 1, "run.lifecycle", {"state": "error"})])
    async with serve(memory_bus, store) as edge:
        client = edge.client()
        everything = await client.list_runs()
        done = await client.list_runs(state="done")
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await client.list_runs(since="yesterday")
    assert {r.run_id for r in everything.runs} == {"r-done", "r-open", "r-error"}
    assert [(r.run_id, r.state, r.terminal, r.last_seq) for r in done.runs] == [("r-done", "done", True, 4)]
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
