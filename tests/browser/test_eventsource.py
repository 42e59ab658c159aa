"""A browser's own EventSource at the end of a run (headless Debian Chromium via playwright-core)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from runwire.bus import open_bus
from runwire.edge import EdgeSettings
from runwire.store import open_store
from tests.edge.harness import EdgeServer, append, run_events

from .test_page import CHROMIUM, _require_tools

HERE = Path(__file__).parent


@pytest.mark.slow
async def test_eventsource_reconnect_after_the_end_gets_204_and_no_request_stays_open(tmp_path: Path) -> None:
    """The server closes a finished run's stream; EventSource reconnects with Last-Event-ID = the
    terminal id (HTML standard, server-sent events §9.2.3) and the 204 answer makes it stop: it ends
    CLOSED with every event once, and no stream request is left open."""
    node = _require_tools()
    run_id = "es-run"
    async with open_bus("memory://") as bus, open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        await append(bus, run_id, run_events(run_id, 5))
        edge = EdgeServer(bus, store, EdgeSettings())
        await edge.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                node, str(HERE / "eventsource-end.mjs"), edge.url, f"/v1/runs/{run_id}/stream?detail=full",
                stdout=asyncio.subprocess.PIPE, cwd=HERE, env={**os.environ, "CHROMIUM": CHROMIUM},
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            await edge.stop()
    assert proc.returncode == 0
    result = json.loads(out)
    assert result["ids"] == ["1", "2", "3", "4", "5"]
    assert result["readyState"] == 2
    assert result["statuses"] == [200, 204]
    assert result["pending"] == 0
