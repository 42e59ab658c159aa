"""Durable Streams read side on ``/v1/ds/runs/{run_id}``: the protocol's headers and status codes
(Durable Streams protocol §5.5 metadata, §5.6 catch-up, §5.7 long-poll, §8 offsets, §10 caching)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings
from runwire.edge.service.auth import issue_token
from runwire.store.base import ReplayLog

from .harness import append, run_events, serve_edge

SECRET = "s" * 40


def offset(seq: int) -> str:
    return f"{seq:020d}"


async def test_catch_up_returns_a_json_array_with_next_offset_etag_and_closure(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """§5.6: a JSON array, ``Stream-Next-Offset``, ``Stream-Up-To-Date``, ``Stream-Closed`` once the
    terminal event is delivered; ``ETag`` + ``If-None-Match`` → 304; chunks are cacheable (§10.1)."""
    await append(memory_bus, run_id, run_events(run_id, 6))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        first = await http.get(url, params={"detail": "full", "offset": "-1"})
        again = await http.get(url, params={"detail": "full", "offset": "-1"}, headers={"If-None-Match": first.headers["etag"]})
        at_end = await http.get(url, params={"detail": "full", "offset": first.headers["stream-next-offset"]})
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert [e["seq"] for e in first.json()] == [1, 2, 3, 4, 5, 6]
    assert first.headers["stream-next-offset"] == offset(6)
    assert first.headers["stream-up-to-date"] == "true"
    assert first.headers["stream-closed"] == "true"
    assert first.headers["etag"].endswith(':c"')
    assert "max-age=60" in first.headers["cache-control"]
    assert again.status_code == 304
    assert at_end.json() == [] and at_end.headers["stream-closed"] == "true"


async def test_catch_up_is_chunked_and_only_the_last_chunk_is_up_to_date(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    await append(memory_bus, run_id, run_events(run_id, 10, end=None))
    async with serve_edge(memory_bus, store, EdgeSettings(history_batch=4)) as edge:
        async with httpx.AsyncClient(timeout=10) as http:
            url = f"{edge.url}/v1/ds/runs/{run_id}"
            seen: list[int] = []
            cursor, answers = "-1", []
            while True:
                answer = await http.get(url, params={"detail": "full", "offset": cursor})
                answers.append(answer)
                seen += [e["seq"] for e in answer.json()]
                cursor = answer.headers["stream-next-offset"]
                if "stream-up-to-date" in answer.headers:
                    break
    assert seen == list(range(1, 11))
    assert len(answers) == 3
    assert "stream-closed" not in answers[-1].headers
    assert answers[-1].headers["cache-control"] == "no-cache"  # the tail of an open run moves on


async def test_offset_now_head_bad_offsets_and_unknown_runs(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """§8 ``offset=now``: ``[]`` at the tail, not cached; §5.5 ``HEAD``: the tail and closure; a malformed
    offset is 400, a run nobody published 404."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        now = await http.get(url, params={"detail": "full", "offset": "now"})
        head = await http.head(url, params={"detail": "full"})
        bad = await http.get(url, params={"detail": "full", "offset": "7"})
        missing = await http.get(f"{edge.url}/v1/ds/runs/nobody", params={"detail": "full", "offset": "-1"})
    assert now.json() == [] and now.headers["stream-next-offset"] == offset(3)
    assert now.headers["cache-control"] == "no-store"
    assert head.status_code == 200
    assert head.headers["stream-next-offset"] == offset(3)
    assert "stream-closed" not in head.headers
    assert head.headers["cache-control"] == "no-store"
    assert bad.status_code == 400
    assert missing.status_code == 404


async def test_long_poll_waits_then_204_with_a_cursor_and_answers_a_closed_tail_at_once(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """§5.7: no news within the timeout → 204 + ``Stream-Cursor`` + ``Stream-Up-To-Date``; at the tail of
    a closed run → 204 + ``Stream-Closed`` without waiting."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    closed_run = run_id + "-done"
    await append(memory_bus, closed_run, run_events(closed_run, 3))
    async with serve_edge(memory_bus, store, EdgeSettings(long_poll_s=0.4)) as edge:
        async with httpx.AsyncClient(timeout=10) as http:
            started = time.monotonic()
            waited = await http.get(f"{edge.url}/v1/ds/runs/{run_id}",
                                    params={"detail": "full", "offset": offset(3), "live": "long-poll"})
            took = time.monotonic() - started
            started = time.monotonic()
            done = await http.get(f"{edge.url}/v1/ds/runs/{closed_run}",
                                  params={"detail": "full", "offset": offset(3), "live": "long-poll"})
            at_once = time.monotonic() - started
    assert waited.status_code == 204
    assert took >= 0.35
    assert waited.headers["stream-cursor"].isdigit()
    assert waited.headers["stream-up-to-date"] == "true"
    assert waited.headers["stream-next-offset"] == offset(3)
    assert done.status_code == 204 and done.headers["stream-closed"] == "true"
    assert at_once < 0.3


async def test_an_offset_the_replay_window_no_longer_has_is_410_gone(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """The hot tier starts at seq 5 and the replay log has nothing: reading from the start is 410 in
    catch-up and SSE alike, never a partial answer."""
    await append(memory_bus, run_id, run_events(run_id, 4, start=5, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/ds/runs/{run_id}"
        catch_up = await http.get(url, params={"detail": "full", "offset": "-1"})
        sse = await http.get(url, params={"detail": "full", "offset": "-1", "live": "sse"})
        later = await http.get(url, params={"detail": "full", "offset": offset(6)})
    assert catch_up.status_code == 410
    assert catch_up.json()["code"] == "KAI-STREAM-CONN-0002"
    assert sse.status_code == 410
    assert [e["seq"] for e in later.json()] == [7, 8]


async def test_sse_sends_data_then_control_events_and_closes_after_the_terminal_event(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """§5.8: ``event: data`` carries a JSON array, every one is followed by ``event: control`` with
    ``streamNextOffset``; the last has ``streamClosed`` and the connection closes."""
    await append(memory_bus, run_id, run_events(run_id, 4))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{edge.url}/v1/ds/runs/{run_id}",
                                  params={"detail": "full", "offset": offset(1), "live": "sse"})
    blocks = [b for b in response.text.split("\n\n") if b.strip()]
    parsed = [(b.split("\n")[0][7:], json.loads("".join(line[6:] for line in b.split("\n")[1:]))) for b in blocks]
    kinds = [kind for kind, _ in parsed]
    assert kinds[-2:] == ["data", "control"]
    data = [item for kind, body in parsed if kind == "data" for item in body]
    assert [e["seq"] for e in data] == [2, 3, 4]
    last = parsed[-1][1]
    assert last == {"streamNextOffset": offset(4), "streamClosed": True, "upToDate": True}


async def test_same_auth_and_tenancy_as_every_stream(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    await append(memory_bus, run_id, run_events(run_id, 3, tenant="acme"))
    mine = issue_token(SECRET, tenant="acme", scopes=["read"])
    theirs = issue_token(SECRET, tenant="other", scopes=["read"])
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        async with httpx.AsyncClient(timeout=10) as http:
            url = f"{edge.url}/v1/ds/runs/{run_id}"
            anonymous = await http.get(url)
            other = await http.get(url, headers={"Authorization": f"Bearer {theirs}"})
            ok = await http.get(url, params={"detail": "full"}, headers={"Authorization": f"Bearer {mine}"})
    assert anonymous.status_code == 401
    assert other.status_code == 404
    assert ok.status_code == 200 and len(ok.json()) == 3
    assert ok.headers["cache-control"].startswith("private")


async def test_sse_connections_end_after_their_age_so_a_cdn_can_collapse_readers(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """§10.2: an SSE response on a run that goes on ends after ``durable_sse_s`` with a control event that
    is not ``streamClosed``; the client reconnects at its ``streamNextOffset``."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    settings = EdgeSettings(durable_sse_s=0.3, keepalive_s=0.1)
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(timeout=10) as http:
        started = time.monotonic()
        response = await http.get(f"{edge.url}/v1/ds/runs/{run_id}",
                                  params={"detail": "full", "offset": "-1", "live": "sse"})
        took = time.monotonic() - started
    controls = [json.loads(b.split("\n")[1][6:]) for b in response.text.split("\n\n") if b.startswith("event: control")]
    assert took < 3
    assert controls[-1]["streamNextOffset"] == offset(3)
    assert "streamClosed" not in controls[-1]


@pytest.mark.parametrize("format_name", ["agui", "ai-sdk"])
@pytest.mark.parametrize("live", [None, "long-poll", "sse"])
async def test_a_stateful_format_resumed_where_its_start_is_gone_is_410_on_every_read(
    memory_bus: Bus, store: ReplayLog, run_id: str, format_name: str, live: str | None
) -> None:
    """AG-UI and the AI SDK resume mid-run by replaying the run from its start into their encoder;
    when the start is kept nowhere, every read mode answers 410 with the code (never a 500)."""
    await append(memory_bus, run_id, run_events(run_id, 4, start=5, end=None))
    params = {"detail": "full", "offset": offset(6), "format": format_name, **({"live": live} if live else {})}
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{edge.url}/v1/ds/runs/{run_id}", params=params)
    assert response.status_code == 410
    assert response.json()["code"] == "KAI-STREAM-CONN-0002"


@pytest.mark.parametrize(("name", "value"), [("offset", "0000000000000000000²"), ("offset", "٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠١"),
                                            ("cursor", "¹²³")])
async def test_offsets_and_cursors_are_ascii_digits_only(
    memory_bus: Bus, store: ReplayLog, run_id: str, name: str, value: str
) -> None:
    """Superscript and other non-ASCII digits are not an offset (400), and a cursor of them is just not
    the client's cursor — never a 500."""
    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{edge.url}/v1/ds/runs/{run_id}", params={"detail": "full", name: value})
    assert response.status_code == (400 if name == "offset" else 200)
