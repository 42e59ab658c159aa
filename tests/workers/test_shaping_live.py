"""Koder agent stream §4 R1 on real Redis, as an agent produces it: alternating reasoning and text.

An SDK publisher streams a run that alternates reasoning and text deltas at ~1,000 deltas a second
for 2 s (a 4 ms pause every tenth event), alone or with three children streaming at once; a worker
shapes it. Then two real ``runwire worker`` processes share such runs and one is SIGKILLed: the
survivor replays the backlog by event time. Each time, every delivery stream's shaped view has at
most 10 shaped deltas a second per (child, type) between control events, every character of the
raw view once, spans that tile the seq space (§7 T2), and — when only event time closes windows —
exactly ``shape(raw)``.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runwire.bus import Bus, open_bus
from runwire.bus.keys import shard_for
from runwire.core.envelope import Event, format_ts, ts_ms
from runwire.processing.shaping import is_delta, shape
from runwire.sdk.publisher import Publisher
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.events import event
from tests.shaped_checks import as_dicts, max_per_second, r1_excess, t2_problems, texts
from tests.workers.checks import read_all
from tests.workers.test_crash import kill_all, start_worker, wait_sharing


def assert_shaped_view(run_id: str, raw: list[Event], shaped: list[Event]) -> None:
    got, want = as_dicts(shaped), as_dicts(raw)
    assert r1_excess(got) == [], (run_id, max_per_second(got))
    assert texts(got) == texts(want), run_id
    assert [e.id for e in shaped if not is_delta(e)] == [e.id for e in raw if not is_delta(e)]
    assert t2_problems(got) == [], run_id


async def stream_alternating(publisher: Publisher, root_id: str, children: int,
                             seconds: float = 2.0, rate: int = 1000) -> None:
    """The run (and ``children`` children) alternate reasoning and text, ~``rate`` deltas/s in all."""
    root = publisher.run(root_id)
    await root.emit("run.lifecycle", {"state": "running"})
    kids = []
    for index in range(children):
        await root.emit("child.spawn", {"child_id": f"{root_id}.c{index}"})
        kids.append(publisher.run(f"{root_id}.c{index}", parent=root))
    sources = [root, *kids]
    started = time.monotonic()
    for index in range(int(seconds * rate)):
        source = sources[index % len(sources)]
        kind = "reasoning.delta" if (index // len(sources)) % 2 else "text.delta"
        await source.emit(kind, {"text": f"{index};"})
        if index % 10 == 9:  # keep to the rate, pausing at least 4 ms every tenth event
            await asyncio.sleep(max(0.004, started + (index + 1) / rate - time.monotonic()))
    for kid in kids:
        await kid.finish()
    await root.finish()


async def wait_ended(bus: Bus, run_ids: list[str], within: float = 60) -> None:
    """Until each run's own raw stream has its terminal event."""
    async with asyncio.timeout(within):
        for run_id in run_ids:
            while True:
                bounds = await bus.bounds((run_id, "raw"))
                if bounds:
                    last = await bus.read((run_id, "raw"), bounds[1] - 1, limit=1)
                    if last and last[0].type == "run.lifecycle" and last[0].child_id is None and \
                            last[0].payload_dict()["state"] == "done":
                        break
                await asyncio.sleep(0.05)


async def wait_delivered(bus: Bus, run_ids: list[str], count: int, within: float = 60) -> None:
    """Until each run's raw stream has ``count`` events."""
    async with asyncio.timeout(within):
        for run_id in run_ids:
            while True:
                bounds = await bus.bounds((run_id, "raw"))
                if bounds and bounds[1] >= count:
                    break
                await asyncio.sleep(0.02)


@pytest.mark.parametrize("children", [0, 3])
async def test_r1_an_sdk_run_alternating_reasoning_and_text_at_1000_deltas_a_second(
    redis_bus: Bus, store: ReplayLog, children: int
) -> None:
    """Alone, and with three children streaming at once: ≤ 10 shaped deltas a second per type,
    every character kept, in the parent's stream and in each child's own."""
    root_id = f"alt-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(redis_bus, store, group="alt", name="w1", stop=stop))
    try:
        async with Publisher(redis_bus) as publisher:
            await stream_alternating(publisher, root_id, children)
        run_ids = [root_id] + [f"{root_id}.c{i}" for i in range(children)]
        await wait_ended(redis_bus, run_ids)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    for run_id in run_ids:
        raw = await read_all(redis_bus, run_id)
        shaped = await redis_bus.read((run_id, "shaped"), 0, limit=100_000)
        assert_shaped_view(run_id, raw, shaped)
    raw = await read_all(redis_bus, root_id)
    shaped = await redis_bus.read((root_id, "shaped"), 0, limit=100_000)
    deltas = sum(is_delta(e) for e in raw)
    assert deltas == 2000
    # ~10 a second per type and source over the seconds the deltas' own times span (2 s when the
    # publisher keeps to its rate; more on a loaded machine, whose publisher falls behind it)
    times = [ts_ms(e.ts) for e in raw if is_delta(e)]
    seconds = (max(times) - min(times)) / 1000
    assert sum(is_delta(e) for e in shaped) <= (children + 1) * 2 * (10 * seconds + 5)
    assert max_per_second(as_dicts(shaped)) <= 10


def alternating_tree(root: str, children: int, deltas: int, base: datetime) -> list[Event]:
    """Published events of one tree whose sources alternate reasoning and text, 1 ms apart in
    event time (1,000 deltas/s) from ``base``."""
    seqs: dict[str, int] = {}

    def make(run_id: str, kind: str, payload: dict[str, Any], ms: float) -> Event:
        seqs[run_id] = seqs.get(run_id, 0) + 1
        links = {} if run_id == root else {"parent_id": root, "root_id": root}
        return event(run_id, seqs[run_id], kind, payload,
                     ts=format_ts(base + timedelta(milliseconds=ms)), **links)

    kids = [f"{root}.c{i}" for i in range(children)]
    tree = [make(root, "run.lifecycle", {"state": "running"}, 0)]
    tree += [make(root, "child.spawn", {"child_id": kid}, 0) for kid in kids]
    sources = [root, *kids]
    for index in range(deltas):
        run_id = sources[index % len(sources)]
        kind = "reasoning.delta" if (index // len(sources)) % 2 else "text.delta"
        tree.append(make(run_id, kind, {"text": f"{run_id[-3:]}:{index};"}, 1 + index))
    tree += [make(kid, "run.lifecycle", {"state": "done"}, deltas + 2) for kid in kids]
    tree.append(make(root, "run.lifecycle", {"state": "done"}, deltas + 3))
    return tree


def alternating_trees(prefix: str, runs: int, children: int, deltas: int) -> list[list[Event]]:
    """:func:`alternating_tree` ``runs`` times, on as many shards of 8, from now."""
    base = datetime.now(UTC)
    roots: dict[int, str] = {}
    for number in range(1000):
        roots.setdefault(shard_for(f"{prefix}t{number}", 8), f"{prefix}t{number}")
        if len(roots) == runs:
            break
    return [alternating_tree(root, children, deltas, base) for root in roots.values()]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["redis", "kafka"])
async def test_r1_and_t2_hold_when_a_worker_is_sigkilled_mid_run_and_its_backlog_is_replayed(
    backend: str, postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two ``runwire worker`` processes share six runs (a root and three children streaming
    at once, alternating types, 2,000 deltas over 2 s of event time each); one is SIGKILLed
    mid-run. The survivor restores its checkpoints (open and held windows; on Kafka from the
    faust table's changelog) and replays the unacked backlog by event time: every stream's
    shaped view is exactly ``shape(raw)``, with R1 and T2 holding and every character once."""
    prefix = f"k{uuid.uuid4().hex[:8]}"
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        bus_url = f"{url}{'&' if '?' in url else '?'}prefix={prefix}&lease_ms=2000"
    else:
        url = request.getfixturevalue("kafka_url")
        bus_url = f"{url}?prefix={prefix}&session_timeout_ms=2000&shards=8"
    trees = alternating_trees(prefix, runs=6, children=3, deltas=2000)
    group = "alt" if backend == "redis" else f"{prefix}-g"
    # only event time closes windows here (a quiet stream's tick would cut where shape() does not)
    workers = [start_worker(bus_url, postgres_url, f"w{i}", tmp_path, group, "--quiet-ms", "600000")
               for i in range(2)]
    try:
        async with open_bus(bus_url) as bus, open_store(postgres_url) as store:
            await wait_sharing(tmp_path, ["w0", "w1"], timeout_s=40)
            longest = max(len(tree) for tree in trees)
            for offset in range(0, longest, 100):
                await bus.publish([e for tree in trees for e in tree[offset : offset + 100]])
                if offset == 1000:  # every run is half-published and half-shaped: kill a worker
                    await wait_delivered(bus, [tree[0].run_id for tree in trees], 500)
                    workers[0].send_signal(signal.SIGKILL)
                    assert workers[0].wait(5) == -signal.SIGKILL
                await asyncio.sleep(0.02)
            roots = [tree[0].run_id for tree in trees]
            await wait_ended(bus, roots, within=90)
            workers[1].send_signal(signal.SIGTERM)
            assert workers[1].wait(15) == 0, (tmp_path / "w1.log").read_text()
            survivor_log = (tmp_path / "w1.log").read_text()
            if backend == "redis":
                survivor = msgspec.json.decode(survivor_log.splitlines()[-1])
                total = sum(len(tree) for tree in trees)
                assert 0 < survivor["entries"] < total, "both workers must have done part of the work"
            else:  # the runs are on six of the eight partitions: both workers had some of them
                assert "w1 owns shards [0, 1, 2, 3, 4, 5, 6, 7]" in survivor_log.split("owns shards", 1)[1]
            for tree in trees:
                for run_id in dict.fromkeys(e.run_id for e in tree):
                    raw = await read_all(bus, run_id)
                    assert [e.seq for e in raw] == list(range(1, len(raw) + 1)), run_id
                    assert len({e.id for e in raw}) == len(raw), run_id
                    shaped = await bus.read((run_id, "shaped"), 0, limit=100_000)
                    assert shaped == shape(raw), run_id
                    assert_shaped_view(run_id, raw, shaped)
                    assert [(e.seq, e.id) for e in await store.read(run_id)] == [(e.seq, e.id) for e in raw]
    finally:
        kill_all(workers)
