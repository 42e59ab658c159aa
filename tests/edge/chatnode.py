"""Run ``tests/node/chat-client.mjs``: the AI SDK's own chat transports against a running edge."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.store.base import ReplayLog
from tests.nodecheck import NODE_DIR
from tests.waiting import until

from .harness import event, publish, run_events, serve_edge


async def start_chat_client(**options: Any) -> asyncio.subprocess.Process:
    """Start the node client (see the script's header for ``options``)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node.js 20 (Debian: apt-get install nodejs npm)", pytrace=False)
    if not (NODE_DIR / "node_modules" / "ws").is_dir():
        pytest.fail(f"run `npm ci` in {NODE_DIR} (scripts/bootstrap does it)", pytrace=False)
    return await asyncio.create_subprocess_exec(
        node, str(NODE_DIR / "chat-client.mjs"), json.dumps(options),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=NODE_DIR,
    )


async def chat_result(proc: asyncio.subprocess.Process, within: float = 60) -> dict[str, Any]:
    """The client's one JSON line: ``{"result": …}`` or ``{"error": …}``."""
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode == 0, f"chat-client.mjs failed: {err.decode()}"
    summary: dict[str, Any] = json.loads(out)
    return summary


async def run_chat_client(**options: Any) -> dict[str, Any]:
    return await chat_result(await start_chat_client(**options))


async def wait_for_streams(edge_url: str, count: int = 1, within: float = 30) -> None:
    """Wait until the edge serves ``count`` stream connections (the client is reading)."""
    wanted = f"runwire_edge_connections {float(count)}"
    async with httpx.AsyncClient(base_url=edge_url, timeout=10) as http:

        async def serving() -> bool:
            return wanted in (await http.get("/metrics")).text

        await until(serving, within=within, what=f"{count} client(s) connected")


async def resume_mid_run(
    bus: Bus, store: ReplayLog, run_id: str, chat_id: str, mode: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``ai``'s chat transport (``mode``) resuming ``chat_id`` mid-run: the run's head is
    written, the client connects, the tail (`` tail``, then done) comes live. Returns the
    resumed result and what a second resume, after the end, got."""
    await publish(bus, store, run_events(run_id, 4, end=None, thread_id=chat_id))
    async with serve_edge(bus, store) as edge:
        client = await start_chat_client(edge=edge.url, chatId=chat_id, mode=mode)
        await wait_for_streams(edge.url)
        await publish(bus, store, [event(run_id, 5, "text.delta", {"text": " tail"}),
                                   event(run_id, 6, "run.lifecycle", {"state": "done"})])
        resumed = await chat_result(client)
        after_end = await run_chat_client(edge=edge.url, chatId=chat_id, mode=mode)
    assert "error" not in resumed, resumed
    result: dict[str, Any] = resumed["result"]
    return result, after_end
