"""Every egress format on the live endpoint; AG-UI and AI SDK checked by their own client libraries."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from runwire import protocols
from runwire.bus.base import Bus
from runwire.core.envelope import Event
from runwire.store.base import ReplayLog
from tests.events import event
from tests.nodecheck import validate
from tests.waiting import until

from .harness import append, decoded, read_sse, serve_edge


def story(run_id: str) -> list[Event]:
    """A run with every kind of event: reasoning, text, a tool call, a step, a child run, usage, done."""
    child = f"{run_id}-child"
    specs: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("run.lifecycle", {"state": "running"}, {}),
        ("reasoning.delta", {"text": "thinking "}, {}),
        ("reasoning.delta", {"text": "harder"}, {}),
        ("text.delta", {"text": "Hello "}, {}),
        ("text.delta", {"text": "world"}, {}),
        ("tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "x"}}, {}),
        ("tool.end", {"call_id": "c1", "ok": True, "output": {"hits": 3}, "duration_ms": 12}, {}),
        ("step.boundary", {"step_index": 1, "step_kind": "tool-roundtrip"}, {}),
        ("child.spawn", {"child_id": child, "prompt": "sub task"}, {}),
        ("run.lifecycle", {"state": "running"}, {"child_id": child}),
        ("text.delta", {"text": "child says hi"}, {"child_id": child}),
        ("run.lifecycle", {"state": "done"}, {"child_id": child}),
        ("text.delta", {"text": " again"}, {}),
        ("x.usage", {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}, {}),
        ("run.lifecycle", {"state": "done"}, {}),
    ]
    return [event(run_id, seq, kind, payload, **extra) for seq, (kind, payload, extra) in enumerate(specs, 1)]


async def _frames(url: str, **headers: str) -> tuple[list[dict[str, Any]], httpx.Headers]:
    async with httpx.AsyncClient(timeout=10) as http, http.stream("GET", url, headers=headers) as response:
        events, _ = await asyncio.wait_for(read_sse(response), 10)
        return decoded(events), response.headers


async def _frames_live(
    bus: Bus, store: ReplayLog, events: list[Event], head: int, query: str
) -> tuple[list[dict[str, Any]], httpx.Headers]:
    """A client's frames of the run (``query`` after the stream's URL): ``events[:head]`` are
    there before it connects, the rest come once it is reading live."""
    run_id = events[0].run_id
    await append(bus, run_id, events[:head])
    async with serve_edge(bus, store) as edge:
        reader = asyncio.create_task(_frames(f"{edge.url}/v1/runs/{run_id}/stream?{query}"))
        await until(lambda: edge.live_clients(run_id) == 1, what="the client attached")
        await append(bus, run_id, events[head:])
        return await reader


@pytest.mark.parametrize("format_name", sorted(protocols.EGRESS))
async def test_every_egress_format_streams_live_and_ends(
    memory_bus: Bus, store: ReplayLog, run_id: str, format_name: str
) -> None:
    """``format=`` serves every egress format over SSE, live, until the run ends."""
    events = story(run_id)
    frames, headers = await _frames_live(memory_bus, store, events, 6, f"detail=full&format={format_name}")
    expected = protocols.egress(format_name).encode_all(events)
    assert len(frames) == len(expected) > 0
    for key, value in protocols.egress(format_name).headers.items():
        assert headers[key] == value


@pytest.mark.node
async def test_agui_stream_passes_verify_events(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """format=agui from the start is accepted by @ag-ui/client's verifyEvents."""
    await append(memory_bus, run_id, story(run_id))
    async with serve_edge(memory_bus, store) as edge:
        frames, _ = await _frames(f"{edge.url}/v1/runs/{run_id}/stream?detail=full&format=agui")
    summary = await asyncio.to_thread(validate, "verify-agui.mjs", frames)
    assert summary["events"] == len(frames)


@pytest.mark.node
@pytest.mark.parametrize("join", ["after=live", "after=4", "after=5"])
async def test_agui_mid_run_join_passes_verify_events(
    memory_bus: Bus, store: ReplayLog, run_id: str, join: str
) -> None:
    """A strict client joining mid-message / mid-tool-call gets the format's preamble first,
    so verifyEvents accepts the sequence (AG-UI itself has no resume)."""
    # five events before the client joins: a text message is open
    frames, _ = await _frames_live(memory_bus, store, story(run_id), 5, f"detail=full&format=agui&{join}")
    assert frames[0]["type"] == "RUN_STARTED"
    await asyncio.to_thread(validate, "verify-agui.mjs", frames)


@pytest.mark.node
async def test_ai_sdk_stream_reads_with_read_ui_message_stream(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """format=ai-sdk carries ``x-vercel-ai-ui-message-stream: v1`` and reads with readUIMessageStream."""
    await append(memory_bus, run_id, story(run_id))
    async with serve_edge(memory_bus, store) as edge:
        async with httpx.AsyncClient(timeout=10) as http, http.stream(
            "GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full&format=ai-sdk"
        ) as response:
            events, _ = await read_sse(response)
            assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert events[-1].data == "[DONE]"
    await asyncio.to_thread(validate, "verify-ai-sdk.mjs", decoded(events))
