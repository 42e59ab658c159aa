"""The network between a worker and Redis cut for a few seconds, longer than the lease.

Two ``runwire worker`` processes share the shards; one runs in a network namespace of the
test's own (``tests/workers/netns.py``) whose only link to Redis is a veth pair the test takes
down for 4 s while events are being published, with ``lease_ms=1500``. The cut-off worker's
leases expire, the other takes its shards over (its pending entries after ``claim_idle_ms``),
and when the link is back the first worker finds its leases lost, drops what it held and
takes its share back. Every event is in the replay log and on the hot tier once, in order, and
both processes are still running.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwire.bus import StreamKey, open_bus
from runwire.core.envelope import Event
from runwire.store import open_store
from tests.events import event
from tests.services import RedisServer
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, read_all, run_tree
from tests.workers.netns import HINT, NetNs

WORKER = [sys.executable, "-c", "from runwire.workers.cli import main; main()", "worker"]
OPTIONS = "shards=4&lease_ms=1500&claim_idle_ms=3000&prefix=net"


@pytest.fixture
def netns() -> Iterator[NetNs]:
    assert os.geteuid() == 0, HINT
    with NetNs() as ns:
        yield ns


@pytest.fixture
def redis_on_both(netns: NetNs) -> Iterator[RedisServer]:
    """A Redis listening on loopback and on the host's end of the namespace's veth."""
    server = RedisServer("--bind", "127.0.0.1", netns.host_ip)
    server.start()
    try:
        yield server
    finally:
        server.close()


def trees(count: int, deltas: int) -> tuple[list[list[Event]], dict[str, list[str]]]:
    """``count`` run trees (spread over the shards), their events each in publish order."""
    tag = uuid.uuid4().hex[:6]
    all_events: list[list[Event]] = []
    ancestry: dict[str, list[str]] = {}
    for index in range(count):
        events, tree = run_tree(f"n{tag}{index}", deltas=deltas)
        all_events.append(events)
        ancestry |= tree
    return all_events, ancestry


@pytest.fixture
def workers(netns: NetNs, redis_on_both: RedisServer, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker ``w0`` in the namespace (Redis at the host's veth address), ``w1`` on the host;
    their logs ``w0.log``, ``w1.log`` in ``tmp_path``; stopped (SIGTERM, then SIGKILL) after."""
    procs = []
    for n in range(2):
        with (tmp_path / f"w{n}.log").open("w") as log:
            procs.append(subprocess.Popen(
                (netns.command(*WORKER) if n == 0 else WORKER)
                + ["--bus", bus_url(netns, redis_on_both, n), "--store", f"sqlite:///{tmp_path / 'replay.db'}",
                   "--name", f"w{n}", "--data-dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=log))
    try:
        yield procs
    finally:
        _stop(procs)


def bus_url(netns: NetNs, redis: RedisServer, worker: int) -> str:
    host = netns.host_ip if worker == 0 else "127.0.0.1"
    return f"redis://{host}:{redis.port}/0?{OPTIONS}"


@pytest.mark.slow
async def test_a_worker_cut_off_from_redis_longer_than_its_lease_loses_nothing(
    netns: NetNs, redis_on_both: RedisServer, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    db = tmp_path / "replay.db"
    store_url = f"sqlite:///{db}"
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    urls = [bus_url(netns, redis_on_both, n) for n in range(2)]
    per_tree, ancestry = trees(8, deltas=120)
    halves = [[e for events in per_tree for e in events[: len(events) // 2]],
              [e for events in per_tree for e in events[len(events) // 2:]]]
    async with open_bus(urls[1]) as bus, open_store(store_url) as store:
        await until(lambda: [owned(log) for log in logs] == [{0, 2}, {1, 3}], within=60,
                    what="each worker owns its half of the shards")
        await bus.publish(halves[0][: len(halves[0]) // 2])
        await until(lambda: store.runs(limit=1), within=30, what="the workers write to the log")
        netns.cut()
        cut = time.monotonic()
        try:
            await bus.publish(halves[0][len(halves[0]) // 2:])
            await until(lambda: owned(logs[1]) == {0, 1, 2, 3}, within=15,
                        what="the other worker takes every shard over")
            took_over = time.monotonic() - cut
            await bus.publish(halves[1][: len(halves[1]) // 2])
            await asyncio.sleep(max(0.0, 4 - (time.monotonic() - cut)))  # the cut lasts 4 s
        finally:
            netns.heal()
        await bus.publish(halves[1][len(halves[1]) // 2:])

        async def all_ended() -> bool:
            infos = await store.runs_by_id(list(ancestry))
            return len(infos) == len(ancestry) and all(i.terminal for i in infos.values())

        await until(all_ended, within=90, what="every run ended in the log")
        await until(lambda: "lost shards" in logs[0].read_text(), within=15,
                    what="the cut-off worker notices its leases are gone")
        await until(lambda: [owned(log) for log in logs] == [{0, 2}, {1, 3}], within=30,
                    what="the cut-off worker takes its half back")
        for events in per_tree:
            tree = {e.run_id for e in events}
            await assert_delivered_exactly_once(bus, store, events,
                                                {r: a for r, a in ancestry.items() if r in tree})
    assert took_over < 1500 / 1000 + 3, f"takeover took {took_over:.1f}s"
    assert [w.poll() for w in workers] == [None, None], [log.read_text()[-2000:] for log in logs]
    assert not any("Traceback" in log.read_text() for log in logs)


async def test_a_late_append_from_a_writer_that_lost_its_lease_keeps_the_newer_checkpoint(
    own_redis: RedisServer,
) -> None:
    """A worker cut off mid-append has its write land after the link is back, when the shard's
    new owner has already written past it: its events are dropped (appends are idempotent on
    seq) and so must its checkpoint be — else whoever loads the stream next (the first worker,
    given the shard back) continues from the older seq and its events collide with the newer
    owner's (dropped as already there: lost)."""
    key: StreamKey = ("run-late", "raw")
    async with open_bus(own_redis.url) as bus:
        assert await bus.append(key, [event("run-late", s) for s in range(1, 6)], state=b"s5") == 5
        assert await bus.append(key, [event("run-late", s) for s in range(6, 9)], state=b"s8") == 3
        assert await bus.append(key, [event("run-late", s) for s in range(4, 6)], state=b"s5") == 0  # the late one
        assert (await bus.load_states([key]))[0] == b"s8"
        assert await bus.append(key, [event("run-late", s) for s in range(6, 9)], state=b"s8'") == 0  # a redo
        assert (await bus.load_states([key]))[0] == b"s8'"
        assert await bus.append(key, [], state=b"tick") == 0  # state only (a tick closing windows)
        assert (await bus.load_states([key]))[0] == b"tick"


async def test_a_lease_lost_and_taken_back_between_two_looks_is_still_told(own_redis: RedisServer) -> None:
    """A consumer whose leases expired (held by another member meanwhile) and that took them
    back before its worker looked again owns the same shards as before: ``shard_losses``
    tells the worker that what it holds in memory for them may be behind."""
    from redis.asyncio import Redis

    from runwire.bus import keys

    url = f"{own_redis.url}?shards=2&lease_ms=600&prefix=lease"
    admin = Redis.from_url(own_redis.url)
    async with open_bus(url) as bus:
        consumer = bus.consumer("g", "w0")
        try:
            await consumer.fetch(block_ms=10)
            assert consumer.owned_shards() == {0, 1} and consumer.shard_losses == 0
            leases = [keys.lease_key("lease", "g", shard) for shard in (0, 1)]
            for lease in leases:  # another member holds them (as after this one's expired)
                await admin.set(lease, "w1", px=60_000)
            await until(lambda: not consumer.owned_shards(), within=10, what="the leases found lost")
            await admin.delete(*leases)

            async def taken_back() -> bool:
                await consumer.fetch(block_ms=10)
                return consumer.owned_shards() == {0, 1}

            await until(taken_back, within=10, what="the leases taken back")
            assert consumer.shard_losses >= 1
        finally:
            await consumer.close()
            await admin.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(("delay_s", "stall_p"), [(0.2, 0.0), (0.0, 0.05)], ids=["200ms", "5%-lost"])
async def test_workers_behind_a_slow_or_lossy_link_lose_double_and_reorder_nothing(
    own_redis: RedisServer, tmp_path: Path, delay_s: float, stall_p: float
) -> None:
    """Two `runwire worker`s reach Redis only through a TCP proxy that delays every chunk 200 ms
    each way, or holds 5 % of the chunks 200 ms longer (a lost segment's retransmission: this
    kernel has no ``sch_netem``), while runs are published straight to Redis: every event is in
    the replay log and on the hot tier once, in order, and both workers are still running."""
    from tests.workers.netns import DelayProxy

    store_url = f"sqlite:///{tmp_path / 'replay.db'}"
    per_tree, ancestry = trees(4, deltas=60)
    with DelayProxy(own_redis.port, delay_s=delay_s, stall_p=stall_p, stall_s=0.2) as proxy:
        procs = _spawn(f"redis://127.0.0.1:{proxy.port}/0?{OPTIONS}", store_url, tmp_path)
        try:
            async with open_bus(f"{own_redis.url}?{OPTIONS}") as bus, open_store(store_url) as store:
                for index in range(0, max(len(e) for e in per_tree), 20):
                    await bus.publish([e for events in per_tree for e in events[index:index + 20]])

                async def all_ended() -> bool:
                    infos = await store.runs_by_id(list(ancestry))
                    return len(infos) == len(ancestry) and all(i.terminal for i in infos.values())

                await until(all_ended, within=120, what="every run ended in the log")

                async def hot_ended() -> bool:  # the log is written first, the delivery streams after
                    for events in per_tree:
                        raw = await read_all(bus, events[-1].run_id)
                        if not raw or raw[-1].id != events[-1].id:
                            return False
                    return True

                await until(hot_ended, within=60, what="every root stream ended on the hot tier")
                for events in per_tree:
                    tree = {e.run_id for e in events}
                    await assert_delivered_exactly_once(bus, store, events,
                                                        {r: a for r, a in ancestry.items() if r in tree})
            logs = [(tmp_path / f"w{n}.log").read_text() for n in range(2)]
            assert [p.poll() for p in procs] == [None, None], [log[-2000:] for log in logs]
            assert proxy.chunks > 0 and (stall_p == 0 or proxy.stalls > 0)
        finally:
            _stop(procs)


def _spawn(bus_url: str, store_url: str, tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    """Workers ``w0`` and ``w1`` on the host, their logs ``w0.log``, ``w1.log`` in ``tmp_path``."""
    procs = []
    for n in range(2):
        with (tmp_path / f"w{n}.log").open("w") as log:
            procs.append(subprocess.Popen(
                WORKER + ["--bus", bus_url, "--store", store_url, "--name", f"w{n}",
                          "--data-dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=log))
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def owned(log: Path) -> set[int]:
    """The shards a worker's log says it owns now (its ``owns shards`` and ``lost shards`` lines)."""
    shards: set[int] = set()
    for line in log.read_text().splitlines():
        found = re.search(r" (owns|lost) shards \[([0-9, ]*)\]", line)
        if found:
            named = {int(s) for s in found[2].split(",") if s.strip()}
            shards = named if found[1] == "owns" else shards - named
    return shards
