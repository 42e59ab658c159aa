"""The edge hub isolates failures: an event a format cannot encode is skipped in that format alone.

Koder agent stream §4 (every stream ends; a client can tell what it missed):
an event that one feed cannot encode — here a tool input nested far deeper
than any encoder can walk, which the ingest bounds keep out but which the hub
must survive regardless (an older worker, a direct writer) — reaches that
feed's clients as a coded ``x.runwire.skipped`` frame with its seq; the run's
other events, its other feeds and other runs in the same batch go on, and
every stream still ends.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event, ToolStart, ToolStartPayload
from runwire.store.base import ReplayLog
from tests.edge.harness import append, decoded, read_sse, serve_edge
from tests.events import event
from tests.waiting import until

FORMATS = ["ai-sdk", "agui", "koder", "loom"]
DEPTH = 20_000
"""Deeper than any recursive encoder (or the interpreter's recursion limit) can go."""


def deep_value(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_tool_start(run_id: str, seq: int) -> Event:
    """Built in code, as a direct writer would: nothing on the way checks its depth."""
    return ToolStart(
        id=f"01J{uuid.uuid4().hex[:23].upper()}", ts=envelope.now_ts(), run_id=run_id, seq=seq,
        payload=ToolStartPayload(call_id="deep", tool="search", input=deep_value(DEPTH)),
    )


def run_with_a_deep_event(run_id: str) -> list[Event]:
    return [
        event(run_id, 1, "run.lifecycle", {"state": "running"}),
        event(run_id, 2, "text.delta", {"text": "before "}),
        deep_tool_start(run_id, 3),
        event(run_id, 4, "text.delta", {"text": "after"}),
        event(run_id, 5, "run.lifecycle", {"state": "done"}),
    ]


def plain_run(run_id: str) -> list[Event]:
    return [
        event(run_id, 1, "run.lifecycle", {"state": "running"}),
        event(run_id, 2, "text.delta", {"text": "untouched"}),
        event(run_id, 3, "run.lifecycle", {"state": "done"}),
    ]


async def read_run(url: str) -> tuple[list[dict[str, Any]], list[str | None]]:
    async with httpx.AsyncClient(timeout=15) as http, http.stream("GET", url) as response:
        assert response.status_code == 200
        events, _ = await asyncio.wait_for(read_sse(response), 15)
    return decoded(events), [e.id for e in events]


def skip_notices(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``x.runwire.skipped`` payloads in whatever shape the format gives extension events."""
    found = []
    for frame in frames:
        text = repr(frame)
        if "x.runwire.skipped" in text or frame.get("type") == "error":
            found.append(frame)
    return found


def text_of(frames: list[dict[str, Any]]) -> str:
    return repr(frames)


@pytest.mark.parametrize("live", [True, False], ids=["live", "resumed"])
async def test_an_event_a_format_cannot_encode_is_skipped_there_and_everything_else_goes_on(
    memory_bus: Bus, store: ReplayLog, live: bool
) -> None:
    hostile_run = f"run-{uuid.uuid4().hex[:8]}"
    other_run = f"run-{uuid.uuid4().hex[:8]}"
    async with serve_edge(memory_bus, store) as edge:
        urls = {f: f"{edge.url}/v1/runs/{hostile_run}/stream?detail=full&format={f}" for f in FORMATS}
        other_url = f"{edge.url}/v1/runs/{other_run}/stream?detail=full&format=ai-sdk"
        if not live:  # the run is already there: feeds are primed and clients catch up from history
            await append(memory_bus, hostile_run, run_with_a_deep_event(hostile_run)[:4])
        readers = {f: asyncio.create_task(read_run(url)) for f, url in urls.items()}
        other = asyncio.create_task(read_run(other_url))
        await until(lambda: (edge.live_clients(hostile_run), edge.live_clients(other_run)) == (len(urls), 1),
                    what="every client attached")
        # one tail batch: both runs' events together
        events = run_with_a_deep_event(hostile_run)
        await append(memory_bus, hostile_run, events if live else events[4:])
        await append(memory_bus, other_run, plain_run(other_run))
        results = {f: await task for f, task in readers.items()}
        other_frames, _ = await other
    for format_name, (frames, ids) in results.items():
        notices = skip_notices(frames)
        assert len(notices) == 1, (format_name, frames)
        assert "KAI-STREAM-PROTO-0001" in repr(notices[0]), format_name
        assert "before" in text_of(frames) and "after" in text_of(frames), format_name
        assert "3" in ids, (format_name, ids)  # the skipped event keeps its seq: a resume goes past it
    assert "untouched" in text_of(other_frames)
    assert other_frames[-1]["type"] == "finish"


async def test_a_client_resuming_past_the_skipped_event_gets_the_rest(
    memory_bus: Bus, store: ReplayLog
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await append(memory_bus, run_id, run_with_a_deep_event(run_id))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=15) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full&format=ai-sdk"
        async with http.stream("GET", url, headers={"Last-Event-ID": "3"}) as response:
            events, _ = await asyncio.wait_for(read_sse(response), 15)
    frames = decoded(events)
    assert "after" in repr(frames) and not skip_notices(frames)
    assert frames[-1]["type"] == "finish"
