"""One limits table, every entrance (pipeline/core/limits.py; docs/security.md § Limits).

The same oversize request gets the same refusal — ``KAI-STREAM-REQ-0002`` — whether it comes over
HTTP, a WebSocket, gRPC or a Durable Streams append, and nothing of it is published.
"""

from __future__ import annotations

import contextlib
import json

import grpc
import httpx
import pytest
import websockets

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.edge import EdgeSettings
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.store.base import ReplayLog
from tests.edge.harness import publish, run_events
from tests.grpc.harness import serve

from .conftest import new_id

TOO_LARGE = "KAI-STREAM-REQ-0002"
LIMIT = 10
"""``max_ingest_events`` in these tests: eleven events are one too many."""


def pb_event(run_id: str, seq: int) -> pb.Event:
    return pb.Event(id=f"01J{seq:023d}", ts="2026-01-01T00:00:00Z", type="text.delta", run_id=run_id,
                    seq=seq, payload='{"text": "x"}')


async def nothing_published(bus: Bus) -> bool:
    async with bus.consumer("check", "c") as consumer:
        return not await consumer.fetch(100, block_ms=100)


async def test_too_many_events_are_refused_alike_on_http_ds_and_grpc(memory_bus: Bus, store: ReplayLog) -> None:
    run_id = new_id("many")
    events = run_events(run_id, LIMIT + 1, end=None)
    memory_bus.consumer("check", "c")
    async with serve(memory_bus, store, EdgeSettings(max_ingest_events=LIMIT)) as edge, \
            httpx.AsyncClient(base_url=edge.http, timeout=10) as http:
        ingest = await http.post(f"/v1/runs/{run_id}/events",
                                 content=b"\n".join(envelope.encode(e) for e in events))
        url = f"/v1/ds/runs/{run_id}"
        await http.put(url, headers={"Content-Type": "application/json"})
        durable = await http.post(url, content=json.dumps([envelope.to_builtins(e) for e in events]),
                                  headers={"Content-Type": "application/json"})
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await edge.client().ingest([pb_event(run_id, seq) for seq in range(1, LIMIT + 2)])
    assert (ingest.status_code, ingest.json()["code"]) == (413, TOO_LARGE)
    assert (durable.status_code, durable.json()["code"]) == (413, TOO_LARGE)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("runwire-error-code", TOO_LARGE) in tuple(refused.value.trailing_metadata() or ())
    assert await nothing_published(memory_bus)


async def test_an_oversize_control_is_refused_alike_on_http_and_grpc(memory_bus: Bus, store: ReplayLog) -> None:
    run_id = new_id("ctl")
    await publish(memory_bus, store, run_events(run_id, 2, end=None))
    args = json.dumps({"note": "x" * (100 * 1024)})
    async with serve(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.http, timeout=10) as http:
        over_http = await http.post(f"/v1/runs/{run_id}/control",
                                    content=json.dumps({"command": "cancel", "args": json.loads(args)}))
        with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
            await edge.client().control(run_id, "cancel", args)
        deep = json.dumps({"a": json.loads("[" * 100 + "]" * 100)})
        with pytest.raises(grpc.aio.AioRpcError) as too_deep:
            await edge.client().control(run_id, "cancel", deep)
    assert (over_http.status_code, over_http.json()["code"]) == (413, TOO_LARGE)
    assert over_grpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("runwire-error-code", TOO_LARGE) in tuple(over_grpc.value.trailing_metadata() or ())
    assert too_deep.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_oversize_or_too_deep_chat_frame_closes_the_socket_with_a_code(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """A chat frame over one frame's bytes closes with 1009 and the code; one nested past the depth
    limit, or naming a request id over the id limit, closes with 1008 — never an unexplained drop."""
    big = json.dumps({"type": "send", "requestId": "r1", "id": "c", "messages": ["x" * (1 << 20)]})
    deep = '{"type": "send", "requestId": "r1", "id": "c", "metadata": ' + "[" * 970 + "]" * 970 + "}"
    long_id = json.dumps({"type": "resume", "requestId": "r" * 3000, "id": "c"})
    closes = []
    async with serve(memory_bus, store) as edge:
        for frame in (big, deep, long_id):
            async with websockets.connect(edge.http.replace("http://", "ws://") + "/v1/threads",
                                          max_size=None) as ws:
                await ws.send(frame)
                with contextlib.suppress(websockets.ConnectionClosed):
                    await ws.recv()
                closes.append((ws.close_code, ws.close_reason or ""))
    assert closes[0][0] == 1009 and TOO_LARGE in closes[0][1]
    assert [code for code, _ in closes[1:]] == [1008, 1008]


async def test_a_thread_id_over_the_id_limit_is_refused_at_ingest_not_dead_lettered(
    memory_bus: Bus, store: ReplayLog
) -> None:
    run_id = new_id("thr")
    body = b"\n".join(envelope.encode(e) for e in run_events(run_id, 2, end=None))
    memory_bus.consumer("check", "c")
    async with serve(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.http, timeout=10) as http:
        response = await http.post(f"/v1/runs/{run_id}/events", content=body, headers={"Thread-Id": "t" * 3000})
    assert response.status_code == 400 and response.json()["code"] == "KAI-STREAM-REQ-0001"
    assert await nothing_published(memory_bus)


async def test_replay_import_refuses_a_timestamp_that_is_no_instant(store: ReplayLog) -> None:
    """``replay import`` is an entrance too: month 13 passes the RFC 3339 pattern but is no instant;
    the line is reported with its code and the valid lines around it are kept (so no later read of
    the run meets it)."""
    from runwire.store.jsonl import import_jsonl

    run_id = new_id("imp")
    good = run_events(run_id, 3, end=None)
    bad = envelope.encode(good[1]).replace(good[1].ts.encode(), b"2026-13-01T00:00:00.000Z")
    report = await import_jsonl(store, [envelope.encode(good[0]), bad, envelope.encode(good[2])])
    assert [(e.line, e.code, e.field) for e in report.errors] == [(2, "KAI-STREAM-PROTO-0001", "$.ts")]
    assert [e.seq for e in await store.read(run_id, limit=10)] == [1, 3]
