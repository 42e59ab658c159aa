"""Agent runs for the page's tests, screenshots and benchmark, published through the SDK.

``research`` is a run of three levels: the root plans, calls two tools (the
second fails), spawns two sub-runs, one of which spawns a sub-run of its own;
every run reports usage and ends ``done``. Tool calls report ``duration_ms``
(what the timeline's bars show) and, with ``pace`` > 0, take that long too.
With ``hold`` the root waits for it before its last words, so a test can look
at the page while the run is live. ``obey`` makes every run end ``aborted``
when a ``cancel`` reaches its control channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from runwire.sdk.publisher import Publisher, Run

TOOLS = {  # run suffix → [(tool, duration_ms, ok)]
    "": [("search_metrics", 420, True), ("fetch_dashboard", 160, False)],
    ".logs": [("shell", 900, True)],
    ".logs.grep": [("grep", 260, True)],
    ".deploys": [("list_deploys", 90, True)],
}
USAGE = {"": (2400, 610), ".logs": (800, 190), ".logs.grep": (300, 75), ".deploys": (650, 120)}
PROMPTS = {".logs": "collect logs for checkout", ".logs.grep": "find timeouts in the logs",
           ".deploys": "check recent deploys"}


@dataclass
class Expected:
    """What the page should show of a research run."""

    root: str
    runs: dict[str, str] = field(default_factory=dict)  # run id → parent id ("" for the root)
    tools: list[tuple[str, str, int, bool]] = field(default_factory=list)  # (run, tool, duration_ms, ok)
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)

    def tree_usage(self) -> tuple[int, int]:
        return sum(u[0] for u in self.usage.values()), sum(u[1] for u in self.usage.values())


def expected(root: str) -> Expected:
    out = Expected(root)
    for suffix in TOOLS:
        run = root + suffix
        out.runs[run] = "" if not suffix else root + suffix.rsplit(".", 1)[0]
        out.tools += [(run, name, ms, ok) for name, ms, ok in TOOLS[suffix]]
        out.usage[run] = USAGE[suffix]
    return out


class Cancelled(Exception):
    """A run's control channel said cancel."""


class Agent:
    """Publishes a research run; see the module docs."""

    def __init__(self, publisher: Publisher, root: str, *, pace: float = 0.0, hold: asyncio.Event | None = None,
                 obey: bool = False, tenant: str | None = None, thread: str | None = None) -> None:
        self.publisher = publisher
        self.root = root
        self.pace = pace
        self.hold = hold
        self.obey = obey
        self.tenant = tenant
        self.thread = thread
        self.cancelled: dict[str, asyncio.Event] = {}

    async def pause(self, seconds: float) -> None:
        if self.pace:
            await asyncio.sleep(seconds * self.pace)

    async def words(self, run: Run, kind: str, text: str) -> None:
        for i, word in enumerate(text.split()):
            await run.emit(kind, {"text": word if i == 0 else " " + word})
            await self.pause(0.03)

    async def tools(self, run: Run, suffix: str) -> None:
        for n, (name, ms, ok) in enumerate(TOOLS[suffix]):
            call = f"call-{name}-{n}"
            await run.emit("tool.start", {"call_id": call, "tool": name, "input": {"query": f"{name} for {run.run_id}"}})
            await self.pause(ms / 1000)
            end: dict[str, Any] = {"call_id": call, "ok": ok, "duration_ms": ms}
            if ok:
                end["output"] = {"rows": 12 + n, "summary": f"{name} found what it looked for"}
            else:
                end["error"] = {"code": "HTTP_503", "message": f"{name}: upstream unavailable"}
            await run.emit("tool.end", end)

    async def usage(self, run: Run, suffix: str) -> None:
        inp, out = USAGE[suffix]
        await run.emit("x.usage", {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out,
                                   "model": "demo-model-1"})

    @contextlib.asynccontextmanager
    async def listening(self, run: Run) -> AsyncIterator[asyncio.Event]:
        """An event set when a cancel reaches ``run``'s control channel (only with ``obey``)."""
        flag = asyncio.Event()
        self.cancelled[run.run_id] = flag
        if not self.obey:
            yield flag
            return

        async def watch() -> None:
            async for command in run.controls(after="0"):
                if command.command == "cancel":
                    flag.set()
                    return

        task = asyncio.create_task(watch())
        try:
            yield flag
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def until(self, flag: asyncio.Event, other: asyncio.Event | None) -> None:
        """Wait for ``other`` (if any) unless ``flag`` (a cancel) comes first; raise Cancelled on a cancel."""
        if other is not None and not flag.is_set():
            waits = [asyncio.create_task(flag.wait()), asyncio.create_task(other.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        if flag.is_set():
            raise Cancelled

    async def sub(self, parent: Run, suffix: str, gate: asyncio.Event | None) -> None:
        run = self.publisher.run(self.root + suffix, parent=parent)
        async with self.listening(run) as cancel:
            try:
                await run.emit("run.lifecycle", {"state": "running"})
                await self.words(run, "reasoning.delta", f"I need to {PROMPTS[suffix]}.")
                await self.tools(run, suffix)
                if suffix == ".logs":
                    await run.emit("child.spawn", {"child_id": run.run_id + ".grep", "prompt": PROMPTS[".logs.grep"]})
                    await self.sub(run, ".logs.grep", gate)
                await self.until(cancel, gate)
                await self.words(run, "text.delta", f"Done: {PROMPTS[suffix]}, nothing unusual.")
                await self.usage(run, suffix)
                await run.finish("done")
            except Cancelled:
                await run.finish("aborted", "cancelled from the page")

    async def run(self) -> str:
        """Publish the whole run; returns the root's terminal state."""
        root = self.publisher.run(self.root, tenant=self.tenant, thread=self.thread)
        async with self.listening(root) as cancel:
            try:
                await root.emit("run.lifecycle", {"state": "planning"})
                await self.words(root, "reasoning.delta", "Looking into the latency of our checkout API first.")
                await root.emit("plan.proposal", {"plan": {
                    "id": f"plan-{self.root}", "est_total_cost_usd": 0.04, "steps": [
                        {"id": "s1", "title": "Measure p99 latency", "intent": "research",
                         "est_tools": ["search_metrics", "fetch_dashboard"]},
                        {"id": "s2", "title": "Ask sub-agents to inspect logs and deploys", "intent": "execute"},
                        {"id": "s3", "title": "Write up the findings", "intent": "report"},
                    ]}})
                await root.emit("run.lifecycle", {"state": "running"})
                await root.emit("step.boundary", {"step_index": 0, "step_kind": "plan"})
                await self.tools(root, "")
                await root.emit("step.boundary", {"step_index": 1, "step_kind": "fan-out"})
                children = []
                for suffix in (".logs", ".deploys"):
                    await root.emit("child.spawn", {"child_id": self.root + suffix, "prompt": PROMPTS[suffix]})
                    children.append(self.sub(root, suffix, self.hold))
                gathered = asyncio.gather(*children)
                stop = asyncio.create_task(cancel.wait())
                try:
                    await asyncio.wait([gathered, stop], return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    gathered.cancel()
                    raise
                finally:
                    stop.cancel()
                if cancel.is_set():
                    for flag in self.cancelled.values():
                        flag.set()  # a stopped run stops its sub-runs
                    await gathered
                    raise Cancelled
                await root.emit("step.boundary", {"step_index": 2, "step_kind": "fan-in"})
                await self.words(root, "text.delta", "Summary: the checkout API waits on a slow downstream call; "
                                                     "batching and a short cache bring p99 back under 300 ms.")
                await self.usage(root, "")
                await root.emit("step.boundary", {"step_index": 3, "step_kind": "done"})
                await root.finish("done")
                return "done"
            except Cancelled:
                await root.finish("aborted", "cancelled from the page")
                return "aborted"


def big_run(root: str, total: int = 10_000, children: int = 8) -> list[tuple[str, str | None, str, dict[str, Any]]]:
    """A long run as (run id, parent id, type, payload) rows: ``total`` events over a root and
    ``children`` sub-runs, mostly text deltas with a tool call every 25 events."""
    runs = [root] + [f"{root}.w{i}" for i in range(children)]
    rows: list[tuple[str, str | None, str, dict[str, Any]]] = [(root, None, "run.lifecycle", {"state": "running"})]
    for i, child in enumerate(runs[1:]):
        rows.append((root, None, "child.spawn", {"child_id": child, "prompt": f"worker {i}"}))
        rows.append((child, root, "run.lifecycle", {"state": "running"}))
    n = 0
    while len(rows) < total - len(runs):
        run = runs[n % len(runs)]
        parent = None if run == root else root
        if n % 25 == 0:
            call = f"c{n}"
            rows.append((run, parent, "tool.start", {"call_id": call, "tool": f"tool_{n % 7}", "input": {"n": n}}))
            rows.append((run, parent, "tool.end", {"call_id": call, "ok": n % 100 != 0, "duration_ms": 5 + n % 50,
                                                   **({"output": {"n": n}} if n % 100 else {"error": "failed"})}))
        else:
            rows.append((run, parent, "text.delta" if n % 3 else "reasoning.delta", {"text": f" word{n}"}))
        n += 1
    for child in reversed(runs[1:]):
        rows.append((child, root, "run.lifecycle", {"state": "done"}))
    while len(rows) < total - 1:
        rows.append((root, None, "text.delta", {"text": " end"}))
    rows.append((root, None, "run.lifecycle", {"state": "done"}))
    return rows


async def publish_big(publisher: Publisher, rows: list[tuple[str, str | None, str, dict[str, Any]]]) -> None:
    handles: dict[str, Run] = {}
    for run_id, parent, type_, payload in rows:
        if run_id not in handles:
            handles[run_id] = publisher.run(run_id, parent=parent)
        await handles[run_id].emit(type_, payload)
    await publisher.flush()
