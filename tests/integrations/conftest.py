"""Framework integrations end to end: a real Redis bus, two workers and an edge
(:func:`tests.e2e_harness.pipeline`); the agent publishes with ``redis://`` or ``http://``
(through the edge), and the test reads the run back as an SSE client of the raw view."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from runwire.sdk.publisher import Publisher
from tests.e2e_harness import Pipeline, pipeline, sse, wait_for_stream_end


@pytest.fixture
async def pipe(redis_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async with pipeline(redis_url, f"sqlite:///{tmp_path}/replay.db") as running:
        yield running


@pytest.fixture(params=["redis", "http"])
async def publisher(request: pytest.FixtureRequest, pipe: Pipeline) -> AsyncIterator[Publisher]:
    """A publisher of the agent's own, on the bus itself (deltas queued back to back joined, the
    default) or through the edge's HTTP ingest (one event per framework delta, ``join_deltas``
    off: the mapping compared delta by delta)."""
    url = pipe.url if request.param == "redis" else pipe.edge.url
    async with Publisher.connect(url, linger_ms=1.0, join_deltas=request.param == "redis") as pub:
        yield pub


async def read_run(pipe: Pipeline, run_id: str) -> list[dict[str, Any]]:
    """Every event of a finished run (and its children, flattened) as an SSE client of the raw
    view sees it: the koder envelope of each frame."""
    await wait_for_stream_end(pipe.bus, run_id)
    async with httpx.AsyncClient(base_url=pipe.edge.url, timeout=30) as http:
        frames = await sse(http, f"/v1/runs/{run_id}/stream?detail=full")
    return [msgspec.json.decode(frame.data) for frame in frames if frame.data]


def own(events: list[dict[str, Any]], run_id: str | None = None) -> list[dict[str, Any]]:
    """The events of one run among a flattened stream (``run_id`` None: the root's own)."""
    if run_id is None:
        return [e for e in events if not e.get("child_id")]
    return [e for e in events if e.get("child_id") == run_id]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["payload"]["text"] for e in events if e["type"] == "text.delta")


def joins(published: list[str], pieces: list[str], publisher: Publisher | None = None) -> bool:
    """Whether the published deltas are the framework's ``pieces`` (the empty ones aside), in
    order, every piece once: one event each where ``publisher`` does not join deltas, else each
    event one or several pieces queued back to back, joined."""
    rest = [piece for piece in pieces if piece]
    if publisher is not None and not publisher.join_deltas:
        return published == rest
    for text in published:
        taken = ""
        while rest and len(taken) < len(text):
            taken += rest.pop(0)
        if taken != text:
            return False
    return not rest


def states(events: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["state"] for e in events if e["type"] == "run.lifecycle"]


async def control(pipe: Pipeline, run_id: str, command: str, **args: Any) -> float:
    """A client's command, as any client sends it (``POST /v1/runs/{run}/control``), once the
    run is known to the edge; returns the monotonic time the accepted request was sent at."""
    async with httpx.AsyncClient(base_url=pipe.edge.url, timeout=10) as http:
        for _ in range(200):
            sent = time.monotonic()
            answer = await http.post(f"/v1/runs/{run_id}/control", json={"command": command, "args": args})
            if answer.status_code != 404:
                break
            await asyncio.sleep(0.05)
        assert answer.status_code == 202, answer.text
    return sent


STOP = "user pressed stop"


async def cancel_stops_it_within_a_second(
    pipe: Pipeline, publisher: Publisher, task: asyncio.Task[Any], stopped_at: list[float],
    run_id: str, *, target: str | None = None, reason: str = STOP,
) -> list[dict[str, Any]]:
    """A client cancels ``target`` (default: ``run_id``) while the agent's ``task`` runs: the
    framework stops (``stopped_at`` gets the moment its code saw it) within 1 s of the request,
    ``run()`` raises ``CancelledError``, and the run ends ``aborted`` with the client's reason
    (``target``'s own end: with ``target`` a child run, its events among the root's). Returns
    the run's events."""
    await publisher.flush()
    sent = await control(pipe, target or run_id, "cancel", reason=reason)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert stopped_at and stopped_at[0] - sent < 1.0, f"stopped {stopped_at[0] - sent:.2f}s after the cancel"
    events = await read_run(pipe, run_id)
    ended = [e for e in events if e["type"] == "run.lifecycle" and e.get("child_id") == target]
    assert ended[-1]["payload"] == {"state": "aborted", "reason": reason}
    return events


async def wait_for_awaiting(pipe: Pipeline, run_id: str) -> dict[str, Any]:
    """The run's ``awaiting_approval`` event, as a client of the raw view sees it live."""
    async with httpx.AsyncClient(base_url=pipe.edge.url, timeout=10) as http:
        for _ in range(200):
            async with http.stream("GET", f"/v1/runs/{run_id}/stream?detail=full") as response:
                if response.status_code == 404:
                    await asyncio.sleep(0.05)
                    continue
                assert response.status_code == 200, response.status_code
                async for line in response.aiter_lines():
                    if line.startswith("data:") and "awaiting_approval" in line:
                        event: dict[str, Any] = msgspec.json.decode(line[5:])
                        return event
        raise AssertionError("no awaiting_approval")
