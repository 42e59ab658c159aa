"""Forking a long run on the SQLite replay log, beside the copy a user makes without it.

    .venv/bin/python bench/fork.py                 # a 200 k-event run, 3 repeats
    .venv/bin/python bench/fork.py --events 50000 --json

The data: one root run of ``--events`` events (deltas, tool calls, usage; a
tenth of them a child's, fanned in with ``child_id``), stored as a worker
writes it (``append_streams``, 512 events a write).

* **runwire fork** — ``runwire.jobs.fork.fork_run`` of the whole run into a new
  id: reads the run, rewrites each event's run id, appends 2 000 events a write,
  the last with the fork's checkpoint of record.
* **export + import** (the baseline) — what a user does without a fork:
  ``runwire replay export`` of the run (the stored bytes as they are), each line
  given the new run id, ``runwire replay import`` of the lines (validates every
  line, run metadata, idempotent).

Each figure is the median of ``--repeats`` runs, into a fresh id each time:
events/s, and CPU µs per event by part (``loop``: the event loop's thread,
``log``: the SQLite thread).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cputime import CpuMeter, import_code  # noqa: E402 - bench/ is the script's directory

import_code()

from runwire.core import envelope  # noqa: E402 - the tree import_code() names
from runwire.core.lines import encode_lines  # noqa: E402
from runwire.core.ulid import MonotonicULID  # noqa: E402
from runwire.jobs.fork import fork_run  # noqa: E402
from runwire.jobs.replay import export_run  # noqa: E402
from runwire.store import open_store  # noqa: E402
from runwire.store.base import ReplayLog  # noqa: E402
from runwire.store.jsonl import import_jsonl  # noqa: E402

SOURCE = "run_source"


def events_of(count: int) -> list[Any]:
    ids = MonotonicULID("evt_")
    out = []
    for seq in range(1, count + 1):
        kind, payload = "text.delta", {"text": f"word{seq} and some more text "}
        if seq % 50 == 10:
            kind, payload = "tool.start", {"call_id": f"c{seq}", "tool": "search", "input": {"q": f"item {seq}"}}
        elif seq % 50 == 20:
            kind, payload = "x.usage", {"input_tokens": 120, "output_tokens": 48, "total_tokens": 168}
        elif seq == count:
            kind, payload = "run.lifecycle", {"state": "done"}
        child = {"child_id": "run_child"} if seq % 10 == 3 and seq != count else {}
        ts = f"2026-01-01T00:{(seq // 60000) % 60:02d}:{(seq // 1000) % 60:02d}.{seq % 1000:03d}Z"
        out.append(envelope.make(kind, payload, id=ids.new(), ts=ts, run_id=SOURCE, seq=seq, tenant="acme",
                                 **child))
    return out


async def store_source(log: ReplayLog, events: list[Any]) -> None:
    for start in range(0, len(events), 512):
        part = events[start:start + 512]
        await log.append_streams([(SOURCE, part, encode_lines(part))])


async def by_fork(log: ReplayLog, run_id: str) -> int:
    result = await fork_run(log, SOURCE, run_id=run_id)
    return result.fork.at


async def by_export_import(log: ReplayLog, run_id: str) -> int:
    sink = io.BytesIO()
    await export_run(log, SOURCE, sink.write)
    old, new = f'"run_id":"{SOURCE}"'.encode(), f'"run_id":"{run_id}"'.encode()
    report = await import_jsonl(log, (line.replace(old, new, 1) for line in sink.getvalue().splitlines()))
    return report.added


async def measure(url: str, events: int, repeats: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"events": events}
    async with open_store(url) as log:
        await store_source(log, events_of(events))
        for name, copy in (("fork", by_fork), ("export_import", by_export_import)):
            seconds: list[float] = []
            parts: dict[str, list[float]] = {}
            for repeat in range(repeats):
                meter = CpuMeter()
                meter.start()
                started = time.perf_counter()
                copied = await copy(log, f"run_{name}_{repeat}")
                seconds.append(time.perf_counter() - started)
                for part, cpu in meter.stop().items():
                    parts.setdefault(part, []).append(cpu)
                assert copied == events, (name, copied)
            figures[f"{name}_events_per_s"] = round(events / statistics.median(seconds))
            for part, cpu in parts.items():
                if part in ("loop", "log", "other"):
                    figures[f"{name}_cpu_us_per_event_{part}"] = round(statistics.median(cpu) / events * 1e6, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(measure(f"sqlite:///{tmp}/replay.db", args.events, args.repeats))
    if args.json:
        print(json.dumps(figures))
        return
    print(f"a run of {args.events} events, median of {args.repeats}, SQLite")
    for name in ("fork", "export_import"):
        cpu = ", ".join(f"{part} {figures[key]}" for part in ("loop", "log", "other")
                        if (key := f"{name}_cpu_us_per_event_{part}") in figures)
        print(f"  {name:14s} {figures[f'{name}_events_per_s']:>9,} events/s   CPU µs/event: {cpu}")
    print(f"  fork / export+import: {figures['fork_events_per_s'] / figures['export_import_events_per_s']:.2f}×")


if __name__ == "__main__":
    main()
