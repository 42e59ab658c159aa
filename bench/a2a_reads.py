"""What an A2A ``GetTask`` and a ``ListTasks`` with artifacts read of a long run, and their CPU time.

    .venv/bin/python bench/a2a_reads.py                   # a 50 k-event run, 5 repeats
    git archive main | tar -x -C /tmp/base
    .venv/bin/python bench/alternate.py --base /tmp/base --rounds 3 -- bench/a2a_reads.py

The data: one finished run of ``--events`` events (text deltas of 200 characters, a tool call
every 50), in the in-process bus's raw and shaped views and a SQLite replay log, as a worker
writes them (the hot tier keeps the run's last events, the log all). Each figure is the median of
``--repeats`` calls: the events read (hot tier and replay log) and the CPU milliseconds of one ``GetTask`` and one ``ListTasks``
(``includeArtifacts``) listing that run, called on the edge's methods directly (no HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Any

from cputime import import_code

RUN = "run_long"


def events_of(count: int) -> list[Any]:
    """Running, text deltas of 200 characters with a tool call every 50, done."""
    from runwire.core.envelope import decode
    from runwire.core.ulid import new_event_id

    def kind(seq: int) -> tuple[str, dict[str, Any]]:
        if seq in (1, count):
            return "run.lifecycle", {"state": "running" if seq == 1 else "done"}
        if seq % 50 == 10:
            return "tool.start", {"call_id": f"c{seq}", "tool": "search", "input": {"q": "x" * 50}}
        return "text.delta", {"text": "x" * 200}

    return [decode(json.dumps({"id": new_event_id(), "run_id": RUN, "seq": seq, "ts": "2026-11-27T12:00:00Z",
                               "type": kind(seq)[0], "payload": kind(seq)[1]}).encode())
            for seq in range(1, count + 1)]


async def measure(store_url: str, count: int, repeats: int) -> dict[str, float]:
    from runwire.bus import open_bus
    from runwire.edge import EdgeSettings
    from runwire.edge.a2a import methods
    from runwire.edge.service.context import Edge
    from runwire.store import open_store

    async with open_bus("memory://") as bus, open_store(store_url) as log:
        events = events_of(count)
        for start in range(0, count, 1000):
            chunk = events[start:start + 1000]
            await log.append(chunk)
            await bus.append((RUN, "raw"), chunk)
            await bus.append((RUN, "shaped"), chunk)
        edge = Edge(bus, log, EdgeSettings())
        read_events = [0]
        original = bus.read

        async def counted(key: Any, after: int, limit: int = 1000) -> list[Any]:
            found = await original(key, after, limit)
            read_events[0] += len(found)
            return found

        read_log, iterate_log = log.read, log.iter_events

        async def counted_log(run_id: str, after: int = 0, limit: int | None = None) -> list[Any]:
            found = await read_log(run_id, after, limit)
            read_events[0] += len(found)
            return found

        async def counted_iter(run_id: str, after: int = 0, batch: int = 5000) -> Any:
            async for event in iterate_log(run_id, after, batch):
                read_events[0] += 1
                yield event

        bus.read = counted  # type: ignore[method-assign]
        log.read = counted_log  # type: ignore[method-assign]
        log.iter_events = counted_iter  # type: ignore[method-assign]
        figures: dict[str, float] = {}
        calls = {
            "get_task": lambda: methods.get_task(edge, None, {"id": RUN}),
            "list_tasks": lambda: methods.list_tasks(edge, None, {"includeArtifacts": True}),
        }
        for name, call in calls.items():
            cpu, reads = [], []
            for _ in range(repeats):
                read_events[0] = 0
                started = time.process_time()
                await call()
                cpu.append(time.process_time() - started)
                reads.append(read_events[0])
            figures[f"{name}_cpu_ms"] = round(statistics.median(cpu) * 1000, 1)
            figures[f"{name}_events_read"] = statistics.median(reads)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("--events", 50_000), ("--repeats", 5)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--json", action="store_true", help="the figures as one JSON object")
    args = parser.parse_args()
    import_code()  # runwire from the tree RUNWIRE_CODE names (bench/alternate.py)
    with tempfile.TemporaryDirectory() as folder:
        figures = asyncio.run(measure(f"sqlite:///{folder}/replay.db", args.events, args.repeats))
    lines = [json.dumps(figures)] if args.json else [
        f"a finished run of {args.events} events, median of {args.repeats}",
        *(f"  {name:10s} {figures[f'{name}_events_read']:>9,.0f} events read   "
          f"{figures[f'{name}_cpu_ms']:>8,.1f} ms CPU" for name in ("get_task", "list_tasks"))]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
