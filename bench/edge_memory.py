"""Where an edge's memory per client goes: tracemalloc snapshots of a live ``runwire`` edge, per part.

Run: ``.venv/bin/python bench/edge_memory.py [--clients N] [--events E] [--top K] [--json]``

Starts its own Redis, the edge of ``bench/edge.py`` (``--role server``: ``create_app`` on uvicorn
with uvloop and httptools) with tracemalloc on, and a client process of raw SSE readers
(``bench/edge.py --role clients``). Snapshots are taken with no client, after ``N`` clients
connected to one run, and after ``E`` events were delivered to all of them; the difference is
divided by ``N`` and grouped by the line that allocated it (``--top`` lines) and by module, so
the per-client bytes of each part (uvicorn/httptools' connection objects, the hub's queues, the
feed's frames, asyncio's transports) can be read off. RSS growth per client is printed beside
it: tracemalloc sees Python allocations only, RSS also the allocator's slack and C buffers.
tracemalloc slows the edge several times: only the bytes are figures here, not times.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import edge as edge_bench  # noqa: E402

from runwire.bus import open_bus  # noqa: E402
from tests.services import RedisServer, free_port  # noqa: E402

SNAPSHOT_ENV = "RUNWIRE_BENCH_TRACEMALLOC"
"""A path prefix: the server role starts tracemalloc and writes ``<prefix>.<n>`` on each SIGUSR1."""


def traced_server(impl: str, bus_url: str, port: int, prefix: str) -> None:
    """``bench/edge.py``'s server role, with a tracemalloc snapshot written on each SIGUSR1."""
    tracemalloc.start(int(os.environ.get("RUNWIRE_BENCH_FRAMES", "1")))
    taken = iter(range(1 << 30))

    def dump(*_: object) -> None:
        path = f"{prefix}.{next(taken)}"
        gc.collect()  # live objects only: the edge's GC thresholds let cyclic garbage wait (workers/process.py)
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, dump)
    edge_bench.serve(impl, bus_url, port)


def snapshot(server: subprocess.Popen[bytes], prefix: str, index: int) -> tracemalloc.Snapshot:
    server.send_signal(signal.SIGUSR1)
    path = Path(f"{prefix}.{index}")
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the edge wrote no snapshot to {path}")
        time.sleep(0.05)
    return tracemalloc.Snapshot.load(str(path))


def per_client(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, clients: int, key: str,
               top: int) -> list[dict[str, Any]]:
    stats = after.compare_to(before, key)
    rows = [{"where": str(s.traceback[0]) if key == "lineno" else s.traceback[0].filename,
             "bytes_per_client": round(s.size_diff / clients, 1), "blocks_per_client": round(s.count_diff / clients, 2)}
            for s in stats if s.size_diff > 0]
    rows.sort(key=lambda r: -r["bytes_per_client"])
    return rows[:top]


def total(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> int:
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


_seqs = edge_bench.Seqs()


async def deliver(bus_url: str, run_id: str, events: int) -> None:
    async with open_bus(bus_url) as bus:
        seqs = _seqs
        for first in range(0, events, 100):
            count = min(100, events - first)
            await bus.append((run_id, "raw"), [edge_bench.make_event(run_id, s) for s in seqs.take(run_id, count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20, help="events delivered to every client before the last snapshot")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", default="bench", choices=["bench", "server"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bus", default="")
    parser.add_argument("--prefix", default="")
    args = parser.parse_args()
    if args.role == "server":
        traced_server("runwire", args.bus, args.port, args.prefix)
        return
    work = Path(tempfile.mkdtemp(prefix="edge-memory-"))
    port = free_port()
    redis = RedisServer("--maxclients", "30000")
    redis.start()
    bus_url = redis.url
    prefix = str(work / "snap")
    server = clients = None
    try:
        server = subprocess.Popen([sys.executable, __file__, "--role", "server", "--bus", bus_url,
                                   "--port", str(port), "--prefix", prefix])
        edge_bench.wait_listening(port, 60.0)
        time.sleep(1.0)  # the edge's own start-up allocations settle before the first snapshot
        asyncio.run(deliver(bus_url, edge_bench.MAIN_RUN, 1))  # a live run: clients join it, not wait for it
        empty = snapshot(server, prefix, 0)
        rss0 = edge_bench.rss_kib(server.pid)
        clients = edge_bench.Proc(["--role", "clients", "--port", str(port),
                                   f"/v1/runs/{edge_bench.MAIN_RUN}/stream*{args.clients}"])
        clients.first()
        time.sleep(1.0)
        connected = snapshot(server, prefix, 1)
        rss1 = edge_bench.rss_kib(server.pid)
        asyncio.run(deliver(bus_url, edge_bench.MAIN_RUN, args.events))
        want = (1 + args.events) * args.clients
        deadline = time.monotonic() + 120
        while clients.ask()["frames"] < want and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = clients.ask()["alive"]
        delivered = snapshot(server, prefix, 2)
        rss2 = edge_bench.rss_kib(server.pid)
        n = args.clients
        out = {
            "clients": n, "events": args.events, "alive_at_the_end": alive,
            "rss_kib_per_client_connected": round((rss1 - rss0) / n, 2),
            "rss_kib_per_client_after_events": round((rss2 - rss0) / n, 2),
            "traced_bytes_per_client_connected": round(total(empty, connected) / n),
            "traced_bytes_per_client_after_events": round(total(empty, delivered) / n),
            "by_module": per_client(empty, delivered, n, "filename", args.top),
            "by_line": per_client(empty, delivered, n, "lineno", args.top),
        }
        if args.json:
            print(json.dumps(out))
            return
        for name in [k for k in out if not isinstance(out[k], list)]:
            print(f"{name:40} {out[name]}")
        for part in ("by_module", "by_line"):
            print(f"\n{part} (bytes, blocks per client):")
            for row in out[part]:
                print(f"  {row['bytes_per_client']:>9} {row['blocks_per_client']:>6}  {row['where']}")
    finally:
        if clients is not None:
            clients.stop()
        if server is not None:
            server.terminate()
            server.wait(10)
        redis.close()


if __name__ == "__main__":
    main()
