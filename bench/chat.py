"""AI SDK chat resume: one 10 000-event run replayed over the edge's three ways, same run.

    .venv/bin/python bench/chat.py                 # memory bus, SQLite replay log, 5 repeats
    .venv/bin/python bench/chat.py --redis redis://localhost:6379/0 --json

The run (text deltas with a tool call every 50 events, then ``done``) is written
as a worker would (replay log, raw and shaped delivery streams) and served by one
edge on uvicorn in this process; each client read runs in a process of its own.

* **run SSE** — ``GET /v1/runs/{id}/stream?format=ai-sdk&detail=full``: the edge's own stream.
* **thread SSE** — ``GET /v1/threads/{thread}/stream?detail=full``: what
  ``DefaultChatTransport.reconnectToStream`` reads (the same frames, found by thread).
* **WS resume** — ``WS /v1/threads`` ``resume`` without ``lastSequence``: every
  chunk wrapped in a ``chunk`` frame with its sequence (what ``WebSocketChatTransport``
  reads), one WebSocket message per chunk.

Figures: chunks/s for the whole replay and milliseconds to the first chunk, medians
of ``--repeats``. The run stays unfinished while it is read (a thread's active run),
so each read ends when it has every chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import websockets  # noqa: E402

from runwire.bus import open_bus  # noqa: E402
from runwire.core import envelope  # noqa: E402
from runwire.core.envelope import Event  # noqa: E402
from runwire.store import open_store  # noqa: E402
from tests.edge.harness import serve_edge  # noqa: E402

RUN, THREAD = "run-bench-chat", "chat-bench"


def events(count: int) -> list[Event]:
    out: list[Event] = []
    for seq in range(1, count + 1):
        ts = envelope.now_ts()
        fields: dict[str, Any] = {"id": f"evt_{seq:026d}", "ts": ts, "run_id": RUN, "seq": seq,
                                  "thread_id": THREAD}
        if seq == 1:
            out.append(envelope.make("run.lifecycle", {"state": "running"}, **fields))
        elif seq % 50 == 0:
            out.append(envelope.make("tool.start", {"call_id": f"c{seq}", "tool": "grep", "input": {"q": "x"}},
                                     **fields))
        elif seq % 50 == 1:
            out.append(envelope.make("tool.end", {"call_id": f"c{seq - 1}", "ok": True, "output": "hit"},
                                     **fields))
        else:
            out.append(envelope.make("text.delta", {"text": f"word{seq} "}, **fields))
    return out


async def sse(base: str, path: str, want: int) -> tuple[float, float]:
    """(seconds to the first chunk, seconds for ``want`` chunks)."""
    started = time.perf_counter()
    first = 0.0
    got = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as http, http.stream("GET", path) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                got += 1
                if got == 1:
                    first = time.perf_counter() - started
                if got >= want:
                    break
    return first, time.perf_counter() - started


async def ws(base: str, want: int) -> tuple[float, float]:
    started = time.perf_counter()
    first = 0.0
    got = 0
    async with websockets.connect(base.replace("http://", "ws://") + "/v1/threads?detail=full",
                                  max_size=None) as sock:
        await sock.send(json.dumps({"type": "resume", "requestId": "b", "id": THREAD,
                                    "headers": {}, "body": {}, "metadata": None}))
        while got < want:
            if json.loads(await sock.recv())["type"] == "chunk":
                got += 1
                if got == 1:
                    first = time.perf_counter() - started
    return first, time.perf_counter() - started


async def main(args: argparse.Namespace) -> dict[str, Any]:
    run = events(args.events)
    with tempfile.TemporaryDirectory() as tmp:
        async with open_bus(args.redis or "memory://") as bus, \
                open_store(f"sqlite:///{tmp}/replay.db") as store:
            await store.append(run)
            for view in ("raw", "shaped"):
                await bus.append((RUN, view), run)  # type: ignore[arg-type]
            async with serve_edge(bus, store) as edge:
                want = await count_chunks(edge.url)
                results: dict[str, list[tuple[float, float]]] = {"run SSE": [], "thread SSE": [], "WS resume": []}
                for _ in range(args.repeats):
                    for name in results:
                        results[name].append(await client(name, edge.url, want))
    report: dict[str, Any] = {"events": args.events, "chunks": want, "bus": args.redis or "memory://"}
    for name, samples in results.items():
        first = statistics.median(s[0] for s in samples)
        total = statistics.median(s[1] for s in samples)
        report[name] = {"chunks_per_s": round(want / total), "first_chunk_ms": round(first * 1000, 1)}
    return report


async def client(name: str, base: str, want: int) -> tuple[float, float]:
    """One read by a client in a process of its own (so it does not share the edge's CPU)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", name, base, str(want), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    first, total = json.loads(out)
    return float(first), float(total)


async def read_as(name: str, base: str, want: int) -> tuple[float, float]:
    if name == "run SSE":
        return await sse(base, f"/v1/runs/{RUN}/stream?format=ai-sdk&detail=full", want)
    if name == "thread SSE":
        return await sse(base, f"/v1/threads/{THREAD}/stream?detail=full", want)
    return await ws(base, want)


async def count_chunks(base: str) -> int:
    """The run's chunk count: a WS resume read until a quiet second."""
    got = 0
    async with websockets.connect(base.replace("http://", "ws://") + "/v1/threads?detail=full",
                                  max_size=None) as sock:
        await sock.send(json.dumps({"type": "resume", "requestId": "c", "id": THREAD,
                                    "headers": {}, "body": {}, "metadata": None}))
        while True:
            try:
                frame = json.loads(await asyncio.wait_for(sock.recv(), 1.0))
            except TimeoutError:
                return got
            got += frame["type"] == "chunk"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        print(json.dumps(asyncio.run(read_as(sys.argv[2], sys.argv[3], int(sys.argv[4])))))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis", help="a Redis URL for the bus (default: memory://)")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    figures = asyncio.run(main(options))
    if options.json:
        print(json.dumps(figures))
    else:
        print(f"{figures['events']} events → {figures['chunks']} AI SDK chunks, bus {figures['bus']}")
        for name in ("run SSE", "thread SSE", "WS resume"):
            f = figures[name]
            print(f"  {name:<11} {f['chunks_per_s']:>9,} chunks/s   first chunk {f['first_chunk_ms']} ms")
