"""What an idle Kafka worker costs: CPU ms per second, by part, of a faust worker with nothing to do.

A worker that has joined its group and owns every ingest partition, none of
which receives anything, still fetches: aiokafka sends a fetch, the broker holds
it (``fetch_max_wait_ms``) and answers it empty, and the next one goes
(``docs/bus.md`` § Kafka, "Fetch wait"). Figures, each the median of
``--repeat`` rounds of ``--seconds`` measured once the worker has joined:

* ``idle_cpu_ms_per_s_<part>`` — CPU ms per second of ``loop`` (the event
  loop's thread), ``other`` (faust's consumer thread: aiokafka's fetches and
  heartbeats), ``broker`` (a Tansu broker started here) and ``total``;
* ``quiet_to_fetch_ms_p50`` / ``_max`` — from the publish of one event after a
  quiet spell (1 to 1.55 s, in 16 steps) to the bus's own consumer holding it
  (``Bus.consumer(...).fetch``): how long a held fetch keeps a run's first event.

``python bench/kafka_idle.py [--seconds S] [--repeat R] [--kafka URL] [--json]``; against
another tree, ``bench/alternate.py --base TREE -- bench/kafka_idle.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import CpuMeter, import_code

import_code()

from runwire.bus import open_bus  # noqa: E402 - the tree import_code() names
from runwire.store import open_store  # noqa: E402 - the tree import_code() names

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services import TansuBroker  # noqa: E402 - after the repository root is on the path

JOIN_S = 8.0
"""Time for the worker to start, join its group and be assigned every partition."""


async def idle_round(kafka_url: str, seconds: float, meter: CpuMeter) -> dict[str, float]:
    try:
        from runwire.processing.faust.worker import FaustWorker
    except ModuleNotFoundError:  # a tree from before the Kafka runtime moved (bench/alternate.py)
        from runwire.workers.faust_app import FaustWorker  # type: ignore[no-redef]

    prefix = f"i{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as scratch:
        async with open_bus(f"{kafka_url}?prefix={prefix}") as bus, \
                open_store(f"sqlite:///{scratch}/replay.db") as store:
            worker = FaustWorker(bus, store, group=f"{prefix}-g", name="i1",  # type: ignore[arg-type]
                                 data_dir=Path(scratch) / "data")
            running = asyncio.create_task(worker.run())
            try:
                await asyncio.sleep(JOIN_S)
                meter.start()
                started = time.monotonic()
                await asyncio.sleep(seconds)
                cpu = meter.stop()
                elapsed = time.monotonic() - started
            finally:
                worker.stop.set()
                await running
    parts = {part: cpu.get(part, 0.0) for part in ("loop", "other", "broker")}
    parts["total"] = sum(parts.values()) + cpu.get("log", 0.0)
    return {f"idle_cpu_ms_per_s_{part}": seconds_ * 1000 / elapsed for part, seconds_ in parts.items()}


async def quiet_round(kafka_url: str) -> dict[str, float]:
    from tests.events import event

    async with open_bus(f"{kafka_url}?prefix=q{uuid.uuid4().hex[:8]}&shards=4") as bus:
        consumer = bus.consumer("g", "q1")
        await consumer.fetch(block_ms=10)  # joins
        waits: list[float] = []
        try:
            for index in range(16):
                await asyncio.sleep(1.0 + (index % 5) * 0.137)  # quiet, ending anywhere in a hold
                published = time.monotonic()
                await bus.publish([event(f"q{index}", 1)])
                got: list[object] = []
                while not got:
                    got = list(await consumer.fetch(block_ms=5000))
                waits.append((time.monotonic() - published) * 1000)
                await consumer.ack(got)  # type: ignore[arg-type]
        finally:
            await consumer.close()
    return {"quiet_to_fetch_ms_p50": statistics.median(waits), "quiet_to_fetch_ms_max": max(waits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kafka", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    broker = None
    if args.kafka is None:
        broker = TansuBroker()
        broker.start()
    try:
        url = args.kafka or broker.url  # type: ignore[union-attr]
        pids = {"broker": broker.proc.pid} if broker and broker.proc else {}
        rounds = [asyncio.run(idle_round(url, args.seconds, CpuMeter(pids=pids)))
                  | asyncio.run(quiet_round(url)) for _ in range(args.repeat)]
    finally:
        if broker is not None:
            broker.close()
    figures = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:32} {value:8.2f}")


if __name__ == "__main__":
    main()
