"""What is particular to the Kafka bus: topic layout, record keys, commits on revoke, the hot tier.

The shared behaviour is in test_contract.py; these tests look at the topics
themselves with a plain aiokafka client, on a real broker (Tansu).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from runwire.bus import Delivery, open_bus
from runwire.bus.kafka.io import ingest_events
from runwire.bus.keys import shard_for
from runwire.core.envelope import decode, encode
from runwire.core.errors import ConfigError
from tests.events import event


@pytest.fixture
def prefix() -> str:
    return "k" + uuid.uuid4().hex[:10]


@pytest.fixture
def bootstrap(kafka_url: str) -> str:
    return kafka_url.split("://", 1)[1]


async def read_topic(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of a topic (small test topics only)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await reader.end_offsets(tps)
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        records: list[Any] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            positions = [await reader.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            for batch in (await reader.getmany(timeout_ms=300)).values():
                records += batch
        return records
    finally:
        await reader.stop()


async def test_topics_are_created_with_the_configured_partitions(
    kafka_url: str, bootstrap: str, prefix: str
) -> None:
    """Kafka: topics created with the configured partition count; a bus whose shard count
    disagrees with existing topics is refused rather than silently re-sharding runs."""
    async with open_bus(f"{kafka_url}?prefix={prefix}&shards=6"):
        pass
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(
            [f"{prefix}.ingest", f"{prefix}.delivery", f"{prefix}.control", f"{prefix}.deadletter"])
    finally:
        await admin.close()
    assert {t["topic"]: len(t["partitions"]) for t in described} == {
        f"{prefix}.ingest": 6, f"{prefix}.delivery": 6, f"{prefix}.control": 6,
        f"{prefix}.deadletter": 1,
    }
    with pytest.raises(ConfigError, match="shards=6"):
        async with open_bus(f"{kafka_url}?prefix={prefix}&shards=4"):
            pass


async def test_ingest_records_are_keyed_by_root_run_in_its_shard(
    kafka_url: str, bootstrap: str, prefix: str
) -> None:
    """Key = root run id, partition = its shard: a parent and its children share one
    partition, so one consumer owns the whole tree in order; a record holds events of
    one root run only (a tree's events of one publish are one record)."""
    async with open_bus(f"{kafka_url}?prefix={prefix}&shards=8") as bus:
        await bus.publish([
            event("parent", 1), event("child", 1, parent_id="parent", root_id="parent"),
            event("other", 1), event("grandchild", 1, parent_id="child", root_id="parent"),
        ])
    records = await read_topic(bootstrap, f"{prefix}.ingest", 8)
    seen = {
        (r.key, r.partition): [decode(line).run_id for line in ingest_events(r.value, r.headers)]
        for r in records
    }
    assert seen == {
        (b"parent", shard_for("parent", 8)): ["parent", "child", "grandchild"],
        (b"other", shard_for("other", 8)): ["other"],
    }


async def _fetch_until(consumer: Any, stop: Any, within: float = 20) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + within
    while not stop() and time.monotonic() < deadline:
        got += await consumer.fetch(block_ms=100)
    return got


@pytest.mark.slow
async def test_acks_are_committed_when_partitions_are_revoked(kafka_url: str, prefix: str) -> None:
    """Offsets are committed in the revoke callback (a commit after the partition moved fails). Acks not yet committed
    (a long commit interval) are committed when a rebalance takes partitions away, so
    the new owner does not get them again."""
    url = f"{kafka_url}?prefix={prefix}&shards=4&session_timeout_ms=2000&commit_interval_ms=600000"
    runs = [f"run-{i}" for i in range(16)]
    async with open_bus(url) as bus:
        await bus.publish([event(r, s) for r in runs for s in range(1, 4)])
        first = bus.consumer("g", "first")
        taken: list[Delivery] = []
        deadline = time.monotonic() + 20
        while len(taken) < 48 and time.monotonic() < deadline:
            taken += await first.fetch(block_ms=100)
        assert len(taken) == 48
        await first.ack(taken)  # acked, not committed yet (interval)

        second = bus.consumer("g", "second")
        redelivered: list[Delivery] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, fresh = await asyncio.gather(first.fetch(block_ms=100), second.fetch(block_ms=100))
            redelivered += fresh
            if second.owned_shards() and first.owned_shards():
                break
        assert second.owned_shards() and not first.owned_shards() & second.owned_shards()
        redelivered += await _fetch_until(second, lambda: False, within=1.5)
        await first.close()
        await second.close()
    assert redelivered == []


async def test_a_new_process_rebuilds_delivery_streams_from_the_topic(
    kafka_url: str, bootstrap: str, prefix: str
) -> None:
    """Resume from shared state, not from the process that wrote it: a bus opened later reads the retained
    delivery topic into its hot tier — events, bounds and writer state — and drops
    records a retried producer wrote twice (readers dedupe by seq)."""
    url = f"{kafka_url}?prefix={prefix}&shards=4"
    key = ("run-h", "raw")
    async with open_bus(url) as writer:
        await writer.append(key, [event("run-h", s) for s in range(1, 4)], state=b"three")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:  # a duplicate of seq 3, as a producer retry would write it, then seq 4
        for seq in (3, 4):
            await producer.send_and_wait(f"{prefix}.delivery", encode(event("run-h", seq)),
                                         key=b"run-h", partition=shard_for("run-h", 4),
                                         headers=[("v", b"raw")])
    finally:
        await producer.stop()
    async with open_bus(url) as reader:
        assert [e.seq for e in await reader.read(key, 0)] == [1, 2, 3, 4]
        assert await reader.bounds(key) == (1, 4)
        assert (await reader.load_states([key]))[0] == b"three"
        assert await reader.append(key, [event("run-h", s) for s in range(1, 6)]) == 1


@pytest.fixture
async def kafka_bus(kafka_url: str, prefix: str) -> AsyncIterator[Any]:
    async with open_bus(f"{kafka_url}?prefix={prefix}&shards=4") as bus:
        yield bus


async def test_state_record_follows_its_events_in_one_partition(
    kafka_bus: Any, bootstrap: str, prefix: str
) -> None:
    """An append is one record batch in the run's partition with the writer state last,
    so a state is never stored ahead of the events it accounts for."""
    await kafka_bus.append(("run-s", "shaped"), [event("run-s", 2), event("run-s", 5)], state=b"st")
    records = await read_topic(bootstrap, f"{prefix}.delivery", 4)
    assert {r.partition for r in records} == {shard_for("run-s", 4)}
    # the events as one record (one JSON per line, last seq and count in headers), then the state
    assert [dict(r.headers) for r in records] == [{"v": b"shaped", "q": b"5", "n": b"2"},
                                                  {"v": b"shaped", "k": b"s"}]
    assert [decode(line).seq for line in records[0].value.split(b"\n")] == [2, 5]
    assert records[1].value == b"st"


async def test_a_finished_runs_hot_stream_leaves_memory_after_the_grace(
    kafka_url: str, prefix: str
) -> None:
    """Invariant 7 on Kafka: the hot tier (process memory, fed by the delivery topic) holds a
    finished run's events for ``grace`` seconds after its terminal event, then only its last
    seq and writer state (resumes read the replay log); a run still going keeps its events."""
    from runwire.core.envelope import make

    url = f"{kafka_url}?prefix={prefix}&shards=4&grace=1"
    done, going = ("run-done", "raw"), ("run-going", "raw")
    async with open_bus(url) as bus:
        end = make("run.lifecycle", {"state": "done"}, id="evt_end", ts=event("run-done", 3).ts,
                   run_id="run-done", seq=3)
        await bus.append(done, [event("run-done", 1), event("run-done", 2), end], state=b"ended")
        await bus.append(going, [event("run-going", 1)], state=b"going")
        assert await bus.bounds(done) == (1, 3)
        async with asyncio.timeout(20):
            while True:
                if await bus.bounds(done) is None:
                    break
                await asyncio.sleep(0.1)
        assert await bus.read(done, 0) == []
        assert (await bus.load_states([done]))[0] == b"ended"  # a late or redelivered event is a duplicate
        assert await bus.append(done, [event("run-done", 2)]) == 0
        assert await bus.bounds(going) == (1, 1)
