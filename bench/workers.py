"""Worker throughput: raw events/s through one worker, beside the bus's bare consume-and-ack rate.

For each backend, in the same run:

* ``<bus>_consume_baseline_per_s`` — one consumer of a fresh group doing only
  ``fetch`` + ``ack`` of the published events (no decode, no writes);
  ``<bus>_consume_one_busy_run_per_s`` — the same for one busy run beside 15
  quiet ones (half as many events, nearly all on one shard: fetches that fill
  from one shard);
* ``<bus>_events_per_s`` — published events through ``run_worker`` (decode,
  fan-in, sequence, shape, replay log append, delivery appends, ack), counted
  from its first fetched batch to the end of its last batch's writes.
* ``kafka_events_per_s`` — the same through the faust-streaming app
  (``runwire.workers.faust_app``) on Kafka, the first ``--kafka-events`` events
  (default 30,000), counted from the first fetched entries the app takes to
  the end of its last writes; the Kafka baseline is the bus's own consumer
  group.
* ``<bus>_cpu_us_<part>`` — CPU µs per published event spent during the
  worker's run by each part (``bench/cputime.py``): ``loop`` (the event loop's
  thread), ``log`` (the replay log's SQLite thread), ``other`` threads,
  ``redis`` (the Redis server, all its threads) or ``broker`` (a Tansu broker
  started here), and ``_total``; ``redis_<command>_per_event``, the commands
  Redis ran per published event (a script's inner calls included). These
  move far less with the machine's load than events/s do.

The workload: ``--runs`` concurrent runs (a parent and two children each), 85 %
text/reasoning deltas, the rest tool calls and steps, 40-character texts.
Each round's workload is published first, on Redis and Kafka by a bus of its own that keeps
nothing (``retain_bytes=0``): a publishing bus keeps its batches until every group read them,
which in the measured process cost the Kafka consume baseline ~20 % (the collector walking the
kept batches). The replay log is SQLite in a temporary directory (the embedded default), or
``--store URL``. Services: ``--redis URL`` / ``--kafka URL``, else a
redis-server / Tansu broker of its own on a free port (tests/services.py).

``python bench/workers.py [--events N] [--repeat R] [--only memory,redis,kafka] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import CpuMeter, import_code, per_event_us

import_code()

import runwire.workers.commands.worker as worker_command  # noqa: E402 - the tree import_code() names
from runwire.bus import Bus, open_bus  # noqa: E402 - the tree import_code() names
from runwire.core.envelope import Event, format_ts, make  # noqa: E402 - the tree import_code() names
from runwire.core.errors import ConfigError  # noqa: E402 - the tree import_code() names
from runwire.store import open_store  # noqa: E402 - the tree import_code() names
from runwire.workers.runtime import run_worker  # noqa: E402 - the tree import_code() names

TEXT = "x" * 40


def workload(count: int, runs: int) -> list[Event]:
    """``count`` events over ``runs`` root runs with two children each, interleaved."""
    out: list[Event] = []
    seqs: dict[str, int] = {}
    start = time.time()
    kinds = ["text.delta"] * 12 + ["reasoning.delta"] * 5 + ["tool.start", "tool.end", "step.boundary"]
    for index in range(count):
        root = f"b{index % runs}"
        member = (index // runs) % 3
        run_id = root if member == 0 else f"{root}.c{member}"
        seq = seqs[run_id] = seqs.get(run_id, 0) + 1
        kind = kinds[index % len(kinds)]
        payload = _payload(kind, index)
        links = {} if member == 0 else {"parent_id": root, "root_id": root}
        ts = format_ts(_at(start + index / 100_000))
        out.append(make(kind, payload, id=f"evt_{index:020d}", ts=ts, run_id=run_id, seq=seq, **links))
    return out


def one_busy_run(count: int) -> list[Event]:
    """One event of each of 15 quiet runs, then ``count`` deltas of one busy run."""
    ts = format_ts(_at(time.time()))
    quiet = [make("step.boundary", _payload("step.boundary", n), id=f"evt_q{n:03d}", ts=ts,
                  run_id=f"quiet{n}", seq=1) for n in range(15)]
    return quiet + [make("text.delta", {"text": TEXT}, id=f"evt_{seq:020d}", ts=ts, run_id="busy",
                         seq=seq) for seq in range(1, count + 1)]


def _at(seconds: float):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC)


def _payload(kind: str, index: int) -> dict[str, object]:
    if kind.endswith(".delta"):
        return {"text": TEXT}
    if kind == "tool.start":
        return {"call_id": f"c{index}", "tool": "browser", "input": {"q": TEXT}}
    if kind == "tool.end":
        return {"call_id": f"c{index}", "ok": True, "output": TEXT}
    return {"step_index": index, "step_kind": "tool-roundtrip"}


async def publish(bus: Bus, events: list[Event]) -> None:
    for start in range(0, len(events), 2000):
        await bus.publish(events[start : start + 2000])


async def publish_apart(bus: Bus, bus_url: str, events: list[Event]) -> None:
    """Publish the workload through a bus of its own, keeping nothing, when ``bus`` is on a server:
    a publishing bus keeps its batches until every group has read them (``retain_bytes``), and
    its checks and the kept batches (the whole workload) would weigh on the process measured.
    The memory bus lives in ``bus`` itself; a tree from before kept batches publishes as it is."""
    if bus_url.startswith("memory:"):
        await publish(bus, events)
        return
    sep = "&" if "?" in bus_url else "?"
    try:
        publisher = open_bus(f"{bus_url}{sep}retain_bytes=0")
    except ConfigError:  # a tree without the option keeps nothing
        publisher = open_bus(bus_url)
    async with publisher as opened:
        await publish(opened, events)


async def consume_baseline(bus: Bus, total: int) -> float:
    consumer = bus.consumer(f"base-{uuid.uuid4().hex[:6]}", "c1")
    seen, started = 0, None
    try:
        while seen < total:
            got = await consumer.fetch(2048, block_ms=2000)
            if started is None and got:
                started = time.perf_counter()
            if got:
                await consumer.ack(got)
            seen += len(got)
        assert started is not None
        return total / (time.perf_counter() - started)
    finally:
        await consumer.close()


async def baseline_round(bus_url: str, events: list[Event]) -> float:
    async with open_bus(bus_url) as bus:
        await publish_apart(bus, bus_url, events)
        return await consume_baseline(bus, len(events))


Figures = dict[str, float]


async def one_round(name: str, bus_url: str, store_url: str, events: list[Event],
                    meter: CpuMeter) -> Figures:
    baseline = await baseline_round(bus_url.replace("{p}", uuid.uuid4().hex[:8]), events)
    busy_run = await baseline_round(bus_url.replace("{p}", uuid.uuid4().hex[:8]),
                                    one_busy_run(len(events) // 2))
    url = bus_url.replace("{p}", uuid.uuid4().hex[:8])
    async with open_bus(url) as bus, open_store(store_url) as store:
        await publish_apart(bus, url, events)
        meter.start()
        stats = await run_worker(bus, store, group=f"w-{uuid.uuid4().hex[:6]}", name="w1",
                                 burst=True, batch=2048)
        cpu = meter.stop()
        assert stats.entries >= len(events), stats
        return {f"{name}_events_per_s": len(events) / stats.busy_seconds,
                f"{name}_consume_baseline_per_s": baseline,
                f"{name}_consume_one_busy_run_per_s": busy_run,
                **per_event_us(cpu, len(events), name)}


async def faust_round(bus_url: str, store_url: str, events: list[Event],
                      meter: CpuMeter) -> Figures:
    try:
        from runwire.processing.faust.worker import FaustWorker
    except ModuleNotFoundError:  # a tree from before the Kafka runtime moved (bench/alternate.py)
        from runwire.workers.faust_app import FaustWorker  # type: ignore[no-redef]

    baseline = await baseline_round(bus_url.replace("{p}", uuid.uuid4().hex[:8]), events)
    url = bus_url.replace("{p}", uuid.uuid4().hex[:8])
    async with open_bus(url) as bus, open_store(store_url) as store:
        await publish_apart(bus, url, events)
        worker = FaustWorker(bus, store, group=f"f-{uuid.uuid4().hex[:6]}", name="f1",  # type: ignore[arg-type]
                             burst=True)
        meter.start()
        stats = await worker.run()
        cpu = meter.stop()
        assert stats.entries >= len(events), stats
        return {"kafka_events_per_s": len(events) / stats.busy_seconds,
                "kafka_consume_baseline_per_s": baseline,
                **per_event_us(cpu, len(events), "kafka")}


def median_of(repeat: int, make_round: Callable[[], object]) -> Figures:
    """Each figure's median over ``repeat`` rounds."""
    results: list[Figures] = [asyncio.run(make_round()) for _ in range(repeat)]  # type: ignore[arg-type]
    return {key: statistics.median(r.get(key, 0.0) for r in results)
            for key in dict.fromkeys(k for r in results for k in r)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--kafka-events", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="memory,redis,kafka")
    parser.add_argument("--redis", default=None)
    parser.add_argument("--kafka", default=None)
    parser.add_argument("--store", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    wanted = set(args.only.split(","))
    events = workload(args.events, args.runs)
    if hasattr(worker_command, "tune_gc"):  # the process set up as `runwire worker` sets it up
        worker_command.tune_gc()
    if hasattr(worker_command, "tune_switch_interval"):
        worker_command.tune_switch_interval()
    tmp = Path(tempfile.mkdtemp(prefix="runwire-bench-"))
    counter = iter(range(1_000_000))

    def store() -> str:
        return args.store or f"sqlite:///{tmp}/replay-{next(counter)}.db"

    figures: dict[str, float] = {"events": args.events}
    services: list[object] = []
    try:
        if "memory" in wanted:
            figures |= median_of(args.repeat, lambda: one_round(
                "memory", "memory://?max_backlog=10000000", store(), events, CpuMeter()))
        if "redis" in wanted:
            url = args.redis or _start("RedisServer", services)
            meter = CpuMeter(redis_url=url)
            figures |= median_of(args.repeat, lambda: one_round(
                "redis", f"{url}?prefix=b{{p}}", store(), events, meter))
            figures["redis_worker_to_baseline"] = (
                figures["redis_events_per_s"] / figures["redis_consume_baseline_per_s"])
        if "kafka" in wanted:
            started = len(services)
            url = args.kafka or _start("TansuBroker", services)
            pids = {"broker": services[-1].proc.pid} if len(services) > started else {}  # type: ignore[attr-defined]
            kafka_events = events[: args.kafka_events]
            figures["kafka_events"] = len(kafka_events)
            figures |= median_of(args.repeat, lambda: faust_round(
                f"{url}?prefix=b{{p}}", store(), kafka_events, CpuMeter(pids=pids)))
    finally:
        for service in services:
            service.close()  # type: ignore[attr-defined]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value:>14,.2f}")


def _start(kind: str, services: list[object]) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/services.py starts the servers
    from tests import services as test_services

    service = getattr(test_services, kind)()
    service.start()
    services.append(service)
    return str(service.url)


if __name__ == "__main__":
    main()
