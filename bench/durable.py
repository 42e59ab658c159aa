"""Durable Streams reads beside the edge's own SSE, same run, same edge process, measured in one run.

Run: ``.venv/bin/python bench/durable.py [--events 10000] [--clients 8] [--rounds 3] [--json]``

A real Redis (started on a free port unless ``--bus`` is given) holds one
finished run of ``--events`` events (deltas, a tool call every 50, running and
done) in its raw delivery stream — the hot tier, as workers leave it; the
replay log has it too. The edge (``create_app`` on uvicorn with uvloop and
httptools, the GC settings of ``runwire edge``) runs in its own process; the
readers run in this one, ``--clients`` at a time, on raw asyncio sockets that
count bytes and ``"seq"`` keys (no JSON parsing on the client side).

Figures, each the median of ``--rounds`` rounds:

* ``ds_catch_ups_per_s`` / ``ds_catch_up_events_per_s``: whole-run Durable
  Streams catch-ups — ``GET …?offset=-1``, then each ``Stream-Next-Offset``
  until ``Stream-Closed`` (``history_batch`` = 1000 events an answer, so 10
  requests for 10 000 events) — by ``--clients`` concurrent readers.
* ``ds_sse_deliveries_per_s``: events delivered per second to ``--clients``
  readers of ``…?offset=-1&live=sse`` reading the run to its end.
* ``edge_sse_deliveries_per_s``: the same readers on the edge's own
  ``/v1/runs/{id}/stream`` (SSE, ``Last-Event-ID`` resume) — the peer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runwire.bus import open_bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.store import open_store

RUN = "bench-ds"


def serve(bus_url: str, store_url: str, port: int) -> None:
    """The server role: runwire's edge on uvicorn (uvloop, httptools)."""
    import uvicorn
    import uvloop

    from runwire.edge import EdgeSettings, create_app
    from runwire.workers.commands.edge import tune_gc

    async def main() -> None:
        async with open_bus(bus_url) as bus, open_store(store_url) as store:
            app = create_app(bus, store, EdgeSettings())
            tune_gc()
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="none",
                                    http="httptools", timeout_graceful_shutdown=1)
            await uvicorn.Server(config).serve()

    uvloop.run(main())


def make_run(count: int) -> list[Event]:
    events: list[Event] = []
    for seq in range(1, count + 1):
        if seq == 1:
            kind, payload = "run.lifecycle", {"state": "running"}
        elif seq == count:
            kind, payload = "run.lifecycle", {"state": "done"}
        elif seq % 50 == 0:
            kind, payload = "tool.start", {"call_id": f"c{seq}", "tool": "search", "input": {"q": "x"}}
        else:
            kind, payload = "text.delta", {"text": f"token {seq} "}
        events.append(envelope.make(kind, payload, id=f"01J{seq:023d}", ts=envelope.now_ts(), run_id=RUN, seq=seq))
    return events


async def request(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 GET on a fresh connection, read to the end: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read(-1)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in headers.items()}
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return int(lines[0].split()[1]), headers, body


def dechunk(body: bytes) -> bytes:
    out: list[bytes] = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2:]
    return b"".join(out)


async def ds_catch_up(port: int) -> int:
    """A whole-run catch-up; the events read."""
    offset, events = "-1", 0
    while True:
        status, headers, body = await request(port, f"/v1/ds/runs/{RUN}?detail=full&offset={offset}")
        assert status == 200, status
        events += body.count(b'"seq":')
        offset = headers["stream-next-offset"]
        if headers.get("stream-closed") == "true":
            return events


async def sse_read(port: int, path: str) -> int:
    status, _, body = await request(port, path)
    assert status == 200, status
    return body.count(b'"seq":')


async def rounds(clients: int, count: int, one: Any) -> tuple[float, int]:
    """``clients`` concurrent readers doing ``one`` ``count`` times in all: (seconds, events)."""
    queue = list(range(count))
    total = 0

    async def worker() -> None:
        nonlocal total
        while queue:
            queue.pop()
            got = await one()  # not `total += await …`: that reads total before the await
            total += got

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - started, total


async def measure(port: int, events: int, clients: int, rounds_n: int) -> dict[str, Any]:
    catch_ups: list[float] = []
    catch_up_events: list[float] = []
    ds_sse: list[float] = []
    edge_sse: list[float] = []
    per_round = clients * 4
    for _ in range(rounds_n):
        seconds, got = await rounds(clients, per_round, lambda: ds_catch_up(port))
        assert got == per_round * events, (got, per_round * events)
        catch_ups.append(per_round / seconds)
        catch_up_events.append(got / seconds)
        seconds, got = await rounds(clients, clients * 2, lambda: sse_read(
            port, f"/v1/ds/runs/{RUN}?detail=full&offset=-1&live=sse"))
        assert got == clients * 2 * events, got
        ds_sse.append(got / seconds)
        seconds, got = await rounds(clients, clients * 2, lambda: sse_read(
            port, f"/v1/runs/{RUN}/stream?detail=full"))
        assert got == clients * 2 * events, got
        edge_sse.append(got / seconds)
    return {
        "events": events,
        "clients": clients,
        "ds_catch_ups_per_s": round(statistics.median(catch_ups), 1),
        "ds_catch_up_events_per_s": round(statistics.median(catch_up_events)),
        "ds_sse_deliveries_per_s": round(statistics.median(ds_sse)),
        "edge_sse_deliveries_per_s": round(statistics.median(edge_sse)),
    }


async def prepare(bus_url: str, store_url: str, events: int) -> None:
    run = make_run(events)
    async with open_bus(bus_url) as bus, open_store(store_url) as store:
        for start in range(0, events, 1000):
            await bus.append((RUN, "raw"), run[start:start + 1000])
        await store.append(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["bench", "server"], default="bench")
    parser.add_argument("--bus", default=None, help="Redis URL (default: start redis-server on a free port)")
    parser.add_argument("--store", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.bus, args.store, args.port)
        return
    redis = None
    bus_url = args.bus
    if bus_url is None:
        from tests.services import RedisServer

        redis = RedisServer()
        redis.start()
        bus_url = redis.url
    bus_url += ("&" if "?" in bus_url else "?") + f"maxlen={args.events * 2}"
    store_url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'replay.db'}"
    from tests.services import free_port, wait_port

    port = free_port()
    server = None
    try:
        asyncio.run(prepare(bus_url, store_url, args.events))
        server = subprocess.Popen([sys.executable, __file__, "--role", "server", "--bus", bus_url,
                                   "--store", store_url, "--port", str(port)])
        wait_port(port, 15.0)
        result = asyncio.run(measure(port, args.events, args.clients, args.rounds))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if redis is not None:
            redis.close()
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:28}{value:>14}")
    ratio = result["ds_sse_deliveries_per_s"] / max(1, result["edge_sse_deliveries_per_s"])
    print(f"{'ds sse / edge sse':28}{ratio:>14.2f}×")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
