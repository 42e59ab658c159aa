"""CPU the framework integrations add per framework event, beside each framework's bare stream.

Run: ``.venv/bin/python bench/integrations.py [--events N] [--rounds R] [--only a,b] [--json]``

For each framework (``bench/integration_cases/<name>.py``: the same agent, the same input,
driven by the framework's own offline test model), rounds alternate, in one process:

* **bare** — the framework's streaming call, its events consumed and dropped;
* **adapted** — the same through ``runwire.integrations.<name>.run`` onto a publisher of an
  in-process ``memory://`` bus (the events built, validated, encoded and published);
* **sdk** — the publisher alone queuing as many text deltas as the adapted round published,
  the way the adapters queue them (:func:`delta_path`), to split what the adapter adds into
  its own mapping and the SDK's publish.

Figures are CPU µs per framework event (``time.process_time``, every thread of the process),
medians of the rounds: ``bare``, ``adapted``, ``added`` = adapted − bare (the target: ≤ 5 µs),
and within it ``sdk`` (publishing) and ``mapping`` = added − sdk. Latest figures:
``docs/benchmarks.md`` § Integrations.

``--instructions`` counts instructions instead (``bench/callgrind.py``: steady to ±0.3 % where
CPU time moves ±30 %, to compare code), each part once in its own process under callgrind:
the same parts per framework event, the publisher batching only at ``max_batch`` (its per-batch
cost depends on time, which valgrind stretches), and that cost apart: ``batch`` — the
instructions of one flusher cycle (an event flushed alone, less the event's own). With
``RUNWIRE_CODE=<other checkout>`` (``bench/alternate.py``) the same for another tree.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import callgrind  # noqa: E402
from cputime import import_code  # noqa: E402

# bench/ is no folder of modules for a framework: ADK's A2A client imports grpc, not bench/grpc.py
sys.path[:] = [path for path in sys.path if Path(path or ".").resolve() != HERE]

import_code()

from runwire import Publisher  # noqa: E402 - the tree import_code() names

FRAMEWORKS = ("pydantic_ai", "openai_agents", "langgraph", "google_adk")


def load_case(name: str) -> ModuleType:
    path = HERE / "integration_cases" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"integration_case_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def cpu_per_event(work: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    gc.collect()  # untimed: the garbage of the part before is not this part's cost
    started = time.process_time()
    count = await work()
    return (time.process_time() - started) * 1e6 / max(count, 1), count


async def one_round(case: ModuleType, events: int) -> dict[str, float]:
    bare, count = await cpu_per_event(lambda: case.bare(events))
    async with Publisher.connect(f"memory://bench-{uuid.uuid4().hex[:8]}") as pub:
        before = pub.published + pub.pending

        async def adapted() -> int:
            n: int = await case.adapted(events, pub)
            await pub.flush()
            return n

        adapted_us, adapted_count = await cpu_per_event(adapted)
        emitted = pub.published + pub.pending - before
    async with Publisher.connect(f"memory://bench-{uuid.uuid4().hex[:8]}") as pub:
        run = pub.run("sdk-only")

        async def sdk() -> int:
            queue = delta_path(run)
            for index in range(emitted):
                text = f"token {index} "
                if not queue(text):
                    await run.emit("text.delta", {"text": text})
                if index % 500 == 0:
                    await asyncio.sleep(0)  # as emit yields every max_batch / 4 events
            await pub.flush()
            return adapted_count

        sdk_us, _ = await cpu_per_event(sdk)
    return {"bare_us": bare, "adapted_us": adapted_us, "sdk_us": sdk_us,
            "framework_events": float(count), "published_per_framework_event": emitted / max(adapted_count, 1)}


def delta_path(run: Any) -> Callable[[str], bool]:
    """How the tree's adapters queue a text delta (``AgentRun.delta_now``'s way): as bytes
    (``Run.delta_nowait``), else an event without a coroutine (``emit_nowait``); False when
    the tree has neither (then ``emit``)."""
    if hasattr(run, "delta_nowait"):
        return functools.partial(run.delta_nowait, "text.delta")  # type: ignore[no-any-return]
    if hasattr(run, "emit_nowait"):
        from runwire.core.events import TextPayload
        return lambda text: run.emit_nowait("text.delta", TextPayload(text=text)) is not None
    return lambda text: False


async def measure(name: str, events: int, rounds: int) -> dict[str, float]:
    case = load_case(name)
    await one_round(case, max(events // 10, 10))  # warm-up: imports, caches
    results = [await one_round(case, events) for _ in range(rounds)]
    figures = {key: statistics.median(r[key] for r in results) for key in results[0]}
    figures["added_us"] = statistics.median(r["adapted_us"] - r["bare_us"] for r in results)
    figures["mapping_us"] = statistics.median(r["adapted_us"] - r["bare_us"] - r["sdk_us"] for r in results)
    return figures


PARTS = ("bare", "adapted", "sdk", "batch")


async def counted_part(name: str, part: str, events: int) -> None:
    """One part of one framework's round between callgrind's :func:`~callgrind.ready` and
    :func:`~callgrind.done` (see ``--instructions``), then the process ends at once (what is
    still queued is not the part's)."""
    case = load_case(name)
    async with Publisher.connect(f"memory://bench-{uuid.uuid4().hex[:8]}") as pub:
        await case.adapted(max(events // 10, 10), pub)  # warm-up: imports, caches
        await case.bare(max(events // 10, 10))
    if hasattr(case, "_COUNTS"):
        case._COUNTS[events] = events  # the adapted part runs no bare round of its own
    linger = 0.0 if part == "batch" else 3_600_000.0  # no batch but at max_batch
    pub = Publisher.connect(f"memory://bench-{uuid.uuid4().hex[:8]}", linger_ms=linger)
    await pub.start()
    run = pub.run(f"counted-{uuid.uuid4().hex[:8]}")
    callgrind.ready()
    if part == "bare":
        await case.bare(events)
    elif part == "adapted":
        await case.adapted(events, pub)
    else:
        queue = delta_path(run)
        for index in range(events):
            text = f"token {index} "
            if not queue(text):
                await run.emit("text.delta", {"text": text})
            if part == "batch":
                await pub.flush()
    callgrind.done(str(pub.published + pub.pending))  # the events the part queued
    os._exit(0)


def count_instructions(names: list[str], events: int) -> dict[str, float]:
    """Instructions per framework event of each part (``--instructions``)."""
    if not callgrind.available():
        raise SystemExit("--instructions needs valgrind (Debian: apt install valgrind)")

    def part(name: str, which: str) -> tuple[float, list[str]]:
        total, said = callgrind.count([__file__, "--child", f"{name}:{which}", "--events", str(events)])
        return total / events, said

    sdk, _ = part(names[0], "sdk")
    batch = part(names[0], "batch")[0] - sdk
    out: dict[str, float] = {"sdk_per_event_ir": sdk, "batch_ir": batch}
    for name in names:
        bare, _ = part(name, "bare")
        adapted, said = part(name, "adapted")
        published = int(said[-1]) / events
        out.update({f"{name}_bare_ir": bare, f"{name}_adapted_ir": adapted,
                    f"{name}_added_ir": adapted - bare, f"{name}_sdk_ir": sdk * published,
                    f"{name}_mapping_ir": adapted - bare - sdk * published,
                    f"{name}_published_per_framework_event": published})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000, help="framework events per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default=",".join(FRAMEWORKS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of CPU time")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # name:part, run under callgrind
    args = parser.parse_args()
    if args.child:
        name, part = args.child.split(":")
        asyncio.run(counted_part(name, part, args.events))
        return
    if args.instructions:
        counted = count_instructions(args.only.split(","), args.events)
        if args.json:
            print(json.dumps(counted))
            return
        print(f"sdk: {counted['sdk_per_event_ir'] / 1e3:.1f} k instructions per event emitted,"
              f" {counted['batch_ir'] / 1e3:.1f} k per batch")
        for name in args.only.split(","):
            print(f"{name:14} bare {counted[f'{name}_bare_ir'] / 1e3:7.1f} k/event  adapted"
                  f" {counted[f'{name}_adapted_ir'] / 1e3:7.1f}  added {counted[f'{name}_added_ir'] / 1e3:6.1f}"
                  f" (sdk {counted[f'{name}_sdk_ir'] / 1e3:5.1f}, mapping {counted[f'{name}_mapping_ir'] / 1e3:5.1f})")
        return
    out: dict[str, Any] = {}
    for name in args.only.split(","):
        figures = asyncio.run(measure(name, args.events, args.rounds))
        out.update({f"{name}_{key}": value for key, value in figures.items()})
        if not args.json:
            print(f"{name:14} bare {figures['bare_us']:7.1f} µs/event  adapted {figures['adapted_us']:7.1f}"
                  f"  added {figures['added_us']:6.1f} (sdk {figures['sdk_us']:5.1f},"
                  f" mapping {figures['mapping_us']:5.1f})  over {figures['framework_events']:.0f} events,"
                  f" {figures['published_per_framework_event']:.2f} published per event")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
