"""Scaling and crashes: real ``runwire worker`` processes share the shards; one is SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runwire.bus import Bus, open_bus
from runwire.bus.keys import shard_for
from runwire.core.envelope import Event
from runwire.store import open_store
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, read_all, run_tree

RUNWIRE = str(Path(sys.executable).parent / "runwire")


def start_worker(
    bus_url: str, store_url: str, name: str, log_dir: Path, group: str = "crash", *extra: str
) -> subprocess.Popen[bytes]:
    """A real ``runwire worker`` process, its output in ``<log_dir>/<name>.log``."""
    with open(log_dir / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [RUNWIRE, "worker", "--bus", bus_url, "--store", store_url, "--group", group,
             "--name", name, "--claim-idle-ms", "1500", "--silence", "600", *extra],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


OWNERSHIP = re.compile(r"^.* (owns|lost) shards \[([\d, ]*)\]", re.M)


def owned_shards(log_dir: Path, name: str) -> set[int]:
    """The shards a worker owns as its log tells (each ``owns`` line names all it owns then)."""
    owned: set[int] = set()
    for change, listed in OWNERSHIP.findall((log_dir / f"{name}.log").read_text()):
        shards = {int(s) for s in listed.split(",") if s.strip()}
        owned = shards if change == "owns" else owned - shards
    return owned


async def wait_sharing(
    log_dir: Path, names: list[str], timeout_s: float = 30, *, shards: int | None = None
) -> None:
    """Until every worker owns shards (they have joined the group); with ``shards``, until
    their shares split every one of the ``shards`` among them (the group has settled)."""

    def sharing() -> bool:
        owned = [owned_shards(log_dir, name) for name in names]
        if shards is None:
            return all(owned)
        return all(owned) and sorted(s for share in owned for s in share) == list(range(shards))

    await until(sharing, within=timeout_s, what=f"{names} sharing the shards")


async def until_working(bus: Bus, log_dir: Path, name: str, roots: list[str]) -> None:
    """Until worker ``name`` has written the delivery stream of a root run on one of its shards."""
    mine = [r for r in roots if shard_for(r, bus.shards) in owned_shards(log_dir, name)]
    assert mine, f"{name} owns none of the runs' shards"

    async def working() -> bool:
        return any([await bus.bounds((root, "raw")) is not None for root in mine])

    await until(working, what=f"{name} writing")


def kill_all(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL the workers still running (a test's clean-up)."""
    for proc in workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


async def kill_mid_load(
    bus: Bus, workers: list[subprocess.Popen[bytes]], log_dir: Path, names: list[str],
    trees: list[tuple[list[Event], Any]], *, pause_s: float, finish_s: float,
) -> None:
    """Publish the trees (``names``, ``run_tree``'s) while the workers run, SIGKILL the first
    once it is writing, in the middle of many runs; return when every tree has finished."""
    roots = [f"{name}_root" for name in names]
    publishing = asyncio.create_task(
        publish_trees(bus, [events for events, _ in trees], per_step=1, pause_s=pause_s)
    )
    await until_working(bus, log_dir, "w0", roots)
    assert not publishing.done()
    workers[0].send_signal(signal.SIGKILL)
    assert workers[0].wait(5) == -signal.SIGKILL
    await publishing
    await wait_finished(bus, roots, finish_s)


async def publish_trees(
    bus: Bus, trees: list[list[Event]], per_step: int = 2, pause_s: float = 0.05
) -> None:
    """Publish the trees a few at a time, interleaved, like many agents running at once."""
    for start in range(0, len(trees), per_step):
        batch = trees[start : start + per_step]
        longest = max(len(events) for events in batch)
        for offset in range(0, longest, 20):
            await bus.publish([e for events in batch for e in events[offset : offset + 20]])
        await asyncio.sleep(pause_s)


async def wait_finished(bus: Bus, roots: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(roots)
    while pending and time.monotonic() < deadline:
        for root in list(pending):
            raw = await read_all(bus, root)
            if any(e.type == "run.lifecycle" and e.child_id is None for e in raw[-6:]):
                pending.discard(root)
        await asyncio.sleep(0.2)
    details = {root: [(e.seq, e.type, e.child_id) for e in (await read_all(bus, root))[-3:]]
               for root in pending}
    assert not pending, f"{len(pending)} runs never finished: {details}"


@pytest.mark.slow
async def test_sigkill_one_redis_worker_the_survivor_takes_over_exactly_once(
    redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """SIGKILL one worker in the middle of many runs; the survivor takes over and every
    published event is in the delivery streams and the replay log exactly once, in order; the
    shaped view still holds Koder agent stream §4 R1/R3."""
    prefix = f"k{uuid.uuid4().hex[:8]}"
    bus_url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}&lease_ms=2000"
    trees = [run_tree(f"{prefix}t{i}", deltas=20) for i in range(24)]
    workers = [start_worker(bus_url, postgres_url, f"w{i}", tmp_path) for i in range(2)]
    try:
        async with open_bus(bus_url) as bus, open_store(postgres_url) as store:
            await wait_sharing(tmp_path, ["w0", "w1"])
            await kill_mid_load(bus, workers, tmp_path, [f"{prefix}t{i}" for i in range(24)], trees,
                                pause_s=0.15, finish_s=45)
            workers[1].send_signal(signal.SIGTERM)
            assert workers[1].wait(15) == 0, (tmp_path / "w1.log").read_text()
            survivor = msgspec.json.decode((tmp_path / "w1.log").read_bytes().splitlines()[-1])
            total = sum(len(events) for events, _ in trees)
            assert 0 < survivor["entries"] < total, "both workers must have done part of the work"
            for events, ancestry in trees:
                await assert_delivered_exactly_once(bus, store, events, ancestry, exact_shape=False)
    finally:
        kill_all(workers)
