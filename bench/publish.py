"""Events/s published from one process into each bus, side by side with what users write by hand.

    python bench/publish.py            # ~1 minute: memory, Redis, Kafka, baselines and peers
    python bench/publish.py --quick    # a smoke run
    python bench/publish.py --json     # one JSON object (medians)

Each case publishes N ``text.delta`` events of one run and waits until the
bus has accepted all of them; the figure is N / elapsed, the median of
``--repeat`` rounds. The runwire cases build every event through the SDK
(``run.emit``: validation, seq, ULID id, timestamp); the hand-written
baselines and the peer send pre-encoded canonical JSON bytes, so they do
less work per event than runwire.

Cases:

* ``runwire → memory/Redis/Kafka`` — ``Publisher`` + ``run.emit`` per event;
  ``runwire publish_events → Redis`` — pre-built envelopes.
* ``emit_cpu_us_loop`` / ``emit_cpu_us_redis`` — CPU µs per event of ``runwire emit →
  Redis`` on the publishing thread and in the Redis server (``kafka_emit_cpu_us_loop``
  likewise); these move far less with the machine's load than events/s.
* ``redis-py xadd`` — ``await redis.xadd(stream, {"e": data})`` per event.
* ``redis-py pipeline`` — ``pipe.xadd`` per event, ``await pipe.execute()``
  every 1000 (the baseline: ``baseline_events_per_s``).
* ``aiokafka send loop`` — ``await producer.send(topic, data, key=run)`` per
  event, then ``flush()`` (acks=all, idempotence off).
* ``faststream`` (peer) — ``RedisBroker.publish(data, stream=…)`` per event;
  ``KafkaBroker.publish(data, topic, key=…, no_confirm=True)`` per event, then
  waits for every confirmation.

Servers: a redis-server and a Tansu broker started on free ports (as the
tests do), or ``--redis-url`` / ``--kafka-url``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.services starts the brokers
from cputime import CpuMeter, import_code

import_code()

from runwire import Publisher  # noqa: E402 - the tree import_code() names
from runwire.core.envelope import encode, make  # noqa: E402 - the tree import_code() names

TEXT = "a token of about thirty chars."


def sample_bytes() -> bytes:
    return encode(make("text.delta", {"text": TEXT}, id="evt_01HZ7K3M00000000000000000",
                       ts="2026-01-01T00:00:00.000Z", run_id="bench-run", seq=1))


async def timed(n: int, body: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await body()
    return n / (time.perf_counter() - started)


# ---- runwire ------------------------------------------------------------------


CPU_US: dict[str, list[float]] = {}
"""CPU µs per event of the runwire emit cases, per part (``bench/cputime.py``), every round."""


async def runwire_emit(url: str, n: int, cpu_key: str | None = None,
                       meter: CpuMeter | None = None) -> float:
    async with Publisher.connect(url) as pub:
        run = pub.run(f"bench-{uuid.uuid4().hex[:8]}")
        await run.emit("text.delta", {"text": "warm-up"})
        await pub.flush()

        async def body() -> None:
            payload = {"text": TEXT}
            for _ in range(n):
                await run.emit("text.delta", payload)
            await pub.flush()

        meter = meter or CpuMeter()
        meter.start()
        rate = await timed(n, body)
        if cpu_key:
            for part, seconds in meter.stop().items():
                if part in ("loop", "redis"):
                    CPU_US.setdefault(f"{cpu_key}_cpu_us_{part}", []).append(seconds * 1e6 / n)
        return rate


async def runwire_prebuilt(url: str, n: int) -> float:
    async with Publisher.connect(url) as pub:
        run = pub.run(f"bench-{uuid.uuid4().hex[:8]}")
        events = [run.event("text.delta", {"text": TEXT}) for _ in range(n)]

        async def body() -> None:
            await pub.publish_events(events)
            await pub.flush()

        return await timed(n, body)


# ---- hand-written Redis -----------------------------------------------------------


async def redis_xadd(url: str, n: int) -> float:
    import redis.asyncio as redis

    client = redis.from_url(url)
    data, stream = sample_bytes(), f"bench:{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        for _ in range(n):
            await client.xadd(stream, {"e": data})

    try:
        return await timed(n, body)
    finally:
        await client.delete(stream)
        await client.aclose()


async def redis_pipeline(url: str, n: int, batch: int = 1000) -> float:
    import redis.asyncio as redis

    client = redis.from_url(url)
    data, stream = sample_bytes(), f"bench:{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(1, n + 1):
            pipe.xadd(stream, {"e": data})
            if i % batch == 0:
                await pipe.execute()
        await pipe.execute()

    try:
        return await timed(n, body)
    finally:
        await client.delete(stream)
        await client.aclose()


async def faststream_redis(url: str, n: int) -> float:
    from faststream.redis import RedisBroker

    broker = RedisBroker(url)
    await broker.connect()
    data, stream = sample_bytes(), f"bench:{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        for _ in range(n):
            await broker.publish(data, stream=stream)

    try:
        return await timed(n, body)
    finally:
        await broker.stop()


# ---- hand-written Kafka -------------------------------------------------------------


async def aiokafka_send(bootstrap: str, n: int) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    data, topic = sample_bytes(), f"bench.{uuid.uuid4().hex[:8]}"
    await producer.send_and_wait(topic, data, key=b"bench-run")

    async def body() -> None:
        for _ in range(n):
            await producer.send(topic, data, key=b"bench-run")
        await producer.flush()

    try:
        return await timed(n, body)
    finally:
        await producer.stop()


async def faststream_kafka(bootstrap: str, n: int) -> float:
    from faststream.kafka import KafkaBroker

    broker = KafkaBroker(bootstrap, enable_idempotence=False)
    await broker.connect()
    data, topic = sample_bytes(), f"bench.{uuid.uuid4().hex[:8]}"
    await broker.publish(data, topic, key=b"bench-run")

    async def body() -> None:
        confirms = [await broker.publish(data, topic, key=b"bench-run", no_confirm=True)
                    for _ in range(n)]
        await asyncio.gather(*confirms)

    try:
        return await timed(n, body)
    finally:
        await broker.stop()


def redis_benchmark_ceiling(url: str) -> int | None:
    """``redis-benchmark -P 64`` XADD into one stream: what the server itself takes (context)."""
    import re
    import shutil
    import subprocess
    from urllib.parse import urlsplit

    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    parts = urlsplit(url)
    out = subprocess.run(
        [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379), "-P", "64",
         "-n", "200000", "-q", "xadd", "bench:ceiling", "*", "e", sample_bytes().decode()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    found = re.findall(r"([0-9.]+) requests per second", out)
    return round(float(found[-1])) if found else None


# ---- driver -----------------------------------------------------------------------


def median_of(repeat: int, case: Callable[[], Awaitable[float]]) -> float:
    return statistics.median(asyncio.run(case()) for _ in range(repeat))


def start_servers(args: argparse.Namespace, stack: ExitStack) -> tuple[str, str]:
    redis_url, kafka_url = args.redis_url, args.kafka_url
    if not (redis_url and kafka_url):
        from tests.services import RedisServer, TansuBroker
    if not redis_url:
        redis = RedisServer()
        redis.start()
        stack.callback(redis.close)
        redis_url = redis.url
    if not kafka_url:
        tansu = TansuBroker()
        tansu.start()
        stack.callback(tansu.close)
        kafka_url = tansu.url
    return redis_url, kafka_url


def measure(args: argparse.Namespace, redis_url: str, kafka_url: str) -> dict[str, Any]:
    n, slow_n, r = args.events, max(args.events // 10, 1000), args.repeat
    bootstrap = kafka_url.split("://", 1)[1]
    memory_url = "memory://bench?max_backlog=100000000"
    cases: dict[str, tuple[str, Callable[[], Awaitable[float]]]] = {
        "memory_events_per_s": ("runwire emit → memory", lambda: runwire_emit(memory_url, n)),
        "events_per_s": ("runwire emit → Redis", lambda: runwire_emit(
            redis_url, n, "emit", CpuMeter(redis_url=redis_url))),
        "prebuilt_events_per_s": ("runwire publish_events → Redis",
                                  lambda: runwire_prebuilt(redis_url, n)),
        "baseline_events_per_s": ("redis-py pipeline loop (1000/execute)",
                                  lambda: redis_pipeline(redis_url, n)),
        "xadd_events_per_s": ("redis-py await xadd per event", lambda: redis_xadd(redis_url, slow_n)),
        "peer_redis_events_per_s": ("faststream RedisBroker.publish",
                                    lambda: faststream_redis(redis_url, slow_n)),
        "kafka_events_per_s": ("runwire emit → Kafka", lambda: runwire_emit(
            kafka_url, n, "kafka_emit")),
        "kafka_baseline_events_per_s": ("aiokafka send loop", lambda: aiokafka_send(bootstrap, n)),
        "peer_kafka_events_per_s": ("faststream KafkaBroker.publish(no_confirm)",
                                    lambda: faststream_kafka(bootstrap, n)),
    }
    figures: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for key, (label, case) in cases.items():
        figures[key] = round(median_of(r, case))
        labels[key] = label
        if not args.json:
            print(f"  {label:<44} {figures[key]:>10,} events/s", flush=True)
    for key, values in CPU_US.items():
        figures[key] = round(statistics.median(values), 2)
        if not args.json:
            print(f"  {key:<44} {figures[key]:>10} µs/event", flush=True)
    figures["redis_server_xadd_per_s"] = redis_benchmark_ceiling(redis_url)
    if not args.json:
        print(f"  {'(redis-benchmark -P 64 XADD, server ceiling)':<44} "
              f"{figures['redis_server_xadd_per_s'] or 0:>10,} entries/s", flush=True)
    figures["ratio_vs_baseline"] = round(figures["events_per_s"] / figures["baseline_events_per_s"], 2)
    figures["ratio_vs_peer_redis"] = round(figures["events_per_s"] / figures["peer_redis_events_per_s"], 2)
    figures["kafka_ratio_vs_baseline"] = round(
        figures["kafka_events_per_s"] / figures["kafka_baseline_events_per_s"], 2)
    figures["kafka_ratio_vs_peer"] = round(
        figures["kafka_events_per_s"] / figures["peer_kafka_events_per_s"], 2)
    figures["events"] = n
    figures["repeat"] = r
    figures["labels"] = labels
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10k events, 1 round")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--redis-url")
    parser.add_argument("--kafka-url")
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeat = 10_000, 1
    with ExitStack() as stack:
        redis_url, kafka_url = start_servers(args, stack)
        if not args.json:
            print(f"publish {args.events:,} events, median of {args.repeat} (redis {redis_url}, "
                  f"kafka {kafka_url})")
        figures = measure(args, redis_url, kafka_url)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"  runwire → Redis vs redis-py pipeline: {figures['ratio_vs_baseline']}×; "
              f"vs faststream: {figures['ratio_vs_peer_redis']}×")
        print(f"  runwire → Kafka vs aiokafka send loop: {figures['kafka_ratio_vs_baseline']}×; "
              f"vs faststream: {figures['kafka_ratio_vs_peer']}×")


if __name__ == "__main__":
    main()
