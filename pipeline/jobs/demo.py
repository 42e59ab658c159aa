"""Synthetic agent runs for demos: what ``runwire up --demo`` publishes.

Each run looks like a real agent's: it plans (reasoning deltas, a plan
proposal), works in steps (tool calls — one of which fails — with realistic
durations), delegates to child runs (``child.spawn`` in the parent, the
children published with ``parent=``), answers in text deltas at token pace,
reports token usage (``x.usage``) and ends with a terminal
``run.lifecycle``. Every fifth run is aborted by its user part-way.

Content and timing are a deterministic function of ``(seed, run number)``;
only the run ids carry a per-process prefix, so a restarted demo never
collides with runs already in the replay log. The runs belong to the tenant
``DEMO_TENANT``, whose retention ``runwire up --demo`` keeps short.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

DEMO_TENANT = "demo"
"""The tenant of the demo's runs: a retention policy of their own keeps them from piling up."""
TOKEN_PACE_S = 0.03
"""Seconds between two deltas (about 33 tokens/s, a typical model's speed)."""

_TOPICS = (
    ("the latency of our checkout API", "p99 latency", "checkout"),
    ("why nightly builds got slower", "build duration", "ci"),
    ("the churn in last month's signups", "30-day churn", "growth"),
    ("the memory growth in the ingest service", "RSS growth", "ingest"),
    ("flaky tests in the payments suite", "failure rate", "payments"),
)
_WORDS = (
    "the data shows that most of the change comes from a small number of requests "
    "which spend their time waiting on a downstream call rather than computing so "
    "the fix is to batch those calls and cache results for a short while after "
    "which the numbers return to their usual range and stay there under load"
).split()


class DemoRun(Protocol):
    """What the demo needs of a publisher's run handle."""

    async def emit(self, type: str, payload: dict[str, Any]) -> Any: ...

    async def finish(self, state: str, reason: str | None = None) -> Any: ...


class DemoPublisher(Protocol):
    """What the demo needs of a publisher: a handle per run."""

    def run(
        self, run_id: str, *, tenant: str | None = None, parent: str | None = None
    ) -> DemoRun: ...


Sleep = Callable[[float], Awaitable[None]]


class DemoScript:
    """Publishes one synthetic run (and its children) through a publisher."""

    def __init__(
        self,
        publisher: DemoPublisher,
        *,
        seed: int = 0,
        pace: float = TOKEN_PACE_S,
        tenant: str | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.publisher = publisher
        self.seed = seed
        self.pace = pace
        self.tenant = tenant
        self.sleep = sleep
        self.open_runs: dict[str, DemoRun] = {}
        """Runs started and not yet finished (ended as aborted by :meth:`abort_open`)."""

    def _open(self, run_id: str, parent: str | None = None) -> DemoRun:
        run = self.publisher.run(run_id, tenant=self.tenant, parent=parent)
        self.open_runs[run_id] = run
        return run

    async def _finish(self, run_id: str, state: str, reason: str | None = None) -> None:
        run = self.open_runs.pop(run_id)
        await run.finish(state, reason)

    async def abort_open(self, reason: str) -> None:
        """End every run still open (children first) as ``aborted``."""
        for run_id in sorted(self.open_runs, key=lambda r: -r.count(".")):
            with contextlib.suppress(Exception):
                await self._finish(run_id, "aborted", reason)

    async def run(self, run_id: str, number: int) -> str:
        """Publish run ``number`` as ``run_id``; returns its terminal state."""
        rng = random.Random(f"{self.seed}:{number}")
        run = self._open(run_id)
        topic, metric, area = _TOPICS[number % len(_TOPICS)]
        await run.emit("run.lifecycle", {"state": "planning"})
        await self._deltas(run, "reasoning.delta", _sentence(rng, 18, f"Looking into {topic}."))
        await run.emit("plan.proposal", {"plan": _plan(run_id, metric, area)})
        await run.emit("run.lifecycle", {"state": "running"})
        await run.emit("step.boundary", {"step_index": 0, "step_kind": "plan"})
        await self._tool(run, rng, "search_metrics", {"metric": metric, "service": area})
        if number % 5 == 4:
            await self._deltas(run, "text.delta", _sentence(rng, 12, "Early findings:"))
            await run.emit("x.usage", _usage(rng, 900))
            await self._finish(run_id, "aborted", "cancelled by the user")
            return "aborted"
        await self._tool(
            run, rng, "fetch_dashboard", {"url": f"https://grafana.internal/{area}"}, fail=True
        )
        await run.emit("step.boundary", {"step_index": 1, "step_kind": "fan-out"})
        await self._children(run, run_id, rng, area)
        await run.emit("step.boundary", {"step_index": 2, "step_kind": "fan-in"})
        await self._deltas(
            run, "reasoning.delta", _sentence(rng, 10, "Combining what the sub-agents found.")
        )
        await self._deltas(run, "text.delta", _sentence(rng, 45, f"Summary on {topic}:"))
        await run.emit("x.usage", _usage(rng, 2400))
        await run.emit("step.boundary", {"step_index": 3, "step_kind": "done"})
        await self._finish(run_id, "done")
        return "done"

    async def _children(
        self, parent: DemoRun, parent_id: str, rng: random.Random, area: str
    ) -> None:
        tasks = []
        for index, task in enumerate(("collect logs", "check recent deploys")):
            child_id = f"{parent_id}.c{index + 1}"
            await parent.emit(
                "child.spawn",
                {"child_id": child_id, "prompt": f"{task} for {area}", "tools_allowed": ["shell"]},
            )
            child_rng = random.Random(rng.random())
            tasks.append(self._child(child_id, parent_id, child_rng, task))
        await asyncio.gather(*tasks)

    async def _child(self, child_id: str, parent_id: str, rng: random.Random, task: str) -> None:
        run = self._open(child_id, parent_id)
        await run.emit("run.lifecycle", {"state": "running"})
        await self._deltas(run, "reasoning.delta", _sentence(rng, 8, f"I need to {task}."))
        await self._tool(run, rng, "shell", {"cmd": f"runbook {task.replace(' ', '-')}"})
        await self._deltas(run, "text.delta", _sentence(rng, 16, "Found:"))
        await run.emit("x.usage", _usage(rng, 600))
        await self._finish(child_id, "done")

    async def _deltas(self, run: DemoRun, type: str, words: list[str]) -> None:
        for index, word in enumerate(words):
            await run.emit(type, {"text": word if index == 0 else " " + word})
            await self.sleep(self.pace)

    async def _tool(
        self,
        run: DemoRun,
        rng: random.Random,
        tool: str,
        args: dict[str, Any],
        *,
        fail: bool = False,
    ) -> None:
        call_id = f"call_{rng.getrandbits(40):010x}"
        await run.emit("tool.start", {"call_id": call_id, "tool": tool, "input": args})
        duration_ms = rng.randrange(150, 900)
        await self.sleep(self.pace * duration_ms / 30)
        end: dict[str, Any] = {"call_id": call_id, "ok": not fail, "duration_ms": duration_ms}
        if fail:
            end["error"] = {"code": "HTTP_503", "message": f"{tool}: upstream unavailable"}
        else:
            end["output"] = {
                "rows": rng.randrange(3, 40),
                "summary": " ".join(_sentence(rng, 6, "")),
            }
        await run.emit("tool.end", end)


def _sentence(rng: random.Random, count: int, opening: str) -> list[str]:
    words = opening.split()
    start = rng.randrange(len(_WORDS))
    words += [_WORDS[(start + i) % len(_WORDS)] for i in range(count)]
    return words


def _plan(run_id: str, metric: str, area: str) -> dict[str, Any]:
    steps = [
        {
            "id": "s1",
            "title": f"Measure {metric}",
            "intent": "research",
            "est_tools": ["search_metrics"],
        },
        {"id": "s2", "title": f"Ask sub-agents to inspect {area}", "intent": "execute"},
        {"id": "s3", "title": "Write up the findings", "intent": "report"},
    ]
    return {"id": f"plan-{run_id}", "run_id": run_id, "steps": steps, "est_total_cost_usd": 0.04}


def _usage(rng: random.Random, base: int) -> dict[str, Any]:
    inputs = base + rng.randrange(base // 2)
    outputs = base // 4 + rng.randrange(base // 8)
    return {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
        "model": "demo-model-1",
    }


def run_prefix() -> str:
    """A per-process prefix for demo run ids (base-36 seconds since the epoch)."""
    value, digits = int(time.time()), ""
    while value:
        value, rest = divmod(value, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
    return f"demo-{digits}"


async def publish_runs(
    publisher: DemoPublisher,
    stop: asyncio.Event,
    *,
    rate: float = 0.5,
    seed: int = 0,
    pace: float = TOKEN_PACE_S,
    prefix: str | None = None,
    limit: int | None = None,
) -> int:
    """Start a new demo run every ``1/rate`` seconds until ``stop`` is set (or ``limit`` runs).

    The first run starts at once. Runs overlap; when ``stop`` is set, runs
    still going are ended as ``aborted`` so no stream waits forever.
    Returns how many runs were started.
    """
    script = DemoScript(publisher, seed=seed, pace=pace, tenant=DEMO_TENANT)
    prefix = prefix or run_prefix()
    running: set[asyncio.Task[str]] = set()
    started = 0
    try:
        while not stop.is_set() and (limit is None or started < limit):
            run_id = f"{prefix}-{started + 1:04d}"
            task = asyncio.create_task(script.run(run_id, started), name=run_id)
            running.add(task)
            task.add_done_callback(running.discard)
            started += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1 / rate)
        if limit is not None and not stop.is_set():
            await asyncio.gather(*running)
    finally:
        tasks = list(running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await script.abort_open("demo stopped")
    return started


async def keep_publishing(
    url: str,
    stop: asyncio.Event,
    *,
    rate: float = 0.5,
    seed: int = 0,
    pace: float = TOKEN_PACE_S,
    prefix: str | None = None,
) -> int:
    """Connect a publisher to the bus at ``url`` and publish demo runs until ``stop``."""
    from ..sdk.publisher import Publisher

    async with Publisher.connect(url) as publisher:
        return await publish_runs(publisher, stop, rate=rate, seed=seed, pace=pace, prefix=prefix)
