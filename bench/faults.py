"""Faults runwire survives, each driven on real services and checked event by event.

Run: ``.venv/bin/python bench/faults.py [--runs 300] [--deltas 400] [--json]``

Each scenario starts what it needs on free ports (a ``redis-server`` of its own, ``runwire
worker`` processes, publisher processes using the SDK), drives the fault, then reads every
run back from the replay log and counts, per run, the deltas missing, doubled or out of
order against what the publishers' ``emit`` calls returned. It prints one row per scenario:
what happened, the recovery time measured, and what was lost. ``docs/operations.md`` § What
runwire survives has the latest table.

Scenarios so far:

* ``redis-maxmemory`` — Redis at ``--maxmemory`` (30mb, ``noeviction``) with two workers and
  two publishers (``--runs`` runs × ``--deltas`` deltas in all, ``delivery_timeout=600``);
  memory is raised after ``--full-s`` seconds. Recovery: from raising memory to the last run
  ended in the replay log. The row says how many pauses the processes logged (a row with none
  did not reach the limit: lower ``--maxmemory``).
* ``edge-kill`` — an edge SIGKILLed under ``--clients`` live streaming clients (2,000; EventSource
  with ``Last-Event-ID``, Durable Streams ``live=sse`` with its offset, the AI SDK UI-message
  stream, in turn, in two client processes: ``tests/edge/resuming_clients.py``) spread over the
  runs on edge A, ``--kill-after`` seconds after each has an event; every client moves to edge B
  and resumes with its cursor. Recovery: from the kill to each client's next event from B (p50,
  p99, max); each client's seqs are checked against the replay log (missing, repeated, out of
  order). Give ``--round-pause`` so the runs are still going at the kill.
* ``postgres-restart``, ``postgres-down-30s`` — the replay log on a PostgreSQL of the scenario's
  own (``synchronous_commit`` on), stopped with ``pg_ctl stop -m immediate`` ``--restart-after``
  seconds after the workers' first write and started again 2 s (30 s) later, under two workers on
  Redis, SDK publishers still publishing (``--round-pause``) and an edge asked while it is down
  (``/readyz``; a resume the hot tier covers). Recovery: from PostgreSQL back to the workers'
  ``resumed after`` lines and to every run ended; then the replay log and a resuming client are
  tallied.
* ``postgres-disk-full`` — the PostgreSQL replay log's filesystem (its whole cluster on a 96 MiB
  tmpfs; root) filled up ``--restart-after`` seconds after the workers' first write and given
  room ``--full-s`` seconds later, two workers on Redis, SDK publishers still publishing, an edge
  and the workers' ``runwire_worker_paused`` asked while it is full.
* ``clock-skew`` — publishers whose clocks are 5 minutes ahead and behind the workers'; adds the
  shaped views' R1 and whether each shaped view's text is its raw text.
* ``sqlite-disk-full`` — the SQLite replay log's filesystem (a 2 MiB tmpfs; mounting needs root)
  filled up ``--restart-after`` seconds in and given room ``--full-s`` seconds later.
* ``net-latency``, ``net-loss``, ``net-partition`` — the network between the workers and Redis
  (``tests/workers/netns.py``): +200 ms each way for every worker (a TCP proxy), 5 % of the
  proxy's chunks held a retransmission (200 ms) longer (this kernel has no ``sch_netem``: no
  packet is really dropped), or worker 0 run in a network namespace whose veth is taken down
  for 10 s ``--restart-after`` seconds after the first write while the other worker is fine
  (bus ``lease_ms=3000&claim_idle_ms=6000``; needs root). Besides the tally: publish→log
  latency of probe runs published every 0.25 s (p50, p99, max; during the cut), and the
  takeovers the worker logs show (``lost the leases``, ``owns shards``, seconds after the cut
  or the heal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import import_code

import_code()

from runwire.store import open_store  # noqa: E402 - the tree import_code() names

RUNWIRE = [sys.executable, "-c", "from runwire.workers.cli import main; main()"]

PUBLISHER = r'''
import asyncio, sys, time
if len(sys.argv) > 6:  # this publisher's clock is off by that many seconds
    _real_time, _skew = time.time, float(sys.argv[6])
    time.time = lambda: _real_time() + _skew
from runwire import Publisher

async def main(url: str, first: int, count: int, deltas: int, pause: float) -> None:
    async with Publisher.connect(url, delivery_timeout=600) as pub:
        runs = [pub.run(f"fault-{i}") for i in range(first, first + count)]
        for run in runs:
            await run.emit("run.lifecycle", {"state": "running"})
        for k in range(deltas):
            sys.stderr.write(f"round {k} {time.monotonic()}\n")  # CLOCK_MONOTONIC: one per machine
            for run in runs:
                await run.emit("text.delta", {"text": f"d{k} "})
            if pause:
                await asyncio.sleep(pause)
        for run in runs:
            await run.finish()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])))
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_cli(port: int, *args: str) -> None:
    subprocess.run(["redis-cli", "-p", str(port), *args], check=True, stdout=subprocess.DEVNULL)


def ended_runs(db: Path | str, runs: int) -> int:
    """Runs whose terminal event is in the replay log (a SQLite file, or a store URL)."""
    async def count() -> int:
        async with open_store(db if isinstance(db, str) else f"sqlite:///{db}") as store:
            infos = [await store.run(f"fault-{index}") for index in range(runs)]
        return sum(1 for info in infos if info is not None and info.terminal)

    return asyncio.run(count()) if isinstance(db, str) or db.exists() else 0


def tally(db: Path | str, runs: int, deltas: int) -> dict[str, int]:
    """Deltas missing, doubled and out of order, over every run, from the replay log (a SQLite
    file, or a store URL)."""
    expected = [f"d{k} " for k in range(deltas)]

    async def read() -> list[list[str]]:
        async with open_store(db if isinstance(db, str) else f"sqlite:///{db}") as store:
            return [[e.payload.text for e in await store.read(f"fault-{index}", 0, None)  # type: ignore[attr-defined]
                     if e.type == "text.delta" and not e.child_id] for index in range(runs)]

    missing = doubled = disordered = 0
    for texts in asyncio.run(read()):
        missing += len(set(expected) - set(texts))
        doubled += len(texts) - len(set(texts))
        disordered += int([t for t in expected if t in set(texts)] != list(dict.fromkeys(texts)))
    return {"missing": missing, "doubled": doubled, "runs_out_of_order": disordered}


def start_publishers(url: str, work: Path, args: argparse.Namespace, share: int,
                     skews: Sequence[float] = ()) -> list[subprocess.Popen[bytes]]:
    """``--publishers`` SDK publisher processes, ``share`` runs each (``skews``: their clocks' offsets
    in seconds, in turn), their stderr in ``work/publisher<n>.log``."""
    return [subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, url, str(p * share), str(share), str(args.deltas), str(args.round_pause),
         *([str(skews[p % len(skews)])] if skews else [])],
        cwd=work, stderr=open(work / f"publisher{p}.log", "w")) for p in range(args.publishers)]


def stop_processes(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running, then wait for each (30 s, then SIGKILL)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def leave(work: Path, *, keep: bool) -> None:
    """Remove a scenario's directory, or say where it is kept (``--keep``)."""
    if keep:
        print(f"kept {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


def start_redis(port: int, work: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--dir", str(work), *extra], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not listen on {port}")


class Pipe:
    """One Redis, ``--workers`` workers and ``--publishers`` publishers on a scratch directory; the
    replay log a SQLite file there, or ``store_url``."""

    def __init__(self, args: argparse.Namespace, *redis_args: str, store_url: str | None = None,
                 skews: Sequence[float] = (), worker_args: Callable[[int], list[str]] = lambda n: []) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="runwire-fault-"))
        self.port = free_port()
        self.redis_args = redis_args
        self.redis = start_redis(self.port, self.work, *redis_args)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.db = self.work / "replay.db"
        self.log: Path | str = store_url or self.db
        """What :func:`tally` and :func:`ended_runs` read."""
        self.store = store_url or f"sqlite:///{self.db}"
        self.workers = [subprocess.Popen(
            [*RUNWIRE, "worker", "--bus", self.url, "--store", self.store, "--name", f"w{n}",
             "--data-dir", str(self.work), *worker_args(n)], cwd=self.work, stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"worker{n}.log", "w")) for n in range(args.workers)]
        self.publishing_at_restart = 0
        self.share = args.runs // args.publishers
        self.total = self.share * args.publishers
        self.publishers = start_publishers(self.url, self.work, args, self.share, skews)

    def restart_redis(self, down_s: float) -> None:
        """SIGKILL Redis (no shutdown save) and start it again on the same port after ``down_s``."""
        self.publishing_at_restart = sum(p.poll() is None for p in self.publishers)
        self.redis.kill()
        self.redis.wait()
        time.sleep(down_s)
        self.redis = start_redis(self.port, self.work, *self.redis_args)

    def finish(self, fault: str, since: float) -> dict[str, Any]:
        """Wait for the publishers and every run's end; the row, with recovery counted from ``since``."""
        codes = [p.wait(timeout=900) for p in self.publishers]
        deadline = time.monotonic() + 600
        while ended_runs(self.log, self.total) < self.total and time.monotonic() < deadline:
            time.sleep(0.5)
        recovery = time.monotonic() - since
        counts = tally(self.log, self.total, self.args.deltas)
        logs = {kind: " ".join(path.read_text() for path in self.work.glob(f"{kind}*.log"))
                for kind in ("publisher", "worker")}
        return {"fault": fault, "publishers_exit": codes, "runs": self.total,
                "ended": ended_runs(self.log, self.total), "events_published": self.total * (self.args.deltas + 2),
                "recovery_s": round(recovery, 1), **counts,
                **resumed_tally(self.url, self.total, self.args.deltas),
                "publisher_pauses": logs["publisher"].count("paused:"),
                "worker_pauses": logs["worker"].count("paused:"),
                "republished_logged": logs["publisher"].count("published them again"),
                "checkpoints_from_log_logged": logs["worker"].count("without a checkpoint on the bus"),
                "publishers_running_at_restart": self.publishing_at_restart,
                "workers_alive": sum(p.poll() is None for p in self.workers)}

    def close(self) -> None:
        stop_processes(self.workers + self.publishers)
        self.redis.kill()
        self.redis.wait()
        leave(self.work, keep=self.args.keep)


def redis_maxmemory(args: argparse.Namespace) -> dict[str, Any]:
    pipe = Pipe(args, "--appendonly", "no", "--maxmemory", args.maxmemory, "--maxmemory-policy", "noeviction")
    try:
        time.sleep(args.full_s)
        redis_cli(pipe.port, "config", "set", "maxmemory", "0")
        return pipe.finish("redis-maxmemory", time.monotonic())
    finally:
        pipe.close()


def redis_restart(persistence: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """Redis SIGKILLed ``--restart-after`` seconds in and started again ``--down-s`` later."""
    redis_args = (("--appendonly", "yes", "--appendfsync", "everysec") if persistence == "aof"
                  else ("--appendonly", "no"))

    def scenario(args: argparse.Namespace) -> dict[str, Any]:
        pipe = Pipe(args, *redis_args)
        try:
            time.sleep(args.restart_after)
            pipe.restart_redis(args.down_s)
            return pipe.finish(f"redis-restart-{persistence}", time.monotonic())
        finally:
            pipe.close()

    return scenario


def clock_skew(args: argparse.Namespace) -> dict[str, Any]:
    """Publishers whose clocks are 5 minutes ahead and behind the workers' (every other one):
    the row adds the shaped views' R1 (most shaped deltas of a run in one second of event time)
    and how long a run's last words took to be shaped after its last delta was published."""
    pipe = Pipe(args, "--appendonly", "no", skews=(300.0, -300.0))
    try:
        row = pipe.finish("clock-skew", time.monotonic())
        row |= shaped_r1(pipe.url, pipe.total)
        return row
    finally:
        pipe.close()


def shaped_r1(url: str, runs: int) -> dict[str, Any]:
    """The shaped views of the runs: the most shaped text deltas in one second of event time
    (Koder agent stream §4 R1: at most 10), and whether every view's text is its raw text."""
    from runwire.bus import open_bus

    async def read() -> dict[str, Any]:
        worst, whole = 0, 0
        async with open_bus(url) as bus:
            for index in range(runs):
                raw = await bus.read((f"fault-{index}", "raw"), 0, limit=100_000)
                shaped = await bus.read((f"fault-{index}", "shaped"), 0, limit=100_000)
                per_second: dict[str, int] = {}
                for event in shaped:
                    if event.type == "text.delta":
                        per_second[event.ts[:19]] = per_second.get(event.ts[:19], 0) + 1
                worst = max([worst, *per_second.values()])
                text = "".join(e.payload.text for e in raw if e.type == "text.delta")  # type: ignore[attr-defined]
                whole += text == "".join(e.payload.text for e in shaped if e.type == "text.delta")  # type: ignore[attr-defined]
        return {"shaped_deltas_per_second_max": worst, "shaped_views_whole": whole}

    return asyncio.run(read())


def sqlite_disk_full(args: argparse.Namespace) -> dict[str, Any]:
    """The SQLite replay log on a tmpfs of 2 MiB (``mount``: root), filled up ``--restart-after``
    seconds in (32 KiB left), remounted at 256 MiB ``--full-s`` seconds later."""
    work = Path(tempfile.mkdtemp(prefix="runwire-tinyfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(work)], check=True)
    try:
        pipe = Pipe(args, "--appendonly", "no", store_url=f"sqlite:///{work}/replay.db")
        try:
            time.sleep(args.restart_after)
            _test_services().fill_filesystem(work / "filler", leave=32 * 1024)
            time.sleep(args.full_s)
            subprocess.run(["mount", "-o", "remount,size=256m", "tmpfs", str(work)], check=True)
            row = pipe.finish("sqlite-disk-full", time.monotonic())
            with sqlite3.connect(work / "replay.db") as conn:
                row["integrity_check"] = conn.execute("PRAGMA integrity_check").fetchone()[0]
            return row
        finally:
            pipe.close()
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def _test_services() -> Any:
    """``tests.services`` (the real brokers the tests start), importable from here."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    import tests.services

    return tests.services


def count_deltas(runs_texts: list[list[str]], deltas: int) -> dict[str, int]:
    """Deltas missing, doubled and out of order over runs' texts (as :func:`tally` counts)."""
    expected = [f"d{k} " for k in range(deltas)]
    missing = doubled = disordered = 0
    for texts in runs_texts:
        missing += len(set(expected) - set(texts))
        doubled += len(texts) - len(set(texts))
        disordered += int([t for t in expected if t in set(texts)] != list(dict.fromkeys(texts)))
    return {"missing": missing, "doubled": doubled, "runs_out_of_order": disordered}


def resumed_tally(url: str, runs: int, deltas: int, store_url: str | None = None) -> dict[str, int]:
    """What a client resuming each run from its start reads now, through a new bus (a new edge
    process: the Kafka hot tier rebuilt from the delivery topic): deltas missing, doubled, out of
    order, and ``x.gap`` events (a seq hole a worker saw). With ``store_url``, as an edge reads it
    (:func:`runwire.edge.fanout.resume.history`): what the hot tier no longer has from the replay log."""
    from runwire.bus import open_bus
    from runwire.edge.fanout.resume import history

    async def read() -> tuple[list[list[str]], int]:
        out: list[list[str]] = []
        gaps = 0
        deadline = time.monotonic() + 60  # the replay log is written before the delivery streams
        async with open_bus(url) as bus, contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_store(store_url)) if store_url else None
            for index in range(runs):
                events: list[Any] = []
                info = await store.run(f"fault-{index}") if store is not None else None
                if store is not None and info is not None:
                    async for _, chunk in history(bus, store, (f"fault-{index}", "raw"), 0, info.last_seq):
                        events += chunk
                while not (events and events[-1].type == "run.lifecycle" and events[-1].payload.state == "done"):
                    batch = await bus.read((f"fault-{index}", "raw"), events[-1].seq if events else 0)
                    if not batch and time.monotonic() > deadline:
                        break
                    if not batch:
                        await asyncio.sleep(0.1)
                    events += batch
                gaps += sum(e.type == "x.gap" for e in events)
                out.append([e.payload.text for e in events if e.type == "text.delta" and not e.child_id])
        return out, gaps

    texts, gaps = asyncio.run(read())
    return {f"resumed_{name}": value for name, value in count_deltas(texts, deltas).items()} | {
        "resumed_gaps": gaps}


class KafkaPipe:
    """A Tansu broker on ``s3://`` storage (a moto server of its own, so its data outlives a
    restart), ``--workers`` faust workers (``runwire worker`` on ``kafka://``) and
    ``--publishers`` SDK publishers on a scratch directory."""

    def __init__(self, args: argparse.Namespace, durable: bool = True) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="runwire-fault-"))
        services = _test_services()
        self.durable = durable
        self.broker = services.DurableTansu() if durable else services.TansuBroker()
        self.broker.start()
        self.url = self.broker.url
        self.db = self.work / "replay.db"
        self.workers = [subprocess.Popen(
            [*RUNWIRE, "worker", "--bus", self.url, "--store", f"sqlite:///{self.db}", "--name", f"w{n}",
             "--data-dir", str(self.work)], cwd=self.work, stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"worker{n}.log", "w")) for n in range(args.workers)]
        self.share = args.runs // args.publishers
        self.total = self.share * args.publishers
        self.publishers = start_publishers(self.url, self.work, args, self.share)
        self.publishing_at_restart = 0
        self.back_at = 0.0

    def wait_writing(self, timeout: float = 120) -> None:
        """Until the workers have written a run to the replay log (they joined their group)."""
        async def written() -> bool:
            async with open_store(f"sqlite:///{self.db}") as store:
                return bool(await store.runs(limit=1))

        deadline = time.monotonic() + timeout
        while not (self.db.exists() and asyncio.run(written())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers wrote nothing in {timeout}s (see {self.work})")
            time.sleep(0.2)

    def restart_broker(self, down_s: float) -> None:
        """SIGKILL the broker and start it again on the same port ``down_s`` later."""
        self.publishing_at_restart = sum(p.poll() is None for p in self.publishers)
        self.broker.kill() if hasattr(self.broker, "kill") else self.broker.close()
        time.sleep(down_s)
        self.broker.start()
        self.back_at = time.monotonic()

    def finish(self, fault: str, since: float) -> dict[str, Any]:
        """Wait for the publishers and every run's end; the row, with recovery counted from
        ``since``, then what a resuming client reads."""
        codes = [p.wait(timeout=900) for p in self.publishers]
        deadline = time.monotonic() + 600
        while ended_runs(self.db, self.total) < self.total and time.monotonic() < deadline:
            time.sleep(0.5)
        recovery = time.monotonic() - since
        counts = tally(self.db, self.total, self.args.deltas)
        logs = {kind: " ".join(path.read_text() for path in self.work.glob(f"{kind}*.log"))
                for kind in ("publisher", "worker")}
        alive = sum(p.poll() is None for p in self.workers)
        return {"fault": fault, "publishers_exit": codes, "runs": self.total,
                "ended": ended_runs(self.db, self.total), "events_published": self.total * (self.args.deltas + 2),
                "recovery_s": round(recovery, 1), **counts,
                **resumed_tally(self.url, self.total, self.args.deltas,
                                None if self.durable else f"sqlite:///{self.db}"),
                "publisher_pauses": logs["publisher"].count("paused:"),
                "worker_pauses": logs["worker"].count("paused:"),
                "hot_tier_lost_logged": logs["worker"].count("hot tier lost"),
                "publishers_running_at_restart": self.publishing_at_restart, "workers_alive": alive}

    def close(self) -> None:
        stop_processes(self.workers + self.publishers)
        if self.args.keep and hasattr(self.broker, "dir"):
            for name in ("tansu.log", "moto.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(self.broker.dir / name, self.work / name)
        self.broker.close()
        leave(self.work, keep=self.args.keep)


def kafka_restart(args: argparse.Namespace) -> dict[str, Any]:
    """The Kafka-protocol broker (Tansu, data on s3) SIGKILLed ``--restart-after`` seconds after
    the workers' first write to the replay log (their group joined) and started again on the same
    port ``--down-s`` later, under faust workers and SDK publishers (``--round-pause`` spreads the
    publishing so that it is still going on then). Recovery: from the broker's restart to the
    last run ended in the replay log."""
    pipe = KafkaPipe(args)
    try:
        pipe.wait_writing()
        time.sleep(args.restart_after)
        pipe.restart_broker(args.down_s)
        return pipe.finish("kafka-restart", time.monotonic())
    finally:
        pipe.close()


def missing_after(pipe: KafkaPipe, since: float) -> int:
    """Deltas missing from the replay log whose publishing round began after ``since`` (the
    publishers log each round's start, monotonic clock)."""
    starts: list[dict[int, float]] = []
    for p in range(len(pipe.publishers)):
        text = (pipe.work / f"publisher{p}.log").read_text()
        starts.append({int(k): float(t) for k, t in re.findall(r"^round (\d+) ([\d.]+)$", text, re.M)})

    async def read() -> int:
        missing = 0
        async with open_store(f"sqlite:///{pipe.db}") as store:
            for index in range(pipe.total):
                events = await store.read(f"fault-{index}", 0, None)  # type: ignore[attr-defined]
                texts = {e.payload.text for e in events if e.type == "text.delta"}
                rounds = starts[index // pipe.share]
                missing += sum(1 for k in range(pipe.args.deltas)
                               if f"d{k} " not in texts and rounds.get(k, 0.0) > since)
        return missing

    return asyncio.run(read())


def kafka_restart_empty(args: argparse.Namespace) -> dict[str, Any]:
    """As ``kafka-restart``, the broker on ``memory://`` storage: started again empty (no topic,
    record, group or committed offset). What it had acknowledged and no worker had read is lost
    with it; the row counts that, and whether everything else arrived once and in order."""
    pipe = KafkaPipe(args, durable=False)
    try:
        pipe.wait_writing()
        time.sleep(args.restart_after)
        pipe.restart_broker(args.down_s)
        row = pipe.finish("kafka-restart-empty", time.monotonic())
        logs = " ".join(path.read_text() for path in pipe.work.glob("worker*.log"))
        return row | {"broker_loss_seen_by_workers": logs.count("the broker lost its state;"),
                      "former_life_dropped_by": logs.count("stamped with a former life"),
                      "missing_emitted_after_restart": missing_after(pipe, pipe.back_at)}
    finally:
        pipe.close()


class EdgeKillPipe:
    """Redis, ``--workers`` workers, two ``runwire edge`` processes (A and B, one SQLite replay log),
    ``--publishers`` SDK publishers and ``--clients`` streaming clients in two processes
    (``tests/edge/resuming_clients.py``: EventSource, Durable Streams and AI SDK stream readers in
    turn) spread over the runs on edge A, each moving to edge B when A goes away."""

    def __init__(self, args: argparse.Namespace) -> None:
        services = _test_services()
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="runwire-fault-"))
        self.port = free_port()
        self.redis = start_redis(self.port, self.work, "--appendonly", "no", "--maxclients", "20000")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.db = self.work / "replay.db"
        self.store = f"sqlite:///{self.db}"
        self.workers = [subprocess.Popen(
            [*RUNWIRE, "worker", "--bus", self.url, "--store", self.store, "--name", f"w{n}",
             "--data-dir", str(self.work)], cwd=self.work, stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"worker{n}.log", "w")) for n in range(args.workers)]
        self.edge_ports = [services.free_port(), services.free_port()]  # below the ephemeral range
        self.edges = [subprocess.Popen(
            [*RUNWIRE, "edge", "--bus", self.url, "--store", self.store, "--port", str(port)],
            cwd=self.work, stdout=subprocess.DEVNULL, stderr=open(self.work / f"edge{n}.log", "w"))
            for n, port in enumerate(self.edge_ports)]
        for port, edge in zip(self.edge_ports, self.edges, strict=True):
            services.wait_port(port, 30.0, edge)
        self.share = args.runs // args.publishers
        self.total = self.share * args.publishers
        self.publishers: list[subprocess.Popen[bytes]] = []
        root = Path(__file__).resolve().parent.parent
        halves = [args.clients - args.clients // 2, args.clients // 2]
        self.clients = [subprocess.Popen(
            [sys.executable, "-m", "tests.edge.resuming_clients", "--ports", ",".join(map(str, self.edge_ports)),
             "--runs", str(self.total), "--clients", str(count), "--first", str(sum(halves[:n]))],
            cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=open(self.work / f"clients{n}.log", "w")) for n, count in enumerate(halves) if count]

    def start_publishing(self) -> None:
        self.publishers = [subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, self.url, str(p * self.share), str(self.share),
             str(self.args.deltas), str(self.args.round_pause)],
            cwd=self.work, stderr=open(self.work / f"publisher{p}.log", "w")) for p in range(self.args.publishers)]

    def ask(self, line: str = "report") -> list[dict[str, Any]]:
        answers = []
        for proc in self.clients:
            assert proc.stdin and proc.stdout
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers.append(json.loads(proc.stdout.readline()))
        return answers

    def count(self, name: str) -> int:
        return sum(answer[name] for answer in self.ask())

    def wait(self, name: str, want: int, within: float) -> float:
        """Until ``want`` clients are ``name`` (bounded); the time it took."""
        started = time.monotonic()
        while self.count(name) < want and time.monotonic() - started < within:
            time.sleep(0.05)
        return time.monotonic() - started

    def records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n, _ in enumerate(self.clients):
            path = self.work / f"clients{n}.json"
            proc = self.clients[n]
            assert proc.stdin and proc.stdout
            proc.stdin.write(f"dump {path}\n")
            proc.stdin.flush()
            proc.stdout.readline()
            out += json.loads(path.read_text())
        return out

    def logged_seqs(self) -> dict[str, list[int]]:
        async def read() -> dict[str, list[int]]:
            async with open_store(self.store) as store:
                return {f"fault-{i}": [e.seq for e in await store.read(f"fault-{i}", 0, None)]
                        for i in range(self.total)}

        return asyncio.run(read())

    def close(self) -> None:
        for proc in self.clients:
            with contextlib.suppress(OSError):
                assert proc.stdin
                proc.stdin.write("quit\n")
                proc.stdin.close()
        for proc in [*self.clients, *self.edges, *self.workers, *self.publishers]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.clients, *self.edges, *self.workers, *self.publishers]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.redis.kill()
        self.redis.wait()
        leave(self.work, keep=self.args.keep)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def edge_kill(args: argparse.Namespace) -> dict[str, Any]:
    """Edge A SIGKILLed under ``--clients`` live streaming clients, ``--kill-after`` seconds after
    every client has received an event; every client resumes on edge B with its own cursor
    (``Last-Event-ID``, a Durable Streams offset). Recovery, per client: from the kill to its first
    event from edge B (p50, p99, max); each client's delivery seqs are checked against the run's in
    the replay log (missing, repeated, out of order)."""
    pipe = EdgeKillPipe(args)
    try:
        connect_s = pipe.wait("connected", args.clients, 300)  # (clients wait for their run's first event)
        pipe.start_publishing()
        connect_s += pipe.wait("receiving", args.clients, 300)
        print(f"edge-kill: {pipe.count('receiving')} clients receiving after {connect_s:.1f} s", file=sys.stderr)
        time.sleep(args.kill_after)
        publishing = sum(p.poll() is None for p in pipe.publishers)
        before = pipe.count("receiving")
        killed_at = time.time()
        pipe.edges[0].kill()
        pipe.edges[0].wait()
        pipe.wait("resumed", args.clients, 120)
        codes = [p.wait(timeout=900) for p in pipe.publishers]
        deadline = time.monotonic() + 600
        while ended_runs(pipe.db, pipe.total) < pipe.total and time.monotonic() < deadline:
            time.sleep(0.5)
        pipe.wait("done", args.clients, 120)
        records = pipe.records()
        expected = pipe.logged_seqs()
        per_client = [tests_check(record, expected[record["run_id"]]) for record in records]
        waits = [record["resumed_ts"] - killed_at for record in records if record["resumed_ts"]]
        logs = {kind: " ".join(path.read_text() for path in pipe.work.glob(f"{kind}*.log"))
                for kind in ("publisher", "worker", "edge")}
        kinds = sorted({record["kind"] for record in records})
        row = {
            "fault": "edge-kill", "publishers_exit": codes, "runs": pipe.total,
            "ended": ended_runs(pipe.db, pipe.total), "events_published": pipe.total * (args.deltas + 2),
            "recovery_s": round(max(waits, default=float("nan")), 2),
            **tally(pipe.db, pipe.total, args.deltas),
            "publisher_pauses": logs["publisher"].count("paused:"), "worker_pauses": logs["worker"].count("paused:"),
            "publishers_running_at_kill": publishing,
            "workers_alive": sum(p.poll() is None for p in pipe.workers),
            "edge_b_alive": pipe.edges[1].poll() is None,
            "edge_errors_logged": logs["edge"].count("Traceback") + logs["edge"].count(" ERROR "),
            "clients": len(records), "clients_kinds": {k: sum(r["kind"] == k for r in records) for k in kinds},
            "clients_connect_s": round(connect_s, 1), "clients_receiving_at_kill": before,
            "clients_resumed_on_b": sum(bool(r["resumed_ts"]) and r["edge"] == 1 for r in records),
            "clients_done": sum(r["done"] for r in records),
            "resume_wait_p50_s": round(_percentile(waits, 0.5), 2),
            "resume_wait_p99_s": round(_percentile(waits, 0.99), 2),
            "resume_wait_max_s": round(max(waits, default=float("nan")), 2),
            "resume_wait_by_kind_s": {kind: {"p50": round(_percentile(kind_waits, 0.5), 2),
                                             "max": round(max(kind_waits, default=float("nan")), 2)}
                                      for kind in kinds for kind_waits in [
                                          [r["resumed_ts"] - killed_at for r in records
                                           if r["kind"] == kind and r["resumed_ts"]]]},
            "client_events": sum(len(r["seqs"]) for r in records),
            **{f"client_{name}": sum(c[name] for c in per_client)
               for name in ("missing", "repeated", "out_of_order", "unexpected")},
            "clients_with_loss_or_repeat": sum(bool(c["missing"] or c["repeated"] or c["out_of_order"])
                                               for c in per_client),
            "client_errors": sum(len(r["errors"]) for r in records),
        }
        if not args.json:
            print(f"edge-kill clients: {row['clients']} ({row['clients_kinds']}), {row['clients_resumed_on_b']} "
                  f"resumed on edge B; from the kill to each client's next event p50 {row['resume_wait_p50_s']} s, "
                  f"p99 {row['resume_wait_p99_s']} s, max {row['resume_wait_max_s']} s (by kind "
                  f"{row['resume_wait_by_kind_s']}); {row['client_events']} "
                  f"events received: missing {row['client_missing']}, repeated {row['client_repeated']}, out of "
                  f"order {row['client_out_of_order']}; {row['clients_done']} saw their run end; publishers running "
                  f"at the kill {row['publishers_running_at_kill']}; edge B alive "
                  f"{row['edge_b_alive']}; client errors {row['client_errors']}")
        return row
    finally:
        pipe.close()


def tests_check(record: dict[str, Any], expected: list[int]) -> dict[str, int]:
    """``tests.edge.resuming_clients.check`` (a client's seqs against the replay log's)."""
    _test_services()  # (puts the repository root on sys.path)
    from tests.edge.resuming_clients import check

    return check(record, expected)


class PostgresPipe(Pipe):
    """:class:`Pipe` with the replay log on a PostgreSQL of its own (``synchronous_commit`` on, as
    deployed; stopped with ``pg_ctl stop -m immediate`` and started again on its port) and one
    ``runwire edge`` on the same bus and log, asked during the outage."""

    def __init__(self, args: argparse.Namespace, root: Path | None = None, wal_root: Path | None = None) -> None:
        services = _test_services()
        self.pg = services.PostgresServer(durable=True, root=root, wal_root=wal_root)
        self.pg.start()
        self.metrics_ports = [services.free_port() for _ in range(args.workers)]
        """Each worker's ``--metrics-addr`` (its pauses: ``runwire_worker_paused``)."""
        try:
            super().__init__(args, "--appendonly", "no", store_url=self.pg.url,
                             worker_args=lambda n: ["--metrics-addr", str(self.metrics_ports[n])])
        except BaseException:
            self.pg.close()
            raise
        self.edge_port = services.free_port()
        self.edge = subprocess.Popen(
            [*RUNWIRE, "edge", "--bus", self.url, "--store", self.store, "--port", str(self.edge_port)],
            cwd=self.work, stdout=subprocess.DEVNULL, stderr=open(self.work / "edge.log", "w"))
        services.wait_port(self.edge_port, 30.0, self.edge)

    def wait_writing(self, timeout: float = 120) -> None:
        """Until the workers have written a run to the replay log."""
        async def written() -> bool:
            async with open_store(self.store) as store:
                return bool(await store.runs(limit=1))

        deadline = time.monotonic() + timeout
        while not asyncio.run(written()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers wrote nothing in {timeout}s (see {self.work})")
            time.sleep(0.2)

    def ask_edge(self) -> dict[str, Any]:
        """``/readyz``, and a client resuming ``fault-0`` (raw view, NDJSON) after seq 1: the status
        and the first line it gets within 3 s."""
        import httpx

        base = f"http://127.0.0.1:{self.edge_port}"
        out: dict[str, Any] = {}
        with httpx.Client(timeout=5) as client:
            ready = client.get(f"{base}/readyz")
            out["readyz"] = f"{ready.status_code} {ready.text}"
            started = time.monotonic()
            try:
                with client.stream("GET", f"{base}/v1/runs/fault-0/stream",
                                   params={"detail": "full", "after": "1"},
                                   headers={"accept": "application/x-ndjson"}, timeout=3) as resp:
                    first = ""
                    if resp.status_code == 200:
                        first = next(resp.iter_lines(), "")
                    else:
                        first = resp.read().decode()
                    out["resume"] = (f"{resp.status_code} retry-after={resp.headers.get('retry-after')} "
                                     f"{first[:160]} ({time.monotonic() - started:.2f} s)")
            except httpx.HTTPError as exc:
                out["resume"] = f"{type(exc).__name__} after {time.monotonic() - started:.2f} s"
        return out

    def worker_paused(self) -> list[str]:
        """Each worker's ``runwire_worker_paused`` samples now (``part/reason``, or ``-``)."""
        import httpx

        out = []
        for port in self.metrics_ports:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError as exc:
                out.append(type(exc).__name__)
                continue
            lines = [line for line in text.splitlines() if line.startswith("runwire_worker_paused{")]
            out.append(",".join(line.split("{", 1)[1].split("}")[0] for line in lines) or "-")
        return out

    def wait_ready(self, within: float = 60) -> float:
        """Until the edge's ``/readyz`` is 200; the time it took."""
        import httpx

        started = time.monotonic()
        while time.monotonic() - started < within:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.edge_port}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        return time.monotonic() - started

    def wait_resumed(self, within: float = 120) -> float:
        """Until every worker that logged a pause logged its end (``resumed after``, after its last
        ``paused:`` line: a pause whose cause changed has two); the time it took."""
        started = time.monotonic()
        while time.monotonic() - started < within:
            texts = [path.read_text() for path in self.work.glob("worker*.log")]
            if all(text.rfind("resumed after") >= text.rfind("runwire.worker WARNING paused:") for text in texts):
                break
            time.sleep(0.1)
        return time.monotonic() - started

    def close(self) -> None:
        if self.edge.poll() is None:
            self.edge.send_signal(signal.SIGTERM)
            try:
                self.edge.wait(30)
            except subprocess.TimeoutExpired:
                self.edge.kill()
                self.edge.wait()
        if self.args.keep:
            with contextlib.suppress(OSError):
                shutil.copy(self.pg.root / "log", self.work / "postgres.log")
        super().close()
        self.pg.close()


def postgres_disk_full(wal_only: bool) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """The PostgreSQL replay log's disk full: the cluster (data directory and ``pg_wal``; with
    ``wal_only`` ``pg_wal`` alone, ``initdb -X``) on a tmpfs of 96 MiB (``mount``: root), filled up
    ``--restart-after`` seconds after the workers' first write (32 KiB left) and remounted at 2 GiB
    ``--full-s`` seconds later; a PostgreSQL that shut itself down meanwhile (a full ``pg_wal``:
    PANIC, then no room to recover) is started again then, as its supervisor would. Recovery: from
    the remount to the workers' ``resumed after`` lines and to every run ended; the edge and the
    workers' ``runwire_worker_paused`` are asked while it is full."""
    name = "postgres-wal-full" if wal_only else "postgres-disk-full"

    def scenario(args: argparse.Namespace) -> dict[str, Any]:
        fs = Path(tempfile.mkdtemp(prefix="runwire-pgfs-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0755", "tmpfs", str(fs)], check=True)
        try:
            return _disk_full(args, name, fs, PostgresPipe(args, wal_root=fs) if wal_only else PostgresPipe(args, root=fs))
        finally:
            subprocess.run(["umount", "-l", str(fs)], check=False)
            shutil.rmtree(fs, ignore_errors=True)

    return scenario


def _disk_full(args: argparse.Namespace, name: str, fs: Path, pipe: PostgresPipe) -> dict[str, Any]:
    """One disk-full scenario on ``pipe`` (its PostgreSQL, or its ``pg_wal``, on the tmpfs ``fs``)."""
    try:
        pipe.wait_writing()
        time.sleep(args.restart_after)
        pipe.publishing_at_restart = sum(p.poll() is None for p in pipe.publishers)
        filled = time.monotonic()
        _test_services().fill_filesystem(fs / "filler", leave=32 * 1024)
        deadline = filled + args.full_s
        while time.monotonic() < deadline and not all(
                "paused:" in (pipe.work / f"worker{n}.log").read_text() for n in range(args.workers)):
            time.sleep(0.1)
        paused_s = time.monotonic() - filled
        during = pipe.ask_edge() | {"worker_paused": pipe.worker_paused()}
        time.sleep(max(0.0, deadline - time.monotonic()))
        during["postgres_up"] = pipe.pg.running()
        subprocess.run(["mount", "-o", "remount,size=2g", "tmpfs", str(fs)], check=True)
        back = time.monotonic()
        restarted = not pipe.pg.running()
        if restarted:
            pipe.pg.resume()
        pg_up_s = time.monotonic() - back
        pipe.wait_resumed()
        resumed_s = time.monotonic() - back
        after = pipe.ask_edge() | {"worker_paused": pipe.worker_paused()}
        row = pipe.finish(name, back)
        worker_logs = " ".join(path.read_text() for path in pipe.work.glob("worker*.log"))
        pg_log = (pipe.pg.root / "log").read_text(errors="replace")
        row |= {"full_s": round(back - filled, 1), "all_paused_s_after_fill": round(paused_s, 1),
                "writes_resumed_s": round(resumed_s, 1), "postgres_restarted": restarted,
                "postgres_up_s_after_remount": round(pg_up_s, 1),
                "postgres_disk_full_errors": pg_log.count("No space left on device"),
                "postgres_panics": pg_log.count("PANIC:"),
                "worker_pause_lines": [line.split(" - ")[-1][:160] for line in worker_logs.splitlines()
                                       if "paused:" in line or "resumed after" in line],
                "worker_resumed_logged": worker_logs.count("resumed after"),
                "worker_dead_letters_logged": worker_logs.lower().count("dead-letter"),
                "worker_tracebacks": worker_logs.count("Traceback"),
                "edge_alive": pipe.edge.poll() is None, "edge_during": during, "edge_after": after,
                "workers_dead": {n: (proc.returncode, (pipe.work / f"worker{n}.log").read_text()[-600:])
                                 for n, proc in enumerate(pipe.workers) if proc.poll() is not None}}
        if not args.json:
            print(f"{name}: full {row['full_s']} s (every worker paused "
                  f"{row['all_paused_s_after_fill']} s after the fill); PostgreSQL: "
                  f"{row['postgres_disk_full_errors']} 'No space left' lines, {row['postgres_panics']} PANIC, "
                  f"restarted {restarted} (up {row['postgres_up_s_after_remount']} s after the remount); while full: {during}; after: {after}; workers' pause lines "
                  f"{row['worker_pause_lines']}; writing again {row['writes_resumed_s']} s after the remount; "
              f"dead workers (exit status, log's end) {row['workers_dead']}")
        return row
    finally:
        pipe.close()


def postgres_outage(down_s: float) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """The PostgreSQL replay log stopped (``pg_ctl stop -m immediate``) ``--restart-after`` seconds
    after the workers' first write and started again ``down_s`` later, under two workers on Redis
    and SDK publishers still publishing (``--round-pause``). While it is down the edge is asked
    (``/readyz``, a resume the hot tier covers). Recovery: from PostgreSQL back to every worker's
    ``resumed after`` line, and to every run ended in the replay log."""
    name = "postgres-restart" if down_s <= 2 else f"postgres-down-{down_s:g}s"

    def scenario(args: argparse.Namespace) -> dict[str, Any]:
        pipe = PostgresPipe(args)
        try:
            pipe.wait_writing()
            time.sleep(args.restart_after)
            pipe.publishing_at_restart = sum(p.poll() is None for p in pipe.publishers)
            stopped = time.monotonic()
            pipe.pg.stop()
            time.sleep(min(1.0, down_s / 2))
            during = pipe.ask_edge()
            time.sleep(max(0.0, down_s - (time.monotonic() - stopped)))
            pipe.pg.resume()
            back = time.monotonic()
            pipe.wait_ready()
            ready_s = time.monotonic() - back
            pipe.wait_resumed()
            resumed_s = time.monotonic() - back
            after = pipe.ask_edge()
            row = pipe.finish(name, back)
            worker_logs = " ".join(path.read_text() for path in pipe.work.glob("worker*.log"))
            row |= {"down_s": round(back - stopped, 1), "writes_resumed_s": round(resumed_s, 1),
                    "edge_ready_again_s": round(ready_s, 1),
                    "worker_resumed_logged": worker_logs.count("resumed after"),
                    "worker_tracebacks": worker_logs.count("Traceback"),
                    "edge_alive": pipe.edge.poll() is None,
                    "edge_during": during, "edge_after": after}
            if not args.json:
                print(f"{name}: PostgreSQL down {row['down_s']} s; edge while down: {during}; after: {after}; "
                      f"workers logged {row['worker_pauses']} pauses, {row['worker_resumed_logged']} resumes, "
                      f"writing again {row['writes_resumed_s']} s after PostgreSQL was back; edge ready "
                      f"again {row['edge_ready_again_s']} s after; edge alive {row['edge_alive']}")
            return row
        finally:
            pipe.close()

    return scenario


class LatencyProbe:
    """Publish→replay-log latency, measured while a scenario runs: every ``every`` seconds a
    run of its own (``probe-<k>``, one event) is published straight to Redis and the log is
    polled until the run is in it."""

    def __init__(self, url: str, db: Path, every: float = 0.25) -> None:
        import threading

        self.url, self.db, self.every = url, db, every
        self.samples: list[tuple[float, float]] = []
        """(wall time published, seconds until logged)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join(180)
        return self.samples

    async def _run(self) -> None:
        from runwire import Publisher

        async with Publisher.connect(self.url, delivery_timeout=600) as pub, \
                open_store(f"sqlite:///{self.db}") as store:
            k = 0
            while not self._stop.is_set():
                run = pub.run(f"probe-{k}")
                sent = time.time()
                await run.emit("run.lifecycle", {"state": "running"})
                await pub.flush()
                for _ in range(24000):  # (at most 2 min)
                    if await store.run(f"probe-{k}") is not None:
                        break
                    await asyncio.sleep(0.005)
                self.samples.append((sent, time.time() - sent))
                await run.finish()
                k += 1
                await asyncio.sleep(self.every)


NET_PARTITION_S = 10.0
NET_BUS_OPTIONS = "lease_ms=3000&claim_idle_ms=6000"
"""net-partition's bus options: leases expire well inside the partition."""


def _log_times(text: str, needle: str) -> list[float]:
    """Wall times of the log lines (``%(asctime)s …``) that contain ``needle``."""
    import datetime

    out = []
    for line in text.splitlines():
        if needle in line:
            with contextlib.suppress(ValueError):
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                out.append(stamp.timestamp())
    return out


class NetPipe(Pipe):
    """:class:`Pipe` with the network between the workers and Redis in the way: ``latency``
    and ``loss`` put every worker behind a :class:`DelayProxy` (``tests/workers/netns.py``:
    +200 ms each way; 5 % of the chunks held a retransmission longer — this kernel has no
    ``sch_netem``, so no packet is really dropped); ``partition`` runs worker 0 in a network
    namespace of its own, joined to Redis by a veth pair that :meth:`cut` takes down, and the
    other workers on the host. Publishers talk to Redis directly."""

    def __init__(self, args: argparse.Namespace, mode: str) -> None:
        _test_services()
        from tests.workers.netns import DelayProxy, NetNs

        self.args, self.mode = args, mode
        self.work = Path(tempfile.mkdtemp(prefix="runwire-fault-"))
        self.port = free_port()
        self.ns: Any = None
        self.proxy: Any = None
        binds = ["127.0.0.1"]
        if mode == "partition":
            self.ns = NetNs().__enter__()
            binds.append(self.ns.host_ip)
        self.redis_args = ("--appendonly", "no", "--protected-mode", "no", "--bind", *binds)
        self.redis = start_redis(self.port, self.work, *self.redis_args)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.db = self.work / "replay.db"
        self.log = self.db
        self.store = f"sqlite:///{self.db}"
        if mode != "partition":
            self.proxy = DelayProxy(self.port, delay_s=0.2 if mode == "latency" else 0.0,
                                    stall_p=0.05 if mode == "loss" else 0.0, stall_s=0.2).__enter__()
        self.workers = []
        for n in range(args.workers):
            command = [*RUNWIRE, "worker", "--store", self.store, "--name", f"w{n}", "--data-dir",
                       str(self.work), "--bus"]
            if self.proxy is not None:
                command.append(f"redis://127.0.0.1:{self.proxy.port}/0")
            elif n == 0:
                command = self.ns.command(*command, f"redis://{self.ns.host_ip}:{self.port}/0?{NET_BUS_OPTIONS}")
            else:
                command.append(f"{self.url}?{NET_BUS_OPTIONS}")
            self.workers.append(subprocess.Popen(command, cwd=self.work, stdout=subprocess.DEVNULL,
                                                 stderr=open(self.work / f"worker{n}.log", "w")))
        self.publishing_at_restart = 0
        self.share = args.runs // args.publishers
        self.total = self.share * args.publishers
        self.started = time.monotonic()
        self.publishers = start_publishers(self.url, self.work, args, self.share)
        self.probe = LatencyProbe(self.url, self.db)

    def wait_writing(self, timeout: float = 120) -> None:
        async def written() -> bool:
            async with open_store(self.store) as store:
                return bool(await store.runs(limit=1))

        deadline = time.monotonic() + timeout
        while not (self.db.exists() and asyncio.run(written())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers wrote nothing in {timeout}s (see {self.work})")
            time.sleep(0.2)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.probe.stop()
        super().close()
        if self.proxy is not None:
            self.proxy.__exit__(None, None, None)
        if self.ns is not None:
            self.ns.close()


def net_fault(mode: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """The network between the workers and Redis: ``latency`` (+200 ms each way for every
    worker, the whole run), ``loss`` (5 % of the chunks held a retransmission, 200 ms, longer),
    ``partition`` (worker 0 cut off from Redis for 10 s, ``--restart-after`` seconds after the
    workers' first write, the other workers fine; bus ``lease_ms=3000&claim_idle_ms=6000``).
    Besides the tally: publish→log latency of probe runs (p50/p99/max, and during the cut), the
    time the publishers took and the takeovers the worker logs show."""

    def scenario(args: argparse.Namespace) -> dict[str, Any]:
        pipe = NetPipe(args, mode)
        try:
            pipe.wait_writing()
            pipe.probe.start()
            extra: dict[str, Any] = {}
            since = time.monotonic()
            if mode == "partition":
                def logged(n: int, needle: str, after: float, within: float = 60) -> None:
                    deadline = time.monotonic() + within
                    while not [t for t in _log_times((pipe.work / f"worker{n}.log").read_text(), needle)
                               if t > after] and time.monotonic() < deadline:
                        time.sleep(0.1)

                for n in range(args.workers):
                    logged(n, "owns shards", 0.0)
                time.sleep(args.restart_after)
                pipe.publishing_at_restart = sum(p.poll() is None for p in pipe.publishers)
                cut = time.time()
                pipe.ns.cut()
                time.sleep(NET_PARTITION_S)
                pipe.ns.heal()
                healed = time.time()
                since = time.monotonic()
                logged(0, "owns shards", healed)  # (the cut-off worker takes its share back)
                extra = {"cut_s": round(healed - cut, 1), "cut_wall": cut, "healed_wall": healed,
                         "publishers_running_at_heal": sum(p.poll() is None for p in pipe.publishers)}
            codes_wait = [p.wait(timeout=900) for p in pipe.publishers]
            publish_s = time.monotonic() - pipe.started
            samples = pipe.probe.stop()
            row = pipe.finish(f"net-{mode}", since)
            row["publishers_exit"] = codes_wait
            waits = [s for _, s in samples]
            row |= {"publish_s": round(publish_s, 1), "probes": len(waits),
                    "probe_p50_ms": round(_percentile(waits, 0.5) * 1000),
                    "probe_p99_ms": round(_percentile(waits, 0.99) * 1000),
                    "probe_max_ms": round(max(waits, default=float("nan")) * 1000)}
            logs = {n: (pipe.work / f"worker{n}.log").read_text() for n in range(args.workers)}
            row["worker_tracebacks"] = sum(text.count("Traceback") for text in logs.values())
            if pipe.proxy is not None:
                row |= {"proxy_chunks": pipe.proxy.chunks, "proxy_stalls": pipe.proxy.stalls}
            if mode == "partition":
                cut, healed = extra.pop("cut_wall"), extra.pop("healed_wall")
                def after(n: int, needle: str, since: float) -> list[float]:
                    return [round(t - since, 1) for t in _log_times(logs[n], needle) if t > since]

                during = [s for sent, s in samples if cut <= sent <= healed]
                row["probe_after_heal_max_ms"] = round(max((s for sent, s in samples if sent > healed),
                                                           default=float("nan")) * 1000)
                row |= {"w0_lost_shards_s_after_cut": after(0, "lost shards", cut),
                        "w1_owns_shards_s_after_cut": after(1, "owns shards", cut),
                        "w0_owns_shards_s_after_heal": after(0, "owns shards", healed),
                        "w1_lost_shards_s_after_heal": after(1, "lost shards", healed),
                        "w0_log_lines": [line[:200] for line in logs[0].splitlines()
                                         if " WARNING " in line or " ERROR " in line or "owns" in line][:12],
                        "probe_during_cut_max_ms": round(max(during, default=float("nan")) * 1000)}
            row |= extra
            return row
        finally:
            pipe.close()

    return scenario


SCENARIOS = {"redis-maxmemory": redis_maxmemory, "redis-restart-aof": redis_restart("aof"),
             "redis-restart-none": redis_restart("none")}
SCENARIOS["kafka-restart"] = kafka_restart
SCENARIOS["kafka-restart-empty"] = kafka_restart_empty
SCENARIOS["edge-kill"] = edge_kill
SCENARIOS["postgres-restart"] = postgres_outage(2.0)
SCENARIOS["postgres-down-30s"] = postgres_outage(30.0)
SCENARIOS["net-latency"] = net_fault("latency")
SCENARIOS["net-loss"] = net_fault("loss")
SCENARIOS["net-partition"] = net_fault("partition")
SCENARIOS["sqlite-disk-full"] = sqlite_disk_full
SCENARIOS["postgres-disk-full"] = postgres_disk_full(wal_only=False)
SCENARIOS["postgres-wal-full"] = postgres_disk_full(wal_only=True)
SCENARIOS["clock-skew"] = clock_skew


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--deltas", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--full-s", type=float, default=25.0, help="seconds Redis stays full")
    parser.add_argument("--maxmemory", default="30mb")
    parser.add_argument("--restart-after", type=float, default=8.0, help="seconds before Redis is killed")
    parser.add_argument("--down-s", type=float, default=2.0, help="seconds Redis stays down")
    parser.add_argument("--round-pause", type=float, default=0.0,
                        help="seconds each publisher sleeps after a delta to each of its runs")
    parser.add_argument("--clients", type=int, default=2000, help="edge-kill: streaming clients on edge A")
    parser.add_argument("--kill-after", type=float, default=3.0,
                        help="edge-kill: seconds after every client has an event before edge A is killed")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's directory and logs")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = [SCENARIOS[name](args) for name in args.only.split(",")]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(f"{row['fault']}: {row['runs']} runs, {row['events_published']} events; publishers exit "
              f"{row['publishers_exit']}; {row['ended']} ended; recovery {row['recovery_s']} s; "
              f"missing {row['missing']}, doubled {row['doubled']}, runs out of order "
              f"{row['runs_out_of_order']}; workers alive {row['workers_alive']}; pauses logged: publishers "
              f"{row['publisher_pauses']}, workers {row['worker_pauses']}; lost entries published again "
              f"(warnings) {row.get('republished_logged', 0)}; streams continued from the log's checkpoint "
              f"(warnings) {row.get('checkpoints_from_log_logged', 0)}")
        if "resumed_missing" in row:
            print(f"  a client resuming each run from seq 0: missing {row['resumed_missing']}, doubled "
                  f"{row['resumed_doubled']}, runs out of order {row['resumed_runs_out_of_order']}, x.gap "
                  f"{row['resumed_gaps']}; publishers running at the fault "
                  f"{row.get('publishers_running_at_restart', '-')}")


if __name__ == "__main__":
    main()
