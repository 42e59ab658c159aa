"""The StreamWeave RPC over gRPC: stages and progress, FAILED then INTERNAL, cancellation → the agent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from runwire import protocols
from runwire.bus.base import Bus
from runwire.core.envelope import Event
from runwire.processing.shaping import shape
from runwire.sdk.publisher import Publisher
from runwire.store.base import ReplayLog
from tests.edge.harness import append
from tests.events import event

from .harness import read_all, serve

FAILURE = "LLM call failed: API rate limit exceeded"


def agent_run(run_id: str, end: dict[str, Any] | None) -> list[Event]:
    """planning → a turn → a tool call → a second turn → ``end`` (a terminal lifecycle, or none)."""
    steps: list[tuple[str, dict[str, Any]]] = [
        ("run.lifecycle", {"state": "planning"}),
        ("run.lifecycle", {"state": "running"}),
        ("text.delta", {"text": "Let me look "}),
        ("text.delta", {"text": "that up."}),
        ("tool.start", {"call_id": "c1", "tool": "execute_query", "input": {"sql": "select 1"}}),
        ("tool.end", {"call_id": "c1", "ok": True, "output": {"rows": 1}}),
        ("text.delta", {"text": "The sum is 4"}),
    ]
    if end is not None:
        steps.append(("run.lifecycle", end))
    return [event(run_id, seq, kind, payload) for seq, (kind, payload) in enumerate(steps, start=1)]


def egress_frames(events: list[Event]) -> list[dict[str, Any]]:
    encoder = protocols.egress("streamweave")
    return [json.loads(frame) for e in shape(events) for frame in encoder.encode(e)]


def as_frame(message: Any) -> dict[str, Any]:
    """A WeaveProgress as the StreamWeave RPC's HTTP/SSE JSON (int64 timestamp as a number)."""
    data = MessageToDict(message, preserving_proto_field_name=True)
    data["timestamp"] = int(data.get("timestamp", 0))
    data.setdefault("progress", 0)
    return data


async def test_streamweave_stages_progress_and_partial_result_then_ok(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """StreamWeave RPC: PATTERN_SELECTION 10 → LLM_GENERATION 20 → TOOL_EXECUTION 55 (tool_name)
    → LLM_GENERATION 30 → COMPLETED 100 with partial_result; the call then ends OK. The messages
    carry exactly the streamweave egress's frames."""
    events = agent_run(run_id, {"state": "done"})
    await append(memory_bus, run_id, events)
    await append(memory_bus, run_id, shape(events), view="shaped")
    async with serve(memory_bus, store) as edge:
        call = edge.client().weave(run_id)
        got = await asyncio.wait_for(read_all(call), 10)
        assert await call.code() == grpc.StatusCode.OK
    stages = [(m.stage, m.progress, m.tool_name) for m in got]
    assert [(pb_name(s), p, t) for s, p, t in stages] == [
        ("PATTERN_SELECTION", 10, ""), ("LLM_GENERATION", 20, ""), ("TOOL_EXECUTION", 55, "execute_query"),
        ("LLM_GENERATION", 30, ""), ("COMPLETED", 100, ""),
    ]
    assert got[-1].partial_result.type == "text" and got[-1].partial_result.data_json == "The sum is 4"
    assert [as_frame(m) for m in got] == egress_frames(events)


def pb_name(stage: int) -> str:
    from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb

    return pb.ExecutionStage.Name(stage).removeprefix("EXECUTION_STAGE_")  # type: ignore[arg-type]


async def test_a_failed_run_sends_failed_then_ends_internal_with_the_same_message(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """StreamWeave RPC § Error handling: FAILED (progress 0) is emitted, then the stream
    terminates with gRPC status INTERNAL and the FAILED event's message — also on the StreamWeave
    RPC's own service path, /loom.v1.LoomService/StreamWeave."""
    events = agent_run(run_id, {"state": "error", "reason": FAILURE})
    await append(memory_bus, run_id, events)
    await append(memory_bus, run_id, shape(events), view="shaped")
    async with serve(memory_bus, store) as edge:
        for service in ("/runwire.v1.Runwire/", "/loom.v1.LoomService/"):
            call = edge.client().weave(run_id, service=service)
            got = [m async for m in _until_error(call)]
            assert got[-1].stage == 8 and got[-1].progress == 0 and got[-1].message == FAILURE
            assert await call.code() == grpc.StatusCode.INTERNAL
            assert await call.details() == FAILURE


async def _until_error(call: Any) -> Any:
    try:
        async for message in call:
            yield message
    except grpc.aio.AioRpcError:
        return


@pytest.mark.parametrize("scopes", [("read", "control"), None])
async def test_cancelling_the_call_sends_cancel_to_the_agents_run_controls(
    memory_bus: Bus, store: ReplayLog, run_id: str, scopes: tuple[str, ...] | None
) -> None:
    """StreamWeave RPC § Cancellation: the client cancelling the call propagates to the agent —
    a cancel arrives in the agent's ``run.controls()`` (with auth, when the token may control)."""
    from runwire.edge import EdgeSettings, issue_token

    secret = "test-secret-please-rotate-0123456789abcdef" if scopes else None
    token = issue_token(secret, tenant="T", scopes=scopes) if secret and scopes else None
    publisher = Publisher(memory_bus)
    await publisher.start()
    run = publisher.run(run_id)
    received: list[str] = []

    async def agent() -> None:
        async for command in run.controls(after="0"):
            received.append(command.command)
            return

    listener = asyncio.create_task(agent())
    events = [event(run_id, seq, e.type, e.payload_dict(), tenant="T") for seq, e in
              enumerate(agent_run(run_id, None)[:3], start=1)]
    await append(memory_bus, run_id, events)
    await append(memory_bus, run_id, events, view="shaped")
    async with serve(memory_bus, store, EdgeSettings(secret=secret)) as edge:
        call = edge.client(token).weave(run_id)
        first = await asyncio.wait_for(call.read(), 5)
        assert first.progress == 10
        call.cancel()
        await asyncio.wait_for(listener, 5)
    await publisher.close()
    assert received == ["cancel"]


async def test_a_read_only_token_cancelling_its_call_does_not_cancel_the_run(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """Cancelling needs the control scope: a read-only StreamWeave client that goes away is only a
    disconnect, and nothing reaches the agent's control channel."""
    from runwire.edge import EdgeSettings, issue_token

    secret = "test-secret-please-rotate-0123456789abcdef"
    events = [event(run_id, seq, e.type, e.payload_dict(), tenant="T") for seq, e in
              enumerate(agent_run(run_id, None)[:3], start=1)]
    await append(memory_bus, run_id, events)
    await append(memory_bus, run_id, events, view="shaped")
    controls = memory_bus.controls(run_id, after="0")
    async with serve(memory_bus, store, EdgeSettings(secret=secret)) as edge:
        call = edge.client(issue_token(secret, tenant="T", scopes=("read",))).weave(run_id)
        assert (await asyncio.wait_for(call.read(), 5)).progress == 10
        call.cancel()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(aiter(controls)), 1.0)
