"""gRPC ``Stream`` (Koder agent stream §5.3): resume, shaping, R4, endings and bad requests."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import msgspec
import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.edge import EdgeSettings
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.processing.shaping import shape
from runwire.store.base import ReplayLog
from tests.edge.harness import append, decoded, live_clients, read_sse, run_events
from tests.edge.test_views import spaced
from tests.events import event
from tests.waiting import until

from .harness import read_all, read_rest, serve


def as_json(message: pb.Event) -> dict[str, object]:
    """An ``Event`` message as the JSON envelope it stands for (empty fields omitted)."""
    out: dict[str, object] = {
        "type": message.type, "id": message.id, "ts": message.ts, "run_id": message.run_id,
        "seq": message.seq, "payload": json.loads(message.payload),
    }
    if message.child_id:
        out["child_id"] = message.child_id
    if message.HasField("span"):
        out["span"] = [message.span.first, message.span.last]
    return out


def canonical(event: envelope.Event) -> dict[str, object]:
    data: dict[str, object] = msgspec.json.decode(envelope.encode(event))
    return data


async def test_t3_resume_after_seq_n_on_a_second_edge_instance_gets_exactly_n_plus_1_onward(
    redis_url: str, store: ReplayLog, run_id: str
) -> None:
    """Koder agent stream §7 T3 over gRPC: a client that read seqs 1..N from one edge and calls
    again with after_seq=N on another instance (sharing only Redis and the replay log) gets
    exactly N+1 onward, then status OK at the run's end."""
    events = run_events(run_id, 60)
    async with open_bus(redis_url) as bus_a, open_bus(redis_url) as bus_b:
        await append(bus_a, run_id, events[:30])
        async with serve(bus_a, store) as first:
            call = first.client().stream(run_id, detail="full")
            seen = []
            async for message in call:
                seen.append(message.seq)
                if message.seq == 25:
                    call.cancel()
                    break
        assert seen == list(range(1, 26))
        async with serve(bus_b, store) as second:
            call = second.client().stream(run_id, detail="full", after_seq=25)
            reader = asyncio.create_task(read_all(call))
            await until(lambda: live_clients(second.edge.hub, run_id) == 1, what="the client attached")
            await append(bus_b, run_id, events[30:])
            got = await asyncio.wait_for(reader, 10)
            assert await call.code() == grpc.StatusCode.OK
    assert [m.seq for m in got] == list(range(26, 61))
    assert [as_json(m) for m in got] == [canonical(e) for e in events[25:]]


async def test_r1_shaped_by_default_and_every_token_with_detail_full(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """R1: the default view is the shaped one (deltas coalesced, span set); R2: detail=full
    returns every raw event. Both are the same JSON envelopes the SSE edge sends."""
    raw = spaced(run_id)
    shaped = shape(raw)
    await append(memory_bus, run_id, raw)
    await append(memory_bus, run_id, shaped, view="shaped")
    async with serve(memory_bus, store) as edge:
        client = edge.client()
        default = await read_all(client.stream(run_id))
        full = await read_all(client.stream(run_id, detail="full"))
    assert [as_json(m) for m in default] == [canonical(e) for e in shaped]
    assert [as_json(m) for m in full] == [canonical(e) for e in raw]
    assert len(default) < len(full) and any(m.HasField("span") for m in default)


async def test_one_hub_serves_sse_and_grpc_clients_of_a_run(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """gRPC runs beside HTTP in the same process from the same hub: one delivery stream read
    for both transports, and both see the same events."""
    async with serve(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        grpc_reader = asyncio.create_task(read_all(edge.client().stream(run_id, detail="full")))
        async with http.stream("GET", f"{edge.http}/v1/runs/{run_id}/stream?detail=full") as response:
            await until(lambda: live_clients(edge.edge.hub, run_id) == 2, what="both clients attached")
            assert list(edge.edge.hub.streams) == [(run_id, "raw")]
            feeds = edge.edge.hub.streams[(run_id, "raw")].feeds
            assert len(feeds) == 1 and len(next(iter(feeds.values())).clients) == 2
            await append(memory_bus, run_id, run_events(run_id, 20))
            sse, _ = await read_sse(response)
        got = await asyncio.wait_for(grpc_reader, 10)
    assert [as_json(m) for m in got] == decoded(sse)


async def test_other_formats_come_as_json_frames_with_the_seq(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """format=agui: each Event carries that protocol's frames as JSON strings and the seq to resume at."""
    await append(memory_bus, run_id, run_events(run_id, 5))
    async with serve(memory_bus, store) as edge:
        got = await read_all(edge.client().stream(run_id, detail="full", format="agui"))
    assert [m.seq for m in got] == [1, 2, 3, 4, 5]
    frames = [json.loads(f) for m in got for f in m.frames]
    assert frames[0]["type"] == "RUN_STARTED" and frames[-1]["type"] == "RUN_FINISHED"
    assert not any(m.payload for m in got)


@pytest.mark.slow
async def test_r4_a_slow_client_loses_deltas_only_and_gets_its_dropped_count(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """R4 over gRPC: a client that stops reading loses reasoning/text deltas (never tool or
    lifecycle events) and its terminal run.lifecycle carries dropped_count."""
    settings = EdgeSettings(client_queue_events=64, client_queue_bytes=1 << 20)
    total = 6000
    events = [event(run_id, 1, "run.lifecycle", {"state": "running"})]
    for seq in range(2, total):
        if seq % 500 == 0:
            events.append(event(run_id, seq, "tool.start", {"call_id": f"c{seq}", "tool": "t"}))
        else:
            kind = "reasoning.delta" if seq % 2 else "text.delta"
            events.append(event(run_id, seq, kind, {"text": "x" * 400}))
    events.append(event(run_id, total, "run.lifecycle", {"state": "done"}))
    async with serve(memory_bus, store, settings) as edge:
        await append(memory_bus, run_id, events[:1])
        client = edge.client(options=[("grpc.http2.bdp_probe", 0)])
        call = client.stream(run_id, detail="full")
        first = await call.read()
        assert first.seq == 1
        for start in range(1, total, 500):
            await append(memory_bus, run_id, events[start:start + 500])
            await asyncio.sleep(0.01)
        feeds = edge.edge.hub.streams[(run_id, "raw")].feeds.values()
        # the client reads nothing while the hub queues (and drops) everything up to the end
        await until(lambda: all(feed.position == total for feed in feeds), what="the hub at the end")
        rest = await asyncio.wait_for(read_rest(call), 30)
    got = [first, *rest]
    seqs = [m.seq for m in got]
    assert seqs == sorted(seqs) and len(seqs) < total
    kept_types = {m.type for m in got}
    missing = [e for e in events if e.seq not in set(seqs)]
    assert missing and {e.type for e in missing} <= {"reasoning.delta", "text.delta"}
    assert "tool.start" in kept_types
    assert sum(1 for m in got if m.type == "tool.start") == sum(1 for e in events if e.type == "tool.start")
    last = json.loads(got[-1].payload)
    assert got[-1].type == "run.lifecycle" and last["state"] == "done"
    assert last["dropped_count"] == len(missing)


async def test_a_cursor_older_than_retention_ends_out_of_range_with_conn_0002(
    store: ReplayLog, run_id: str
) -> None:
    """A cursor neither the hot tier nor the replay log covers: a clear status, the
    KAI-STREAM-CONN-0002 code in its details, never a partial replay or a hang."""
    async with open_bus("memory://?maxlen=5") as bus:
        await append(bus, run_id, run_events(run_id, 100, end=None))
        async with serve(bus, store) as edge:
            call = edge.client().stream(run_id, detail="full", after_seq=3)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await asyncio.wait_for(read_all(call), 5)
    error = failure.value
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert (error.details() or "").startswith("KAI-STREAM-CONN-0002: ") and "seq 3" in (error.details() or "")
    assert ("runwire-error-code", "KAI-STREAM-CONN-0002") in tuple(error.trailing_metadata() or ())


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"format": "nope"}, "unknown format 'nope'"),
        ({"detail": "most"}, "unknown detail 'most'"),
        ({"profile": "nobody"}, "unknown profile 'nobody'"),
        ({"after_seq": -1}, "must not be negative"),
        ({"run_id": ""}, "run_id is required"),
    ],
)
async def test_bad_stream_requests_are_invalid_argument(
    memory_bus: Bus, store: ReplayLog, run_id: str, fields: dict[str, object], expected: str
) -> None:
    async with serve(memory_bus, store) as edge:
        request = {"run_id": run_id, **fields}
        call = edge.client().stream(**request)  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await asyncio.wait_for(read_all(call), 5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (failure.value.details() or "")


async def test_closing_the_call_is_a_disconnect_not_a_cancel(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Stop is not disconnect, over gRPC: cancelling a Stream call leaves the run alone and frees the client."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    async with serve(memory_bus, store) as edge:
        controls = memory_bus.controls(run_id, after="0")
        call = edge.client().stream(run_id, detail="full")
        assert (await call.read()).seq == 1
        call.cancel()
        for _ in range(100):
            if not edge.edge.hub.streams:
                break
            await asyncio.sleep(0.02)
        assert not edge.edge.hub.streams
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(aiter(controls)), 0.3)
