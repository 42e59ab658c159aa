"""Soak: the whole pipeline at a steady load for N minutes, measured the way an operator sizes it.

One ``runwire worker`` and one ``runwire edge`` process on a Redis of the
bench's own (``redis-server`` on a free port) and a SQLite replay log; this
process runs an SDK publisher keeping ``--runs`` runs streaming text deltas
at ``--rate`` events/s in all (a run of ``--deltas`` deltas ends ``done``
and a new one starts), and an SSE client on every run (raw, and shaped with
``--shaped``); one raw client in ``--resume-every`` drops its connection
halfway and resumes with ``Last-Event-ID``.

Every ``--interval`` seconds it prints: events published and delivered per
second, the RSS of the worker and the edge, Redis ``used_memory``, the
replay log's size on disk, live runs, and the publish → client latency p50
and p99 of the raw deltas delivered in the interval. At the end: events
lost, doubled or out of order (every raw client's ids against what was
published for its run), and the steady-state Redis bytes per live run
(``used_memory`` above the empty server's, averaged from the end of
warm-up — the first runs' length plus the grace — to the end, divided by
the runs streaming), with the largest deviation from that mean, and the RSS
range of the worker and the edge over the same time.

    .venv/bin/python bench/soak.py --minutes 10 --rate 2000 --runs 60

Not a test: it reports figures (docs/benchmarks.md § Soak).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from pathlib import Path

import msgspec
from redis.asyncio import Redis

from runwire.core.envelope import ts_ms
from runwire.sdk.publisher import Publisher

RUNWIRE = str(Path(sys.executable).parent / "runwire")


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


def size_mb(path: Path) -> float:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += Path(f"{path}{suffix}").stat().st_size
    return total / 1e6


@dataclass
class Tally:
    published: dict[str, list[str]] = field(default_factory=dict)
    received: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    published_n: int = 0
    delivered_n: int = 0
    shaped_n: int = 0
    resumes: int = 0
    live: int = 0
    finished: set[str] = field(default_factory=set)
    client_errors: int = 0


_decoder = msgspec.json.Decoder()


async def sse(port: int, run_id: str, view: str, after: int | None,
              on_event: object, stop_after: int | None = None) -> int:
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
                on_event(event)  # type: ignore[operator]
                count += 1
                if stop_after is not None and count >= stop_after:
                    break
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return int(last)


async def watch(port: int, run_id: str, tally: Tally, resume_at: int | None, shaped: bool) -> None:
    got = tally.received.setdefault(run_id, [])

    def raw(event: dict[str, object]) -> None:
        got.append((int(event["seq"]), str(event["id"])))  # type: ignore[call-overload]
        tally.delivered_n += 1
        if event.get("type") == "text.delta":
            tally.latencies.append(time.time() * 1000 - ts_ms(str(event["ts"])))

    def shaped_event(event: dict[str, object]) -> None:
        tally.shaped_n += 1

    async def raw_client() -> None:
        last = await sse(port, run_id, "full", None, raw, stop_after=resume_at)
        if resume_at is not None:
            tally.resumes += 1
            await sse(port, run_id, "full", last, raw)

    try:
        jobs = [raw_client()]
        if shaped:
            jobs.append(sse(port, run_id, "shaped", None, shaped_event))  # type: ignore[arg-type]
        await asyncio.gather(*jobs)
    except (OSError, RuntimeError) as exc:
        tally.client_errors += 1
        print(f"client of {run_id}: {exc}", file=sys.stderr)


async def one_run(publisher: Publisher, port: int, tally: Tally, args: argparse.Namespace,
                  index: int) -> None:
    run_id = f"soak-{uuid.uuid4().hex[:12]}"
    ids = tally.published.setdefault(run_id, [])
    run = publisher.run(run_id)
    ids.append((await run.emit("run.lifecycle", {"state": "running"})).id)
    resume_at = args.deltas // 2 if index % args.resume_every == 0 else None
    client = asyncio.create_task(watch(port, run_id, tally, resume_at, args.shaped))
    per_tick = args.rate / args.runs * args.tick
    owed = 0.0
    sent = 0
    tally.live += 1
    try:
        while sent < args.deltas:
            owed += per_tick
            while owed >= 1 and sent < args.deltas:
                ids.append((await run.emit("text.delta", {"text": f"token {sent} "})).id)
                sent += 1
                owed -= 1
                tally.published_n += 1
            await asyncio.sleep(args.tick)
        ids.append((await run.finish("done")).id)
    finally:
        tally.live -= 1
    await client
    tally.finished.add(run_id)


async def keep_streaming(publisher: Publisher, port: int, tally: Tally, args: argparse.Namespace,
                         until: float) -> None:
    started = 0

    async def slot(offset: int) -> None:
        nonlocal started
        await asyncio.sleep(offset * args.tick * 3 / args.runs)  # staggered starts
        while time.monotonic() < until:
            started += 1
            await one_run(publisher, port, tally, args, started)

    await asyncio.gather(*(slot(i) for i in range(args.runs)))


def check(tally: Tally) -> tuple[int, int, int]:
    lost = doubled = disorder = 0
    for run_id in tally.finished:
        published = tally.published[run_id]
        got = tally.received.get(run_id, [])
        ids = [i for _, i in got]
        seqs = [s for s, _ in got]
        doubled += len(ids) - len(set(ids))
        lost += len(set(published) - set(ids))
        disorder += sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a)
        if ids and [i for i in ids if i in set(published)] != [i for i in published if i in set(ids)]:
            disorder += 1
    return lost, doubled, disorder


async def census(redis: Redis) -> None:
    """Redis memory by kind of key at the end (``MEMORY USAGE`` of every key: small servers only)."""
    kinds: dict[str, list[int]] = {}
    async for name in redis.scan_iter(count=1000):
        text = name.decode()
        kind = ("ingest" if ":ingest:" in text and not text.endswith(":lost")
                else text.rsplit(":", 1)[-1] if "}:" in text else text)
        if ":meta:" in text:
            kind = "meta"
        elif ":lease:" in text:
            kind = "lease"
        usage = await redis.memory_usage(name) or 0
        kinds.setdefault(kind, []).append(int(usage))
    parts = ", ".join(f"{kind} {len(sizes)} keys {sum(sizes) / 1e6:.2f} MB"
                      for kind, sizes in sorted(kinds.items(), key=lambda kv: -sum(kv[1])))
    print(f"Redis keys at the end: {parts}")


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="runwire-soak-"))
    redis_port, edge_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    redis_proc = spawn(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly",
                        "no", "--dir", str(work)], None, env)
    url = f"redis://127.0.0.1:{redis_port}/0?grace={args.grace}"
    db = work / "replay.db"
    store = f"sqlite:///{db}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    redis = Redis.from_url(f"redis://127.0.0.1:{redis_port}/0")
    try:
        async with asyncio.timeout(20):
            while True:
                with contextlib.suppress(OSError, Exception):
                    await redis.ping()
                    break
                await asyncio.sleep(0.1)
        baseline = int((await redis.info("memory"))["used_memory"])
        procs["worker"] = spawn([RUNWIRE, "worker", "--bus", url, "--store", store,
                                 "--data-dir", str(work)], work / "worker.log", env)
        procs["edge"] = spawn([RUNWIRE, "edge", "--bus", url, "--store", store,
                               "--port", str(edge_port)], work / "edge.log", env)
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(OSError):
                    _r, w = await asyncio.open_connection("127.0.0.1", edge_port)
                    w.close()
                    break
                await asyncio.sleep(0.2)
        tally = Tally()
        start = time.monotonic()
        until = start + args.minutes * 60
        print(f"soak: {args.runs} runs × {args.deltas} deltas, {args.rate:g} events/s, "
              f"grace {args.grace}s, {args.minutes:g} min; Redis empty {baseline / 1e6:.1f} MB")
        print(f"{'t s':>6} {'pub/s':>7} {'dlv/s':>7} {'live':>5} {'worker MB':>9} {'edge MB':>8} "
              f"{'redis MB':>9} {'log MB':>7} {'p50 ms':>7} {'p99 ms':>7}")
        samples: list[tuple[float, int]] = []
        rss: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
        async with Publisher.connect(url, linger_ms=5.0, delivery_timeout=120) as publisher:
            streaming = asyncio.create_task(keep_streaming(publisher, edge_port, tally, args, until))
            last_pub = last_dlv = 0
            while not streaming.done():
                await asyncio.wait([streaming], timeout=args.interval)
                now = time.monotonic() - start
                used = int((await redis.info("memory"))["used_memory"])
                samples.append((now, used))
                for name, proc in procs.items():
                    rss[name].append((now, rss_mb(proc.pid)))
                lat, tally.latencies = tally.latencies, []
                lat.sort()
                p50 = lat[len(lat) // 2] if lat else 0.0
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
                pub, dlv = tally.published_n - last_pub, tally.delivered_n - last_dlv
                last_pub, last_dlv = tally.published_n, tally.delivered_n
                print(f"{now:6.0f} {pub / args.interval:7.0f} {dlv / args.interval:7.0f} "
                      f"{tally.live:5d} {rss_mb(procs['worker'].pid):9.1f} "
                      f"{rss_mb(procs['edge'].pid):8.1f} {used / 1e6:9.1f} {size_mb(db):7.1f} "
                      f"{p50:7.1f} {p99:7.1f}", flush=True)
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        raise SystemExit(f"{name} exited with {proc.returncode}")
            await streaming
        await census(redis)
        lost, doubled, disorder = check(tally)
        # steady state: after the first runs ended and the grace of the first finished ones passed
        warm = args.deltas / (args.rate / args.runs) + args.grace + 2 * args.interval
        second_half = [used for t, used in samples if t >= warm and t <= args.minutes * 60]
        steady = statistics.mean(second_half) if second_half else 0.0
        spread = (max(abs(u - steady) for u in second_half) / steady * 100
                  if second_half else 0.0)
        print(f"runs finished {len(tally.finished)}, raw events delivered {tally.delivered_n}, "
              f"shaped {tally.shaped_n}, resumes {tally.resumes}, client errors {tally.client_errors}")
        print(f"lost {lost}, doubled {doubled}, out of order {disorder}")
        print(f"Redis used_memory after {warm:.0f} s (warm-up + grace): mean {steady / 1e6:.1f} MB,"
              f" within ±{spread:.1f} %; per live run {(steady - baseline) / args.runs / 1e3:.1f} KB"
              f" (above the empty server's {baseline / 1e6:.1f} MB)")
        for name in procs:
            sizes = [mb for t, mb in rss[name] if t >= warm]
            if sizes:
                print(f"{name} RSS after warm-up: {min(sizes):.1f} – {max(sizes):.1f} MB")
        print(f"replay log {size_mb(db):.1f} MB for {tally.delivered_n} raw events "
              f"({size_mb(db) * 1e6 / max(1, tally.delivered_n):.0f} bytes/event incl. index)")
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        await redis.aclose()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="events/s over all runs")
    parser.add_argument("--runs", type=int, default=60, help="runs streaming at once")
    parser.add_argument("--deltas", type=int, default=400, help="text deltas per run")
    parser.add_argument("--grace", type=int, default=60, help="bus grace (s)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between lines")
    parser.add_argument("--tick", type=float, default=0.05, help="publisher pacing (s)")
    parser.add_argument("--resume-every", type=int, default=5, help="one raw client in N resumes")
    parser.add_argument("--shaped", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
