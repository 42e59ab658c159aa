"""The live page in a real browser (headless Debian Chromium driven by playwright-core)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.edge import EdgeSettings
from runwire.store import open_store
from runwire.store.base import ReplayLog
from tests.edge.harness import EdgeServer, append
from tests.events import event

HERE = Path(__file__).parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _require_tools() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: apt-get install nodejs npm (scripts/bootstrap does it)", pytrace=False)
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (scripts/bootstrap does it)", pytrace=False)
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        pytest.fail(f"run `npm ci` in {HERE} (scripts/bootstrap does it)", pytrace=False)
    return node


class Page:
    """The page in Chromium, driven over the watch-page.mjs line protocol."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        return raw.decode().strip()

    async def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line()


@pytest.fixture
async def shared(tmp_path: Path) -> AsyncIterator[tuple[Bus, ReplayLog]]:
    async with open_bus("memory://") as bus, open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        yield bus, store


@pytest.mark.slow
async def test_the_page_shows_live_events_and_recovers_after_the_edge_restarts(
    shared: tuple[Bus, ReplayLog],
) -> None:
    """Events published after load appear; after an edge restart, EventSource reconnects with
    Last-Event-ID and the page continues exactly where it was (no lost or repeated text)."""
    node = _require_tools()
    bus, store = shared
    run_id = "page-run"
    await append(bus, run_id, [event(run_id, 1, "run.lifecycle", {"state": "running"})])
    edge = EdgeServer(bus, store, EdgeSettings())
    await edge.start()
    proc = await asyncio.create_subprocess_exec(
        node, str(HERE / "watch-page.mjs"), f"{edge.url}/runs/{run_id}?detail=full",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=HERE,
        env={**os.environ, "CHROMIUM": CHROMIUM},
    )
    page = Page(proc)
    try:
        assert await page.line() == "loaded"
        await append(bus, run_id, [
            event(run_id, 2, "reasoning.delta", {"text": "pondering"}),
            event(run_id, 3, "text.delta", {"text": "Hello after load. "}),
            event(run_id, 4, "tool.start", {"call_id": "c1", "tool": "web_search", "input": {"q": "runwire"}}),
            event(run_id, 5, "tool.end", {"call_id": "c1", "ok": False, "error": "rate limited", "duration_ms": 42}),
        ])
        assert await page.ask("expect Hello after load.") == "seen Hello after load."
        assert await page.ask("expect failed 42 ms") == "seen failed 42 ms"
        await edge.stop()
        await append(bus, run_id, [event(run_id, 6, "text.delta", {"text": "Written while the edge was down. "})])
        await edge.start()
        await append(bus, run_id, [
            event(run_id, 7, "child.spawn", {"child_id": "kid-1", "prompt": "sub"}),
            event(run_id, 8, "text.delta", {"text": "from the child"}, child_id="kid-1"),
            event(run_id, 9, "run.lifecycle", {"state": "done"}),
        ])
        assert await page.ask("expect Written while the edge was down.") == "seen Written while the edge was down."
        assert await page.ask("state done") == "state done"
        assert await page.ask("expect kid-1") == "seen kid-1"
        assert await page.ask("pending") == "pending 0"  # the page closed its stream at the end
        dump = await page.ask("dump")
        text = json.loads(dump.removeprefix("dump "))
        assert text.count("Hello after load.") == 1
        assert text.count("Written while the edge was down.") == 1
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 20)
        await edge.stop()
