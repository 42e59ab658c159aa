"""Capacity figures of the Redis bus, for the sizing math in docs/bus.md.

Measures, against one Redis (its own redis-server on a free port unless
``--redis URL`` is given), the median of ``--repeat`` runs of:

* ``xadd_per_stream``: ``redis-benchmark -P 64`` XADD into one stream (the server's ceiling);
* ``baseline_events_per_s``: a redis-py pipeline loop, one XADD per event, 1000 per batch;
* ``events_per_s``: ``bus.publish`` with 1000-event batches over 16 shards;
* ``consume_per_s``: one consumer's ``fetch`` + ``ack`` of what was published;
* ``append_per_s``: delivery ``append`` of 10 events a call, 8 writers at once.

``python bench/bus_capacity.py [--events N] [--repeat R] [--redis URL] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis.asyncio as aredis

from runwire.bus import open_bus
from runwire.core.envelope import Event, encode, make


def events(count: int, runs: int = 1000) -> list[Event]:
    return [
        make("text.delta", {"text": "hello world token"}, id=f"evt_01JABCDEFGHJKMNPQRS{i:08d}",
             ts="2026-01-01T00:00:00.000Z", run_id=f"run-{i % runs}", seq=i // runs + 1)
        for i in range(count)
    ]


async def baseline(url: str, batch: list[Event]) -> float:
    client = aredis.Redis.from_url(url)
    key = f"bench:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for i in range(0, len(batch), 1000):
        pipe = client.pipeline(transaction=False)
        for event in batch[i:i + 1000]:
            pipe.xadd(key, {"e": encode(event)})
        await pipe.execute()
    rate = len(batch) / (time.perf_counter() - started)
    await client.delete(key)
    await client.aclose()
    return rate


async def bus_figures(url: str, batch: list[Event]) -> tuple[float, float, float]:
    prefix = "b" + uuid.uuid4().hex[:8]
    async with open_bus(f"{url}?shards=16&prefix={prefix}") as bus:
        started = time.perf_counter()
        for i in range(0, len(batch), 1000):
            await bus.publish(batch[i:i + 1000])
        publish = len(batch) / (time.perf_counter() - started)

        consumer = bus.consumer("bench", "c1")
        got, started = 0, time.perf_counter()
        while got < len(batch):
            deliveries = await consumer.fetch(max_count=1000, block_ms=500)
            await consumer.ack(deliveries)
            got += len(deliveries)
        consume = len(batch) / (time.perf_counter() - started)
        await consumer.close()

        by_run: dict[str, list[Event]] = {}
        for event in batch[: len(batch) // 2]:
            by_run.setdefault(event.run_id, []).append(event)

        async def writer(run_ids: list[str]) -> int:
            written = 0
            for run in run_ids:
                evs = by_run[run]
                for j in range(0, len(evs), 10):
                    written += await bus.append((run, "raw"), evs[j:j + 10], state=b"s")
            return written

        names = sorted(by_run)
        started = time.perf_counter()
        written = sum(await asyncio.gather(*(writer(names[k::8]) for k in range(8))))
        append = written / (time.perf_counter() - started)
        for pattern in (f"{prefix}:*", f"{{{prefix}:*"):  # only this run's keys
            async for key in bus.redis.scan_iter(match=pattern, count=1000):
                await bus.redis.delete(key)
    return publish, consume, append


def xadd_ceiling(port: int, payload: bytes) -> float | None:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    out = subprocess.run(
        [binary, "-p", str(port), "-n", "300000", "-P", "64", "-q", "xadd", "bench:ceiling", "*",
         "e", payload.decode()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis", default=None, help="redis://… (default: start one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    server = None
    url = args.redis
    if url is None:
        from tests.services import RedisServer

        server = RedisServer()
        server.start()
        url = server.url
    try:
        batch = events(args.events)
        rows: dict[str, list[float]] = {"baseline_events_per_s": [], "events_per_s": [],
                                        "consume_per_s": [], "append_per_s": []}
        for _ in range(args.repeat):
            rows["baseline_events_per_s"].append(await baseline(url, batch))
            publish, consume, append = await bus_figures(url, batch)
            rows["events_per_s"].append(publish)
            rows["consume_per_s"].append(consume)
            rows["append_per_s"].append(append)
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        ceiling = xadd_ceiling(port, encode(batch[0]))
        cleaner = aredis.Redis.from_url(url)
        await cleaner.delete("bench:ceiling")
        await cleaner.aclose()
    finally:
        if server is not None:
            server.close()
    result: dict[str, float | None] = {k: round(statistics.median(v)) for k, v in rows.items()}
    result["xadd_per_stream"] = ceiling
    result["speedup_vs_pipeline_loop"] = round(
        statistics.median(rows["events_per_s"]) / statistics.median(rows["baseline_events_per_s"]), 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"redis-benchmark -P 64 XADD, one stream   {ceiling or float('nan'):>12,.0f} entries/s")
    print(f"redis-py pipeline loop (baseline)        {result['baseline_events_per_s']:>12,} events/s")
    print(f"bus.publish, 1000/batch, 16 shards       {result['events_per_s']:>12,} events/s"
          f"  ({result['speedup_vs_pipeline_loop']}x the baseline)")
    print(f"consumer fetch + ack, one consumer       {result['consume_per_s']:>12,} events/s")
    print(f"delivery append, 10/call, 8 writers      {result['append_per_s']:>12,} events/s")


if __name__ == "__main__":
    asyncio.run(main())
