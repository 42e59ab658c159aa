"""Run ``tests/node/chat-client.mjs``: the AI SDK's own chat transports against a running edge."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest

from tests.nodecheck import NODE_DIR


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
    import httpx

    wanted = f"runwire_edge_connections {float(count)}"
    async with httpx.AsyncClient(base_url=edge_url, timeout=10) as http:
        for _ in range(int(within / 0.05)):
            if wanted in (await http.get("/metrics")).text:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the client did not connect within {within} s")
