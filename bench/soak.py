"""Soak: the whole pipeline at a steady load for N minutes, measured the way an operator sizes it.

One ``runwire worker`` and one ``runwire edge`` process on a Redis of the
bench's own (``redis-server`` on a free port) and a SQLite replay log; a
publisher process (SDK) keeps ``--runs`` runs streaming at ``--rate``
events/s in all (a run is ``running``, ``--deltas`` text deltas and
``done``, then the next one starts; paced by the clock every ``--tick``),
and ``--readers`` reader processes hold an SSE client on every run (raw,
and shaped with ``--shaped``); one raw client in ``--resume-every`` drops
its connection halfway and resumes with ``Last-Event-ID``. This process
only starts the others and measures, so the offered load does not hang on
one Python process both publishing and parsing every delivered event.

Every ``--interval`` seconds it prints: events published and delivered per
second, live runs, the RSS of the worker and the edge, Redis
``used_memory``, its keys and ``expired_stale_perc`` (Redis's estimate of
the share of keys with a TTL that expired but are not reclaimed yet), the
replay log's size on disk, the publish → client
latency p50 and p99 of the raw deltas delivered in the interval, and the
CPU of each process (% of one core: worker, edge, Redis, publisher,
readers). At the end: events lost, doubled or out of order (each reader
checks its clients' ids against the ids the publisher sent for the run, as
runs end), the steady-state Redis bytes per live run (``used_memory`` above
the empty server's, averaged from the end of warm-up — the first runs'
length plus the grace — to the end, divided by the runs streaming) with the
largest deviation from that mean, the RSS range of every process over the
same time, and each process's CPU µs per published event over it.

    .venv/bin/python bench/soak.py --minutes 10 --rate 2000 --runs 60

Not a test: it reports figures (docs/benchmarks.md § Soak).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import RawArray
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from runwire.core.envelope import ts_ms
from runwire.sdk.publisher import Publisher, Run

RUNWIRE = str(Path(sys.executable).parent / "runwire")
TICK_S = os.sysconf("SC_CLK_TCK")
LATENCY_BINS = 30_001
"""Publish → client latency histogram: one bin per millisecond, the last one for 30 s and more."""

# publisher counters (shared memory, written by the publisher process only)
PUBLISHED, LIVE, STARTED = range(3)
# reader counters (one array per reader process, written by it only)
DELIVERED, SHAPED, RESUMES, CLIENT_ERRORS, LOST, DOUBLED, DISORDER, CHECKED = range(8)
READER_FIELDS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(command: list[str], log: Path | None, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process of the soak, its output in ``log`` (or discarded)."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK_S


def size_mb(path: Path) -> float:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += Path(f"{path}{suffix}").stat().st_size
    return total / 1e6


# ---- the publisher process --------------------------------------------------

class Pacer:
    """One slot's clock: its events are due at ``rate`` a second from its start, so a late
    wake-up catches up and the offered load is the rate asked for, whatever the ticks slept."""

    def __init__(self, rate: float) -> None:
        self.rate, self.began, self.sent = rate, time.monotonic(), 0

    async def due(self, tick: float) -> int:
        """How many events are due now (at least one); sleeps first, at least ``tick``, when
        none is."""
        wait = self.began + self.sent / self.rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(max(wait, tick))
        return max(1, int(self.rate * (time.monotonic() - self.began)) + 1 - self.sent)


def publisher_process(url: str, args: argparse.Namespace, inboxes: list[Any], counters: Any,
                      until: float) -> None:
    asyncio.run(publish(url, args, inboxes, counters, until))


async def publish(url: str, args: argparse.Namespace, inboxes: list[Any], counters: Any,
                  until: float) -> None:
    """Keep ``args.runs`` runs streaming until ``until`` (monotonic); tell the run's reader
    its id when it starts and the ids of its events when it ends, then ``None`` to every reader."""
    per_run = args.rate / args.runs  # events/s of one slot (one run after another)
    total = args.deltas + 2  # running, the deltas, done

    async def one_run(run: Run, inbox: Any, index: int, pacer: Pacer) -> None:
        ids: list[str] = []
        counters[LIVE] += 1
        try:
            while len(ids) < total:
                for _ in range(min(total - len(ids), await pacer.due(args.tick))):
                    sent = len(ids)
                    if sent == 0:
                        event = await run.emit("run.lifecycle", {"state": "running"})
                    elif sent < total - 1:
                        event = await run.emit("text.delta", {"text": f"token {sent} "})
                    else:
                        event = await run.finish("done")
                    ids.append(event.id)
                    pacer.sent += 1
                    counters[PUBLISHED] += 1
                    if sent == 0:
                        inbox.put(("run", run.run_id, index))
        finally:
            counters[LIVE] -= 1
        inbox.put(("ids", run.run_id, ids))

    async def slot(offset: int) -> None:
        # starts spread over one run's length, so runs end (and leave Redis) one at a time
        await asyncio.sleep(offset * total / per_run / args.runs)
        pacer = Pacer(per_run)
        while time.monotonic() < until:
            index = counters[STARTED] = counters[STARTED] + 1
            run = publisher.run(f"soak-{uuid.uuid4().hex[:12]}")
            await one_run(run, inboxes[index % len(inboxes)], index, pacer)

    try:
        async with Publisher.connect(url, linger_ms=5.0, delivery_timeout=120) as publisher:
            await asyncio.gather(*(slot(i) for i in range(args.runs)))
    finally:
        for inbox in inboxes:
            inbox.put(None)


# ---- the reader processes ---------------------------------------------------

_decoder = msgspec.json.Decoder()


async def sse(port: int, run_id: str, view: str, after: int | None,
              on_event: Any, stop_after: int | None = None) -> int:
    """Read one SSE stream (HTTP/1.0: no chunking, the server closes at the end); returns the
    last seq read. ``stop_after``: drop the connection after that many events."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = f"Last-Event-ID: {after}\r\n" if after is not None else ""
    writer.write(f"GET /v1/runs/{run_id}/stream?detail={view} HTTP/1.0\r\nHost: soak\r\n"
                 f"Accept: text/event-stream\r\n{headers}\r\n".encode())
    await writer.drain()
    last = after or 0
    count = 0
    try:
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"{run_id}: {status!r}")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        while True:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                event = _decoder.decode(line[6:])
                last = event.get("seq", last)
                on_event(event)
                count += 1
                if stop_after is not None and count >= stop_after:
                    break
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return int(last)


@dataclass
class Watched:
    """One run's raw client on a reader: what it received, and what was published once known."""

    received: list[tuple[int, str]] = field(default_factory=list)
    published: list[str] | None = None
    done: bool = False


def check(published: list[str], got: list[tuple[int, str]]) -> tuple[int, int, int]:
    """Events lost, doubled and out of order on one run's raw client."""
    ids = [i for _, i in got]
    seqs = [s for s, _ in got]
    sent, seen = set(published), set(ids)
    doubled = len(ids) - len(seen)
    lost = len(sent - seen)
    disorder = sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a)
    if ids and [i for i in ids if i in sent] != [i for i in published if i in seen]:
        disorder += 1
    return lost, doubled, disorder


def reader_process(port: int, args: argparse.Namespace, inbox: Any, counters: Any,
                   latency: Any) -> None:
    asyncio.run(read(port, args, inbox, counters, latency))


async def read(port: int, args: argparse.Namespace, inbox: Any, counters: Any,
               latency: Any) -> None:
    """Watch every run the publisher announces; check each one when it ended and was read."""
    watched: dict[str, Watched] = {}
    tasks: set[asyncio.Task[None]] = set()
    last_bin = LATENCY_BINS - 1

    def settle(run_id: str) -> None:
        run = watched[run_id]
        if run.done and run.published is not None:
            del watched[run_id]
            lost, doubled, disorder = check(run.published, run.received)
            counters[LOST] += lost
            counters[DOUBLED] += doubled
            counters[DISORDER] += disorder
            counters[CHECKED] += 1

    async def watch(run_id: str, resume_at: int | None) -> None:
        got = watched[run_id].received

        def raw(event: dict[str, Any]) -> None:
            got.append((int(event["seq"]), str(event["id"])))
            counters[DELIVERED] += 1
            if event.get("type") == "text.delta":
                ms = int(time.time() * 1000 - ts_ms(str(event["ts"])))
                latency[max(0, min(ms, last_bin))] += 1

        def shaped_event(event: dict[str, Any]) -> None:
            counters[SHAPED] += 1

        async def raw_client() -> None:
            last = await sse(port, run_id, "full", None, raw, stop_after=resume_at)
            if resume_at is not None:
                counters[RESUMES] += 1
                await sse(port, run_id, "full", last, raw)

        try:
            jobs = [raw_client()]
            if args.shaped:
                jobs.append(sse(port, run_id, "shaped", None, shaped_event))  # type: ignore[arg-type]
            await asyncio.gather(*jobs)
        except (OSError, RuntimeError) as exc:
            counters[CLIENT_ERRORS] += 1
            print(f"client of {run_id}: {exc}", file=sys.stderr)
        watched[run_id].done = True
        settle(run_id)

    loop = asyncio.get_running_loop()
    while (message := await loop.run_in_executor(None, inbox.get)) is not None:
        kind, run_id, data = message
        if kind == "run":
            watched[run_id] = Watched()
            resume_at = args.deltas // 2 if data % args.resume_every == 0 else None
            task = asyncio.create_task(watch(run_id, resume_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            watched[run_id].published = data
            settle(run_id)
    if tasks:
        await asyncio.gather(*tasks)


# ---- this process: start, measure, report -----------------------------------

def percentile(hist: list[int], fraction: float) -> float:
    total = sum(hist)
    if not total:
        return 0.0
    wanted, seen = total * fraction, 0
    for ms, n in enumerate(hist):
        seen += n
        if seen >= wanted:
            return float(ms)
    return float(len(hist) - 1)


@dataclass
class Sample:
    t: float
    used: int
    published: int
    rss: dict[str, float]
    cpu: dict[str, float]


async def census(redis: Redis) -> None:
    """Redis memory by kind of key at the end (``MEMORY USAGE`` of every key: small servers only)."""
    kinds: dict[str, list[int]] = {}
    async for name in redis.scan_iter(count=1000):
        text = name.decode()
        kind = ("ingest" if ":ingest:" in text and not text.endswith(":lost")
                else text.rsplit(":", 1)[-1] if "}:" in text else text)
        if ":meta:" in text:
            kind = "meta:" + text.rsplit(":", 1)[-1]
        elif ":lease:" in text:
            kind = "lease"
        usage = await redis.memory_usage(name) or 0
        kinds.setdefault(kind, []).append(int(usage))
    parts = ", ".join(f"{kind} {len(sizes)} keys {sum(sizes) / 1e6:.2f} MB"
                      f" ({statistics.mean(sizes):.0f} B each)"
                      for kind, sizes in sorted(kinds.items(), key=lambda kv: -sum(kv[1])))
    print(f"Redis keys at the end: {parts}")


async def redis_up(redis: Redis) -> int:
    """Wait for the bench's Redis to answer; its ``used_memory`` empty."""
    async with asyncio.timeout(20):
        while True:
            with contextlib.suppress(OSError, RedisError):
                return int((await redis.info("memory"))["used_memory"])
            await asyncio.sleep(0.1)


async def edge_up(edge_port: int) -> None:
    async with asyncio.timeout(30):
        while True:
            with contextlib.suppress(OSError):
                _r, w = await asyncio.open_connection("127.0.0.1", edge_port)
                w.close()
                break
            await asyncio.sleep(0.2)


def report(args: argparse.Namespace, samples: list[Sample], baseline: int, readers: list[Any],
           db: Path) -> None:
    total = [sum(r[i] for r in readers) for i in range(READER_FIELDS)]
    print(f"runs checked {total[CHECKED]}, raw events delivered {total[DELIVERED]}, "
          f"shaped {total[SHAPED]}, resumes {total[RESUMES]}, client errors {total[CLIENT_ERRORS]}")
    print(f"lost {total[LOST]}, doubled {total[DOUBLED]}, out of order {total[DISORDER]}")
    # steady state: after the first runs ended and the grace of the first finished ones passed
    warm = (args.deltas + 2) / (args.rate / args.runs) + args.grace + 2 * args.interval
    steady_samples = [s for s in samples if warm <= s.t <= args.minutes * 60 + args.interval / 2]
    if len(steady_samples) < 2:
        print("no sample after warm-up: run longer")
        return
    used = [s.used for s in steady_samples]
    steady = statistics.mean(used)
    spread = max(abs(u - steady) for u in used) / steady * 100
    print(f"Redis used_memory after {warm:.0f} s (warm-up + grace): mean {steady / 1e6:.1f} MB,"
          f" within ±{spread:.1f} %; per live run {(steady - baseline) / args.runs / 1e3:.1f} KB"
          f" (above the empty server's {baseline / 1e6:.1f} MB)")
    first, last = steady_samples[0], steady_samples[-1]
    events = last.published - first.published
    span = last.t - first.t
    print(f"after warm-up: {events} events published in {span:.0f} s ({events / span:.0f}/s)")
    for name in first.rss:
        sizes = [s.rss[name] for s in steady_samples]
        cpu = last.cpu[name] - first.cpu[name]
        print(f"  {name:<9} RSS {min(sizes):6.1f} – {max(sizes):6.1f} MB, CPU {cpu / span * 100:5.1f} %"
              f" of a core, {cpu * 1e6 / max(1, events):6.1f} µs per published event")
    print(f"replay log {size_mb(db):.1f} MB for {total[DELIVERED]} raw events "
          f"({size_mb(db) * 1e6 / max(1, total[DELIVERED]):.0f} bytes/event incl. index)")


async def soak(args: argparse.Namespace, work: Path) -> None:
    redis_port, edge_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    url = f"redis://127.0.0.1:{redis_port}/0?grace={args.grace}"
    db = work / "replay.db"
    store = f"sqlite:///{db}"
    pids: dict[str, int] = {}
    children: list[subprocess.Popen[bytes]] = []
    bench: list[multiprocessing.process.BaseProcess] = []
    redis = Redis.from_url(f"redis://127.0.0.1:{redis_port}/0")
    mp = multiprocessing.get_context("spawn")
    try:
        children.append(spawn(["redis-server", "--port", str(redis_port), "--save", "",
                               "--appendonly", "no", "--dir", str(work)], None, env))
        pids["redis"] = children[-1].pid
        baseline = await redis_up(redis)
        for name, command in (
            ("worker", [RUNWIRE, "worker", "--bus", url, "--store", store, "--data-dir", str(work)]),
            ("edge", [RUNWIRE, "edge", "--bus", url, "--store", store, "--port", str(edge_port)]),
        ):
            children.append(spawn(command, work / f"{name}.log", env))
            pids[name] = children[-1].pid
        await edge_up(edge_port)
        inboxes = [mp.Queue() for _ in range(args.readers)]
        reader_counts = [RawArray(ctypes.c_long, READER_FIELDS) for _ in range(args.readers)]
        latencies = [RawArray(ctypes.c_long, LATENCY_BINS) for _ in range(args.readers)]
        for index, inbox in enumerate(inboxes):
            bench.append(mp.Process(target=reader_process, name=f"reader{index}", daemon=True,
                                    args=(edge_port, args, inbox, reader_counts[index],
                                          latencies[index])))
        pub_counts = RawArray(ctypes.c_long, 3)
        start = time.monotonic()
        until = start + args.minutes * 60
        bench.append(mp.Process(target=publisher_process, name="publisher", daemon=True,
                                args=(url, args, inboxes, pub_counts, until)))
        for process in bench:
            process.start()
            assert process.pid is not None
            pids[process.name] = process.pid
        print(f"soak: {args.runs} runs × {args.deltas} deltas, {args.rate:g} events/s, "
              f"grace {args.grace}s, {args.minutes:g} min, {args.readers} reader process(es); "
              f"Redis empty {baseline / 1e6:.1f} MB")
        cpu_names = ["worker", "edge", "redis", "publisher", *(p.name for p in bench[:-1])]
        print(f"{'t s':>6} {'pub/s':>7} {'dlv/s':>7} {'live':>5} {'worker MB':>9} {'edge MB':>8} "
              f"{'redis MB':>9} {'keys':>6} {'stale %':>7} {'log MB':>7} {'p50 ms':>7} {'p99 ms':>7}"
              "  CPU % "
              + " ".join(cpu_names))
        samples: list[Sample] = []
        last_pub = last_dlv = 0
        last_hist = [0] * LATENCY_BINS
        last_cpu = {name: cpu_s(pid) for name, pid in pids.items()}
        last_t = 0.0
        while any(p.is_alive() for p in bench):
            elapsed = time.monotonic() - start
            await asyncio.sleep((elapsed // args.interval + 1) * args.interval - elapsed)
            now = time.monotonic() - start
            used = int((await redis.info("memory"))["used_memory"])
            info = await redis.info("all")
            keys = int(info.get("db0", {}).get("keys", 0))
            stale = float(info.get("expired_stale_perc", 0.0))
            cpu = {name: cpu_s(pid) for name, pid in pids.items()}
            rss = {name: rss_mb(pid) for name, pid in pids.items()}
            samples.append(Sample(now, used, pub_counts[PUBLISHED], rss, cpu))
            hist = [sum(h[i] for h in latencies) for i in range(LATENCY_BINS)]
            window = [a - b for a, b in zip(hist, last_hist, strict=True)]
            pub = pub_counts[PUBLISHED] - last_pub
            dlv = sum(r[DELIVERED] for r in reader_counts) - last_dlv
            span = now - last_t
            shares = " ".join(f"{(cpu[n] - last_cpu[n]) / span * 100:.0f}" for n in cpu_names)
            print(f"{now:6.0f} {pub / span:7.0f} {dlv / span:7.0f} {pub_counts[LIVE]:5d} "
                  f"{rss['worker']:9.1f} {rss['edge']:8.1f} {used / 1e6:9.1f} {keys:6d} {stale:7.1f} "
                  f"{size_mb(db):7.1f} "
                  f"{percentile(window, 0.5):7.0f} {percentile(window, 0.99):7.0f}  {shares}",
                  flush=True)
            last_pub, last_dlv, last_hist, last_cpu, last_t = (
                pub_counts[PUBLISHED], last_dlv + dlv, hist, cpu, now)
            for child, name in zip(children[1:], ("worker", "edge"), strict=True):
                if child.poll() is not None:
                    raise SystemExit(f"{name} exited with {child.returncode}")
        for process in bench:
            if process.exitcode:
                raise SystemExit(f"{process.name} exited with {process.exitcode}")
        await census(redis)
        report(args, samples, baseline, reader_counts, db)
    finally:
        for process in bench:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)
        for child in reversed(children):
            child.terminate()
        for child in reversed(children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=30)
        await redis.aclose()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="events/s over all runs")
    parser.add_argument("--runs", type=int, default=60, help="runs streaming at once")
    parser.add_argument("--deltas", type=int, default=400, help="text deltas per run")
    parser.add_argument("--grace", type=int, default=60, help="bus grace (s)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between lines")
    parser.add_argument("--tick", type=float, default=0.05, help="publisher pacing (s)")
    parser.add_argument("--readers", type=int, default=1, help="reader processes (SSE clients)")
    parser.add_argument("--resume-every", type=int, default=5, help="one raw client in N resumes")
    parser.add_argument("--shaped", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args()


def main() -> None:
    args = parse()
    work = Path(tempfile.mkdtemp(prefix="runwire-soak-"))
    try:
        asyncio.run(soak(args, work))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
