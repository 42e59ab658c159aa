"""The Durable Streams clients, unchanged, against the edge: ``@durable-streams/client`` under
node and ``durable-streams`` from PyPI (Durable Streams protocol §5.6–5.8, §5.2.1)."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings
from runwire.store.base import ReplayLog
from tests.nodecheck import NODE_DIR
from tests.waiting import until

from .harness import append, event, run_events, serve_edge


async def node(args: dict[str, Any]) -> dict[str, Any]:
    """Run tests/node/durable-client.mjs with ``args``; its JSON answer."""
    binary = shutil.which("node")
    if binary is None:
        pytest.fail("node is not installed: install Node.js 20 (Debian: apt-get install nodejs npm)", pytrace=False)
    if not (NODE_DIR / "node_modules" / "@durable-streams" / "client").is_dir():
        pytest.fail(f"run `npm ci` in {NODE_DIR} (scripts/bootstrap does it)", pytrace=False)
    proc = await asyncio.create_subprocess_exec(
        binary, str(NODE_DIR / "durable-client.mjs"), json.dumps(args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=NODE_DIR,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"durable-client.mjs failed: {err.decode()[-2000:]}"
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("live", ["sse", "long-poll"])
async def test_ds_client_reads_a_live_run_saves_its_offset_and_resumes_on_a_second_edge(
    bus: Bus, store: ReplayLog, run_id: str, live: str
) -> None:
    """§5.6 catch-up, then §5.7 long-poll / §5.8 SSE live; the saved ``Stream-Next-Offset`` resumes on
    another edge instance (offsets are delivery seqs: shared state only) and ``Stream-Closed`` ends it."""
    await append(bus, run_id, run_events(run_id, 5, end=None))
    settings = EdgeSettings(long_poll_s=2, durable_sse_s=0.4, keepalive_s=0.2)  # SSE reconnects midway too
    async with serve_edge(bus, store, settings) as first, serve_edge(bus, store, settings) as second:
        path = f"/v1/ds/runs/{run_id}?detail=full"
        head = await node({"mode": "read", "url": first.url + path, "live": live, "count": 5})
        assert [item["seq"] for item in head["items"]] == [1, 2, 3, 4, 5]
        assert head["closed"] is False
        rest_task = asyncio.create_task(
            node({"mode": "read", "url": second.url + path, "live": live, "offset": head["offset"]})
        )
        await until(lambda: second.live_clients(run_id) == 1, what="the client waiting on the second edge")
        await append(bus, run_id, [event(run_id, 6), event(run_id, 7)])
        await append(bus, run_id, [event(run_id, 8, "run.lifecycle", {"state": "done"})])
        rest = await rest_task
    assert [item["seq"] for item in rest["items"]] == [6, 7, 8], rest
    assert rest["closed"] is True
    assert rest["offset"] > head["offset"]  # lexicographically ordered


async def test_ds_client_catch_up_only_reads_a_finished_run_in_another_format(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """``live: false`` stops at the first up-to-date answer; ``format=`` applies (AG-UI events here)."""
    await append(memory_bus, run_id, run_events(run_id, 4))
    async with serve_edge(memory_bus, store) as edge:
        answer = await node({
            "mode": "read", "url": f"{edge.url}/v1/ds/runs/{run_id}?detail=full&format=agui", "live": False,
        })
    types = [item["type"] for item in answer["items"]]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert answer["closed"] is True


async def test_python_durable_streams_client_reads_a_run_live_and_catches_up_a_finished_one(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """PyPI ``durable-streams``'s ``astream``: SSE (§5.8) follows the run to its end; ``live=False``
    (§5.6 catch-up) reads the finished run and stops."""
    from durable_streams import astream

    await append(memory_bus, run_id, run_events(run_id, 3, end=None))
    url = f"/v1/ds/runs/{run_id}"
    async with serve_edge(memory_bus, store) as edge:
        async def finish_later() -> None:
            await until(lambda: edge.live_clients(run_id) == 1, what="the client reading live")
            await append(memory_bus, run_id, [event(run_id, 4), event(run_id, 5, "run.lifecycle", {"state": "done"})])

        producer = asyncio.create_task(finish_later())
        live: list[dict[str, Any]] = []
        async with astream(edge.url + url, params={"detail": "full"}, live="sse", timeout=10) as response:
            async for item in response.iter_json():
                live.append(item)
        await producer
        async with astream(edge.url + url, params={"detail": "full"}, live=False, timeout=10) as response:
            caught_up = [item async for item in response.iter_json()]
    assert [item["seq"] for item in live] == [1, 2, 3, 4, 5]
    assert caught_up == live
