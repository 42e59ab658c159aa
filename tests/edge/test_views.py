"""Views and endings: shaped view recomputed from the log, profiles, children=link, silence, PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.edge import EdgeSettings
from runwire.processing.shaping import shape
from runwire.store import open_store
from runwire.store.base import ReplayLog

from .harness import append, decoded, read_sse, run_events, serve_edge
from .test_formats import story


@pytest.fixture
async def short_bus() -> AsyncIterator[Bus]:
    async with open_bus("memory://?maxlen=3") as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[ReplayLog]:
    """The replay log on SQLite and on a real PostgreSQL."""
    url = f"sqlite:///{tmp_path / 'r.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    async with open_store(url) as opened:
        yield opened


def spaced(run_id: str) -> list[Event]:
    """Deltas 40 ms apart, so shaping coalesces them into 100 ms windows."""
    base = 1_700_000_000_000
    out: list[Event] = []
    for seq in range(1, 41):
        kind = "run.lifecycle" if seq in (1, 40) else ("tool.start" if seq == 20 else "text.delta")
        payload: dict[str, Any] = {"state": "running" if seq == 1 else "done"} if kind == "run.lifecycle" else (
            {"call_id": "c", "tool": "t"} if kind == "tool.start" else {"text": f"w{seq} "}
        )
        ts = envelope.format_ts(datetime.fromtimestamp((base + seq * 40) / 1000, UTC))
        out.append(envelope.make(kind, payload, id=f"01J{seq:023d}", ts=ts, run_id=run_id, seq=seq))
    return out


async def test_shaped_view_after_the_hot_tier_is_gone_is_recomputed_from_raw_events(
    short_bus: Bus, any_store: ReplayLog, run_id: str
) -> None:
    """One seq space: Last-Event-ID N resumes the shaped view at raw seq N+1, recomputed with
    runwire.processing.shaping.shape from the replay log when the hot tier no longer has it."""
    raw = spaced(run_id)
    shaped = shape(raw)
    await any_store.append(raw)
    await append(short_bus, run_id, raw)
    await append(short_bus, run_id, shaped, view="shaped")
    cursor = shaped[2].seq
    async with serve_edge(short_bus, any_store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream(
            "GET", f"{edge.url}/v1/runs/{run_id}/stream", headers={"Last-Event-ID": str(cursor)}
        ) as response:
            got, _ = await read_sse(response)
    expected = [msgspec.json.decode(envelope.encode(e)) for e in shaped if e.seq > cursor]
    assert decoded(got) == expected
    assert any("span" in e for e in expected)


async def test_children_link_leaves_child_events_out_but_keeps_the_spawn(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """children=link (loom-mcp stream package): the parent stream keeps child.spawn as the link; flatten (Koder agent stream §7 T5) keeps all."""
    await append(memory_bus, run_id, story(run_id))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        async with http.stream("GET", url + "&children=link") as response:
            linked = decoded((await read_sse(response))[0])
        async with http.stream("GET", url) as response:
            flat = decoded((await read_sse(response))[0])
    assert all("child_id" not in e for e in linked)
    assert "child.spawn" in [e["type"] for e in linked]
    assert sum(1 for e in flat if e.get("child_id")) == 3


@pytest.mark.parametrize(
    ("profile", "kept"),
    [
        ("metrics", {"run.lifecycle", "x.usage", "step.boundary"}),
        ("user", {"run.lifecycle", "x.usage", "step.boundary", "text.delta", "tool.start", "tool.end", "child.spawn"}),
    ],
)
async def test_profiles_select_what_an_audience_sees(
    memory_bus: Bus, store: ReplayLog, run_id: str, profile: str, kept: set[str]
) -> None:
    """loom-mcp stream package profiles: metrics sees usage and workflow; user chat sees no thoughts."""
    await append(memory_bus, run_id, story(run_id))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full&profile={profile}") as response:
            got = decoded((await read_sse(response))[0])
    assert {e["type"] for e in got} == kept
    assert got[-1]["payload"]["state"] == "done"


async def test_a_silent_run_is_ended_as_error_so_every_stream_terminates(
    bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """When the agent dies without a terminal event, the stream ends with state=error."""
    await append(bus, run_id, run_events(run_id, 3, end=None))
    async with serve_edge(bus, store, EdgeSettings(silence_s=0.6)) as edge, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{edge.url}/v1/runs/{run_id}/stream?detail=full") as response:
            got, _ = await asyncio.wait_for(read_sse(response), 8)
    body = decoded(got)
    assert [e["seq"] for e in body[:3]] == [1, 2, 3]
    assert body[-1]["type"] == "run.lifecycle" and body[-1]["payload"]["state"] == "error"
    assert got[-1].id is None, "the synthesized end carries no delivery seq"
