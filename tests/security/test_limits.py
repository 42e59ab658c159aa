"""Bounded everything: bodies, request heads, list parameters and cursors, each refusal coded.

docs/security.md § Limits lists each bound and its default; § Refusals what
each refusal looks like on each transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings, create_app, issue_token
from runwire.edge.http.server import edge_config
from runwire.store.base import ReplayLog
from tests.edge.harness import (
    append,
    free_port,
    run_events,
    serve_edge,
    start_uvicorn,
    stop_uvicorn,
)
from tests.events import event

from .conftest import SECRET, new_id


def bearer(tenant: str, *scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(SECRET, tenant=tenant, scopes=scopes)}"}


async def test_control_bodies_are_bounded_and_checked(memory_bus: Bus, store: ReplayLog) -> None:
    """A control body over 64 KiB is refused with 413 (declared or streamed, nothing kept); a
    depth bomb, malformed JSON and an unknown command get 400 with a code, never a 500."""
    run = new_id()
    await append(memory_bus, run, run_events(run, 2, end=None))
    huge = json.dumps({"command": "redirect", "args": {"prompt": "x" * 200_000}}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(huge), 8192):
            yield huge[start:start + 8192]

    deep = b'{"command":"answer","args":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        url = f"/v1/runs/{run}/control"
        declared = await http.post(url, content=huge)
        streamed = await http.post(url, content=chunks())
        bomb = await http.post(url, content=deep)
        nested = await http.post(url, json={"command": "answer", "args": {"a": json.loads("[" * 70 + "]" * 70)}})
        broken = await http.post(url, content=b'{"command": ')
        unknown = await http.post(url, json={"command": "explode"})
        fine = await http.post(url, json={"command": "pause"})
    assert (declared.status_code, declared.json()["code"]) == (413, "KAI-STREAM-REQ-0002")
    assert (streamed.status_code, streamed.json()["code"]) == (413, "KAI-STREAM-REQ-0002")
    assert (bomb.status_code, bomb.json()["code"]) == (400, "KAI-STREAM-REQ-0003")
    assert (nested.status_code, nested.json()["code"]) == (400, "KAI-STREAM-REQ-0003")
    assert (broken.status_code, broken.json()["code"]) == (400, "KAI-STREAM-REQ-0003")
    assert (unknown.status_code, unknown.json()["code"]) == (400, "KAI-STREAM-REQ-0001")
    assert fine.status_code == 202


async def test_control_is_refused_for_finished_and_unknown_runs(memory_bus: Bus, store: ReplayLog) -> None:
    """A finished run (in the replay log or only in the hot tier) answers 409 KAI-STREAM-RUN-0002; a run
    nobody has seen answers 404 KAI-STREAM-RUN-0001; nothing reaches either's control channel."""
    logged, hot, live = new_id("logged"), new_id("hot"), new_id("live")
    await store.append(run_events(logged, 3, end="done"))
    await append(memory_bus, hot, run_events(hot, 3, end="aborted"))
    await append(memory_bus, live, run_events(live, 3, end=None))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        answers = {run: await http.post(f"/v1/runs/{run}/control", json={"command": "cancel"})
                   for run in (logged, hot, live, new_id("never"))}
    codes = [(a.status_code, a.json().get("code")) for a in answers.values()]
    assert codes == [(409, "KAI-STREAM-RUN-0002"), (409, "KAI-STREAM-RUN-0002"), (202, None),
                     (404, "KAI-STREAM-RUN-0001")]


async def test_an_ingest_body_of_only_bad_lines_gets_a_code_per_line(memory_bus: Bus, store: ReplayLog) -> None:
    """No line fits any format: each line is reported with its code (not one "cannot detect the input
    format"), and a depth bomb line is one of them."""
    run = new_id()
    body = b"garbage\n{not json\n" + b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}\n"
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        response = await http.post(f"/v1/runs/{run}/events", content=body)
        unknown = await http.post(f"/v1/runs/{run}/events?format=nope", content=body)
    assert response.status_code == 422, response.text
    assert [(r["line"], r["code"]) for r in response.json()["rejected"]] == [
        (1, "KAI-STREAM-PROTO-0001"), (2, "KAI-STREAM-PROTO-0001"), (3, "KAI-STREAM-PROTO-0001")]
    assert (unknown.status_code, unknown.json()["code"]) == (400, "KAI-STREAM-REQ-0001")


@pytest.mark.parametrize("limit", ["-1", "0", "abc", "1001", "5_0", " 5", "+5", "05", "1e3", ""])
async def test_bad_list_parameters_are_refused(memory_bus: Bus, store: ReplayLog, limit: str) -> None:
    """``/v1/runs?limit=`` takes 1…1000 written canonically; anything else (``-1`` returned every run)
    is 400 KAI-STREAM-REQ-0001, as is a time that is not RFC 3339."""
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        bad = await http.get("/v1/runs", params={"limit": limit})
        since = await http.get("/v1/runs", params={"since": "yesterday"})
        good = await http.get("/v1/runs", params={"limit": "1000", "since": "2026-01-01T00:00:00Z"})
    assert (bad.status_code, bad.json()["code"]) == (400, "KAI-STREAM-REQ-0001")
    assert (since.status_code, since.json()["code"]) == (400, "KAI-STREAM-REQ-0001")
    assert good.status_code == 200


@pytest.mark.parametrize("cursor", ["5_0", " 5", "+5", "05", "-1", "1e3", "5.0", str(2**63), "٥"])
async def test_cursors_must_be_canonical(memory_bus: Bus, store: ReplayLog, cursor: str) -> None:
    """A resume cursor is a seq written as ``str(seq)`` (or ``live``): one spelling per position, so
    ``5_0``, `` 5``, ``+5``, ``05`` … are refused with 400 KAI-STREAM-REQ-0001 in the header and the query."""
    run = new_id()
    await append(memory_bus, run, run_events(run, 6))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        query = await http.get(f"/v1/runs/{run}/stream", params={"after": cursor, "detail": "full"})
        header = await http.get(f"/v1/runs/{run}/stream?detail=full", headers={"Last-Event-ID": cursor.strip().encode()})
        async with http.stream("GET", f"/v1/runs/{run}/stream?detail=full&after=5") as good:
            assert good.status_code == 200
    assert (query.status_code, query.json()["code"]) == (400, "KAI-STREAM-REQ-0001")
    if cursor.strip() == cursor:  # header values lose surrounding spaces on the way
        assert (header.status_code, header.json()["code"]) == (400, "KAI-STREAM-REQ-0001")


@contextlib.asynccontextmanager
async def deadline_edge(bus: Bus, store: ReplayLog, seconds: float) -> AsyncIterator[int]:
    port = free_port()
    config = edge_config(create_app(bus, store, EdgeSettings()), host="127.0.0.1", port=port,
                         log_level="warning", lifespan="on", header_timeout_s=seconds,
                         ws_ping_interval=None, timeout_graceful_shutdown=0.5)
    server, task = await start_uvicorn(config)
    try:
        yield port
    finally:
        await stop_uvicorn(server, task)


async def _closed_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bytes) -> float:
    """Send ``trickle`` one byte every 0.2 s until the server closes; the seconds it took."""
    started = time.monotonic()
    for byte in trickle:
        if reader.at_eof():
            break
        with contextlib.suppress(ConnectionError):
            writer.write(bytes([byte]))
            await writer.drain()
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(reader.read(1024), 0.2) == b"":
                break
    writer.close()
    return time.monotonic() - started


async def test_a_slow_request_head_is_cut_off_but_streams_are_not(memory_bus: Bus, store: ReplayLog) -> None:
    """Slowloris: a connection that sends nothing, or its headers a byte at a time, is closed at the
    header deadline (1 s here, 10 s by default); a stream that outlives the deadline keeps going."""
    run = new_id()
    await append(memory_bus, run, run_events(run, 3, end=None))
    async with deadline_edge(memory_bus, store, 1.0) as port:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        slow = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
        idle, slowloris = await asyncio.gather(
            _closed_after(idle_reader, idle_writer, b""),
            _closed_after(slow_reader, slow_writer, slow),
        )
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""
        async with httpx.AsyncClient(timeout=10) as http:
            async with http.stream("GET", f"http://127.0.0.1:{port}/v1/runs/{run}/stream?detail=full") as stream:
                await asyncio.sleep(1.6)
                await append(memory_bus, run, [event(run, 4, "run.lifecycle", {"state": "done"})])
                body = (await stream.aread()).decode()
    assert slowloris < 5, slowloris
    assert '"state":"done"' in body.replace(" ", "")
    assert idle < 5


async def test_refusals_have_the_right_status_and_code_on_each_transport(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """HTTP: 401 AUTH-0001 without a valid token, 403 AUTH-0002 without the scope, 404 RUN-0001 for a
    run that isn't the caller's. WebSocket: accepted, one error frame with the same code, then closed
    with 4000 + that status and the code in the reason (a pre-handshake 403 hides all of it from scripts)."""
    import websockets

    run = new_id()
    await append(memory_bus, run, run_events(run, 3, tenant="A", end=None))
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
            none = await http.get(f"/v1/runs/{run}/stream")
            scope = await http.post(f"/v1/runs/{run}/control", json={"command": "pause"}, headers=bearer("A", "read"))
            other = await http.get(f"/v1/runs/{run}/stream", headers=bearer("B", "read"))
        assert [(r.status_code, r.json()["code"]) for r in (none, scope, other)] == [
            (401, "KAI-STREAM-AUTH-0001"), (403, "KAI-STREAM-AUTH-0002"), (404, "KAI-STREAM-RUN-0001")]
        assert none.headers["www-authenticate"] == "Bearer"
        ws = edge.url.replace("http", "ws") + f"/v1/runs/{run}/stream"
        cases = [({}, 4401, "KAI-STREAM-AUTH-0001"), (bearer("A", "write"), 4403, "KAI-STREAM-AUTH-0002"),
                 (bearer("B", "read"), 4404, "KAI-STREAM-RUN-0001")]
        for headers, close_code, code in cases:
            async with websockets.connect(ws, additional_headers=headers,
                                          subprotocols=["koder-agent-stream-v1"]) as client:  # type: ignore[list-item]
                frame = json.loads(await client.recv())
                with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                    await client.recv()
            assert (frame["type"], frame["code"]) == ("error", code)
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason.split(":")[0]) == (close_code, code)
        async with websockets.connect(ws + "?after=05", additional_headers=bearer("A", "read")) as client:
            assert json.loads(await client.recv())["code"] == "KAI-STREAM-REQ-0001"
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await client.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


async def test_another_tenants_run_and_no_run_look_the_same(memory_bus: Bus, store: ReplayLog) -> None:
    """No run-existence oracle: for tenant B, tenant A's run and a run that does not exist answer with
    the same status and code on every read and control endpoint, in comparable time (medians within
    30 % of each other; both are held to the same refusal floor)."""
    run = new_id()
    events = run_events(run, 3, tenant="A", end=None)
    await store.append(events)
    await append(memory_bus, run, events)
    b = bearer("B", "read", "control")

    async def probe(http: httpx.AsyncClient, target: str) -> tuple[list[tuple[int, str]], float]:
        answers, took = [], []
        for _ in range(12):
            for method, path in (("GET", "stream"), ("GET", "events.jsonl"), ("POST", "control")):
                started = time.perf_counter()
                response = await http.request(method, f"/v1/runs/{target}/{path}", headers=b,
                                              json={"command": "pause"} if method == "POST" else None)
                took.append(time.perf_counter() - started)
                answers.append((response.status_code, response.json()["code"]))
        took.sort()
        return sorted(set(answers)), took[len(took) // 2]

    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        await probe(http, run)  # warm both paths (connections, caches)
        others, other_median = await probe(http, run)
        nothing, nothing_median = await probe(http, new_id("never"))
    assert others == nothing == [(404, "KAI-STREAM-RUN-0001")]
    assert abs(other_median - nothing_median) < 0.3 * min(other_median, nothing_median), (other_median, nothing_median)


