"""The live page in headless Chromium: screenshots, and how long a long run takes to render.

Run: ``.venv/bin/python bench/page.py [--events 10000] [--json]`` (benchmark) or
``.venv/bin/python bench/page.py --screenshots docs/img`` (the pictures in
``docs/edge.md`` § The page).

One process holds the whole pipeline: an in-process bus (``memory://``), a
worker (``run_worker``), a SQLite replay log, the edge on uvicorn and the
publisher SDK; Chromium is Debian's, driven by ``tests/browser/drive.mjs``.

Benchmark: a run of ``--events`` events (a root and 8 sub-runs, mostly text
deltas, a tool call every 25 events; ``tests/browser/agents.big_run``) is
published and logged, then the page is opened on it, raw view
(``?detail=full``: every event reaches the page) and shaped view. Figures per
view: ``load_to_rendered_ms`` (navigation start to the frame that rendered
the last event), ``longest_task_ms`` (the longest main-thread task Chromium
reported, the freeze a user would feel), ``long_tasks`` (tasks over 50 ms),
``renders`` (frames drawn), ``events`` (events the page received).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from runwire.bus import open_bus  # noqa: E402
from runwire.bus.base import Bus  # noqa: E402
from runwire.edge import EdgeSettings  # noqa: E402
from runwire.sdk.publisher import Publisher  # noqa: E402
from runwire.store import open_store  # noqa: E402
from runwire.store.base import ReplayLog  # noqa: E402
from runwire.workers.runtime import run_worker  # noqa: E402
from tests.browser.agents import Agent, big_run, publish_big  # noqa: E402
from tests.browser.browser import Browser, browser  # noqa: E402
from tests.e2e_harness import wait_for_terminal  # noqa: E402
from tests.edge.harness import EdgeServer  # noqa: E402


class Local:
    """Bus, replay log, worker, edge and publisher in this process."""

    def __init__(self, bus: Bus, store: ReplayLog, edge: EdgeServer, publisher: Publisher) -> None:
        self.bus = bus
        self.store = store
        self.edge = edge
        self.publisher = publisher

    async def logged(self, run_id: str, within: float = 60.0) -> None:
        await wait_for_terminal(self.store, run_id, within)


@contextlib.asynccontextmanager
async def local(settings: EdgeSettings | None = None) -> AsyncIterator[Local]:
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            open_bus("memory://") as bus,
            open_store(f"sqlite:///{tmp}/replay.db") as store,
            Publisher(bus, linger_ms=1.0) as publisher,
        ):
            stop = asyncio.Event()
            worker = asyncio.create_task(run_worker(bus, store, group="page", name="w1", stop=stop))
            edge = EdgeServer(bus, store, settings or EdgeSettings())
            await edge.start()
            try:
                yield Local(bus, store, edge, publisher)
            finally:
                await edge.stop()
                stop.set()
                await asyncio.wait_for(worker, 20)


RENDERED = "window.runView && runView.stats.ended && runView.stats.renderedSeq === runView.model.lastSeq"


async def measure(page: Browser, url: str) -> dict[str, Any]:
    await page.goto(url)
    await page.wait(RENDERED, timeout_s=120)
    figures: dict[str, Any] = await page.eval(
        "{load_to_rendered_ms: Math.round(runView.stats.lastRenderAt),"
        " longest_task_ms: Math.round(Math.max(0, ...window.__longTasks)),"
        " long_tasks: window.__longTasks.length, renders: runView.stats.renders,"
        " longest_render_ms: Math.round(runView.stats.longestRenderMs),"
        " handling_ms: Math.round(runView.stats.handlingMs),"
        " events: runView.stats.events, batches: runView.stats.batches,"
        " largest_batch: runView.stats.largestBatch}"
    )
    return figures


async def bench(events: int) -> dict[str, Any]:
    async with local() as pipe, browser() as page:
        rows = big_run("long-run", events)
        started = time.monotonic()
        await publish_big(pipe.publisher, rows)
        await pipe.logged("long-run", within=300)
        out: dict[str, Any] = {"events": len(rows), "publish_and_log_s": round(time.monotonic() - started, 1)}
        for view, query in (("raw", "?detail=full"), ("shaped", "")):
            out[view] = await measure(page, f"{pipe.edge.url}/runs/long-run{query}")
        return out


async def screenshots(out: Path) -> list[Path]:
    made: list[Path] = []
    async with local() as pipe, browser() as page:
        # finished runs for the list: two done, one stopped
        for n, thread in ((1, "chat-7f3a"), (2, "chat-7f3a"), (3, "chat-91bc")):
            await Agent(pipe.publisher, f"research-{n:03d}", tenant="acme", thread=thread).run()
        never = asyncio.Event()
        stopped = asyncio.create_task(
            Agent(pipe.publisher, "research-005", hold=never, obey=True, tenant="globex", thread="chat-c2d4").run()
        )
        async with asyncio.timeout(30), httpx.AsyncClient() as http:
            while True:  # the run must be known before it can be controlled
                if await pipe.store.run("research-005.deploys") is not None:
                    break
                await asyncio.sleep(0.05)
            sent = await http.post(f"{pipe.edge.url}/v1/runs/research-005/control",
                                   json={"command": "cancel", "args": {"reason": "stopped by its user"}})
            assert sent.status_code == 202, sent.text
        await stopped
        hold = asyncio.Event()
        live = asyncio.create_task(
            Agent(pipe.publisher, "research-004", pace=1.0, hold=hold, tenant="acme", thread="chat-91bc").run()
        )
        await page.viewport(1400, 860)
        await page.goto(f"{pipe.edge.url}/runs/research-004")
        await page.wait("document.querySelectorAll('#tree [role=treeitem]').length >= 4", timeout_s=60)
        await page.wait("document.querySelectorAll('.lane-tool:not(.open)').length >= 4", timeout_s=60)
        await page.eval("new Promise((r) => setTimeout(r, 600))")  # let the open bars grow a little
        made.append(out / "page-run-live.png")
        await page.screenshot(made[-1])
        await page.goto(f"{pipe.edge.url}/")
        await page.wait("document.querySelectorAll('#runs tr[data-run]').length >= 20")
        made.append(out / "page-list.png")
        await page.screenshot(made[-1])
        hold.set()
        await live
        await pipe.logged("research-004")
        await page.goto(f"{pipe.edge.url}/runs/research-004")
        await page.wait("runView.stats.ended && runView.stats.renderedSeq === runView.model.lastSeq")
        await page.eval("document.querySelector('details.tool.failed').open = true")
        made.append(out / "page-run-finished.png")
        await page.screenshot(made[-1], full=True)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--screenshots", type=Path, help="write the page's screenshots into this directory")
    args = parser.parse_args()
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
        for path in asyncio.run(screenshots(args.screenshots)):
            print(path)
        return
    figures = asyncio.run(bench(args.events))
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
