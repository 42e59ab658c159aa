"""Edge fan-out: runwire's edge vs a naive per-client SSE server, measured in the same run.

Run: ``.venv/bin/python bench/edge.py [--clients N] [--full] [--json]``

Everything talks over loopback through a real Redis (started on a free port
unless ``--bus`` is given). Three kinds of process:

* the **edge** under test (``--role server``): runwire's ``create_app`` —
  one multiplexed bus reader, one encoder per feed, pre-framed SSE bytes —
  or the **naive** server users write by hand: ``sse-starlette``'s
  ``EventSourceResponse`` with one bus read loop (``Bus.tail`` on its own
  stream) and one JSON encode per client per event. Both on uvicorn with
  uvloop + httptools and the GC settings of ``runwire edge``.
* **clients** (``--role clients``, a separate process): raw asyncio SSE
  readers that count frames; probe clients parse the publish time stamped
  into control events to measure publish→client latency.
* this process: starts Redis, the servers and the clients, publishes into
  the delivery streams with ``Bus.append`` (as workers do), and measures.

Phases, per implementation (in this order, so no phase waits out the
backlog of another):

1. ``clients`` SSE connections to one run (plus 2 on each of 50 background
   runs); ``rss_per_client_kib`` = growth of the server's RSS divided by the
   connections, ``rss_total_per_client_kib`` = its whole RSS (its start-up's
   too) divided by them.
2. Resume: a fresh connection with ``Last-Event-ID`` into a run with 2 000
   events of history; ``resume_first_event_ms`` = median time to its first
   event (20 tries) while the clients stay connected.
3. Control latency: 5 000 text deltas/s spread over the 50 background runs
   while a ``tool.start`` stamped with its publish time goes 10×/s to a run
   watched by 20 probe clients (the ``clients`` others stay connected);
   ``control_latency_p50_ms``/``_p99_ms`` = publish → client.
4. Saturation: 4 000 000 / ``clients`` events appended to the main run as
   fast as one producer can; ``deliveries_per_s`` = frames received by all
   clients per second until every client has every event (or nothing arrived
   for 2 s, or 20 s passed). The runwire edge drops deltas for clients that
   fall behind (Koder agent stream §4 R4); drops are not counted as deliveries. Every phase waits
   (bounded) until the previous one's backlog is out.
5. Fan-out latency: as 3, with the control events on the main run, written
   to every one of its ``clients``, each of which stamps when it got each:
   ``fanout_latency_p50_ms``/``_p99_ms`` over every (client, event),
   ``fanout_last_client_p50_ms``/``_max_ms`` over each event's last client
   to get it; ``fanout_cpu_us_per_delivery`` = the server's CPU time in the
   phase ÷ the frames the clients received in it (background runs' too), and
   ``fanout_cpu_us_per_client_write`` ÷ the reads they made (a write to a
   client that fell behind carries several frames; loopback hands a write
   over as one read).

``--json`` prints one object; the naive figures carry the ``naive_`` prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from cputime import import_code  # noqa: E402

import_code()  # the tree $RUNWIRE_CODE names (bench/alternate.py), else this checkout

from runwire.bus import open_bus  # noqa: E402
from runwire.core import envelope  # noqa: E402
from runwire.core.envelope import Event  # noqa: E402
from tests.services import free_port  # noqa: E402
from tests.services import wait_port as wait_listening  # noqa: E402

MAIN_RUN = "bench-main"
RESUME_RUN = "bench-resume"
BACKGROUND_RUNS = 50
PROBES = 20
_T_NS = re.compile(rb'"t_ns":(\d+)')


# ---------------------------------------------------------------- servers
def serve(impl: str, bus_url: str, port: int, reuse_port: bool = False) -> None:
    """The server role: runwire's edge (as ``runwire edge`` serves it) or the naive one, on uvicorn
    (uvloop, httptools)."""
    import uvicorn

    async def main() -> None:
        async with open_bus(bus_url) as bus:
            if impl == "runwire":
                from runwire.edge import EdgeSettings, create_app
                from runwire.store import open_store

                store_path = Path(tempfile.mkdtemp()) / "replay.db"
                async with open_store(f"sqlite:///{store_path}") as store:
                    app = create_app(bus, store, EdgeSettings())
                    await _uvicorn(app, port, edge=True)
            else:
                await _uvicorn(naive_app(bus), port, edge=False)

    async def _uvicorn(app: Any, port: int, *, edge: bool) -> None:
        from runwire.edge.http.server import edge_config
        from runwire.workers.commands.edge import tune_gc

        tune_gc()  # as `runwire edge` does; applied to both servers alike
        options: dict[str, Any] = {"host": "127.0.0.1", "port": port, "log_level": "warning", "loop": "none",
                                   "backlog": 16384, "timeout_graceful_shutdown": 1}
        # runwire's edge as `runwire edge` serves it (its protocol: edge/http/server.py); the naive
        # one on uvicorn's own httptools protocol
        config = edge_config(app, **options) if edge else uvicorn.Config(app, http="httptools", **options)
        if reuse_port:  # one of several edge processes on the port, as `runwire edge --reuse-port`
            from runwire.workers.commands.edge import reuse_port_socket

            await uvicorn.Server(config).serve(sockets=[reuse_port_socket("127.0.0.1", port)])
            return
        await uvicorn.Server(config).serve()

    import uvloop

    profile = os.environ.get("RUNWIRE_BENCH_PROFILE")
    if not profile:
        uvloop.run(main())
        return
    import cProfile
    import signal

    profiler = cProfile.Profile()

    def dump(*_: object) -> None:  # the bench asks before it stops the server (uvicorn takes SIGTERM)
        profiler.disable()
        profiler.dump_stats(f"{profile}.{impl}")

    signal.signal(signal.SIGUSR2, dump)
    profiler.enable()
    try:
        uvloop.run(main())
    finally:
        dump()


def naive_app(bus: Any) -> Any:
    """The per-client implementation users write by hand: a read loop and an encode per client."""
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.routing import Route

    async def stream(request: Request) -> EventSourceResponse:
        run_id = request.path_params["run_id"]
        cursor = int(request.headers.get("last-event-id") or 0)

        async def events() -> Any:
            nonlocal cursor
            while True:
                batch = await bus.tail({(run_id, "raw"): cursor}, block_ms=1000)
                for _key, event in batch:
                    cursor = event.seq
                    yield {"id": str(event.seq), "data": json.dumps(envelope.to_builtins(event))}
                    if envelope.is_terminal(event):
                        return

        return EventSourceResponse(events(), ping=15)

    return Starlette(routes=[Route("/v1/runs/{run_id}/stream", stream)])


# ---------------------------------------------------------------- clients
class Counters:
    def __init__(self) -> None:
        self.frames = 0
        self.reads = 0
        """Chunks received (about one per server write: loopback delivers a write as one read)."""
        self.connected = 0
        self.latencies_ms: list[float] = []
        self.probe_all = False
        """Every client of the main run stamps latencies (the fan-out phase), not only its probes."""
        self.slowest_ms: dict[int, float] = {}
        """Per control event (its publish time), the latency of the last client to receive it."""


class SseCounter(asyncio.Protocol):
    """A raw SSE reader as a protocol callback (no task per read): counts frames, stamps probes."""

    def __init__(self, request: bytes, probe: bool, counters: Counters, main: bool = False) -> None:
        self.request = request
        self.probe = probe
        self.main = main
        self.counters = counters
        self.carry = b""
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]
        self.counters.connected += 1

    def data_received(self, chunk: bytes) -> None:
        counters = self.counters
        counters.frames += chunk.count(b"data: ")
        counters.reads += 1
        if self.probe or (self.main and counters.probe_all):
            now = time.time_ns()
            data = self.carry + chunk
            for match in _T_NS.finditer(data):
                sent = int(match.group(1))
                latency = (now - sent) / 1e6
                counters.latencies_ms.append(latency)
                if counters.probe_all and latency > counters.slowest_ms.get(sent, 0.0):
                    counters.slowest_ms[sent] = latency
            cut = data.rfind(b"\n")
            self.carry = data[cut + 1 :] if cut >= 0 else data[-256:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True


async def sse_client(port: int, path: str, after: int, probe: bool, counters: Counters, main: bool,
                     source: str | None = None) -> SseCounter:
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        f"Last-Event-ID: {after}\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(
        lambda: SseCounter(request, probe, counters, main), "127.0.0.1", port,
        local_addr=(source, 0) if source else None,
    )
    return protocol


async def client_role(port: int, specs: list[str], after: int, source: str | None = None) -> None:
    """Open connections (``path*count``), then answer ``report`` on stdin with JSON counters."""
    counters = Counters()
    readers: list[SseCounter] = []
    gate = asyncio.Semaphore(200)

    async def start(path: str, probe: bool, main: bool) -> None:
        async with gate:
            readers.append(await sse_client(port, path, after, probe, counters, main, source))

    openings = []
    for number, spec in enumerate(specs):
        path, _, count = spec.rpartition("*")
        for index in range(int(count)):
            probe = MAIN_RUN in path and "-bg-" not in path and index < PROBES
            openings.append(start(path, probe=probe, main=number == 0))
    await asyncio.gather(*openings)
    print(json.dumps({"connected": counters.connected}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        if line.strip() == "probe-all":
            counters.probe_all = True
        latencies, counters.latencies_ms = counters.latencies_ms, []
        slowest, counters.slowest_ms = list(counters.slowest_ms.items()), {}
        alive = sum(1 for r in readers if not r.closed)
        print(json.dumps({"frames": counters.frames, "reads": counters.reads, "alive": alive, "latencies_ms": latencies,
                          "slowest_ms": slowest}), flush=True)


# ---------------------------------------------------------------- orchestration
_ids = iter(range(1, 1 << 62))


def make_event(run_id: str, seq: int, kind: str = "text.delta", payload: dict[str, Any] | None = None) -> Event:
    return envelope.make(
        kind, payload or {"text": "token "}, id=f"01J{next(_ids):023d}", ts=envelope.now_ts(),
        run_id=run_id, seq=seq,
    )


class Proc:
    main = 0
    """Clients of the main run (client processes)."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, line: str = "report") -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def first(self) -> dict[str, Any]:
        assert self.proc.stdout
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def stop(self) -> None:
        if os.environ.get("RUNWIRE_BENCH_PROFILE") and "server" in self.proc.args:
            self.proc.send_signal(signal.SIGUSR2)  # the server's profile, written before it stops
            time.sleep(3)
        if self.proc.stdin:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            self.proc.kill()


CLIENTS_PER_PROCESS = 19_000
"""Client connections one client process opens (its file limit is the edge's: 20,000 here); each
process connects from its own loopback address (a source address has ~28,000 ephemeral ports)."""


class Load:
    """The client processes, answering as one: frames and reads summed, latencies joined, each
    event's last client the latest over all of them."""

    def __init__(self, port: int, main_path: str, clients: int, others: list[str]) -> None:
        count = max(1, -(-clients // CLIENTS_PER_PROCESS))
        shares = [clients // count + (index < clients % count) for index in range(count)]
        self.procs = [
            Proc(["--role", "clients", "--port", str(port), "--after", "0", "--source", f"127.0.0.{index + 1}",
                  f"{main_path}*{share}", *(others if index == 0 else [])])
            for index, share in enumerate(shares)
        ]
        self.main = 0
        self.proc = self.procs[0].proc

    def first(self) -> dict[str, Any]:
        return {"connected": sum(proc.first()["connected"] for proc in self.procs)}

    def ask(self, line: str = "report") -> dict[str, Any]:
        answers = [proc.ask(line) for proc in self.procs]
        slowest: dict[int, float] = {}
        for answer in answers:
            for sent, latency in answer["slowest_ms"]:
                slowest[sent] = max(latency, slowest.get(sent, 0.0))
        return {
            "frames": sum(a["frames"] for a in answers), "reads": sum(a["reads"] for a in answers),
            "alive": sum(a["alive"] for a in answers),
            "latencies_ms": [x for a in answers for x in a["latencies_ms"]],
            "slowest_ms": list(slowest.values()),
        }

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def sockets(pid: int) -> int:
    """Sockets process ``pid`` holds open."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            count += os.readlink(fd).startswith("socket:")
    return count


def cpu_s(pid: int) -> float:
    """User + system CPU time a process has used (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def wait_port(port: int) -> None:
    """Until a server listens on ``port`` (tests/services.py's wait, off the loop)."""
    await asyncio.to_thread(wait_listening, port, 15.0)


class Seqs:
    def __init__(self) -> None:
        self.next: dict[str, int] = {}

    def take(self, run_id: str, count: int) -> range:
        start = self.next.get(run_id, 1)
        self.next[run_id] = start + count
        return range(start, start + count)


async def saturate(bus: Any, seqs: Seqs, clients: Load, events: int, main_run: str) -> float:
    """Append ``events`` to the main run as fast as possible; deliveries/s until all are out.

    Bounded: stops waiting when nothing arrived for 2 s after the first frame
    (R4 drops mean not every frame arrives) or after 20 s.
    """
    before = clients.ask()["frames"]
    started = time.perf_counter()
    for first in range(0, events, 200):
        count = min(200, events - first)
        await bus.append((main_run, "raw"), [make_event(main_run, s) for s in seqs.take(main_run, count)])
    expected = before + events * clients.main
    frames, last_progress = before, started
    while time.perf_counter() - started < 20:
        if frames > before and time.perf_counter() - last_progress > 2:
            break
        await asyncio.sleep(0.1)
        now = clients.ask()["frames"]
        if now > frames:
            frames, last_progress = now, time.perf_counter()
        if frames >= expected:
            break
    return (frames - before) / max(1e-3, last_progress - started)


class Background:
    """The background runs' deltas: appended into their delivery streams, or with a publisher
    (``--through-worker``) into ingest, for a worker to sequence and append."""

    def __init__(self, bus: Any, seqs: Seqs, main_run: str, publisher: Any = None) -> None:
        self.bus = bus
        self.seqs = seqs
        self.ids = [f"{main_run}-bg-{index}" for index in range(BACKGROUND_RUNS)]
        self.runs = [publisher.run(run_id) for run_id in self.ids] if publisher is not None else None

    async def tick(self) -> None:
        if self.runs is not None:
            for run in self.runs:
                await run.emit("text.delta", {"text": "token "})
            return
        for run_id in self.ids:
            await self.bus.append((run_id, "raw"), [make_event(run_id, s) for s in self.seqs.take(run_id, 1)])

    async def published(self, limit_s: float = 30.0) -> None:
        """Until every background run has a first event in its delivery stream (through the worker
        when there is one), before their clients connect (see the control run's)."""
        if self.runs is None:
            await self.tick()
            return
        for run in self.runs:
            await run.emit("run.lifecycle", {"state": "running"})
        started = time.perf_counter()
        while time.perf_counter() - started < limit_s:
            bounds = [await self.bus.bounds((run_id, "raw")) for run_id in self.ids]
            if all(bounds):
                return
            await asyncio.sleep(0.1)
        raise SystemExit("the worker did not append the background runs' first events within 30 s")


async def control_latency(
    background: Background, seqs: Seqs, clients: Load, seconds: float, target: str
) -> dict[str, Any]:
    """5 000 deltas/s over the background runs, 10 control events/s to ``target`` (appended
    into its delivery stream); the clients' report after it (``latencies_ms``, and
    ``slowest_ms`` once they probe all)."""
    bus = background.bus
    clients.ask()  # reset latencies
    started = time.perf_counter()
    tick = 0
    while time.perf_counter() - started < seconds:
        tick += 1
        await background.tick()
        if tick % 10 == 0:
            (seq,) = seqs.take(target, 1)
            stamp = {"call_id": f"c{seq}", "tool": "probe", "input": {"t_ns": time.time_ns()}}
            await bus.append((target, "raw"), [make_event(target, seq, "tool.start", stamp)])
        due = started + tick * 0.01
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
    await asyncio.sleep(1.0)
    return clients.ask()


async def resume_first_event(port: int, tries: int = 20) -> float:
    samples: list[float] = []
    for attempt in range(tries):
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /v1/runs/{RESUME_RUN}/stream?detail=full HTTP/1.1\r\nHost: x\r\n"
            f"Last-Event-ID: {500 + attempt}\r\n\r\n".encode()
        )
        await writer.drain()
        buffer = b""
        while b"data: " not in buffer:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buffer += chunk
        samples.append((time.perf_counter() - started) * 1000)
        writer.close()
    return statistics.median(samples)


async def attached(port: int, total: int, limit_s: float = 60.0) -> None:
    """Wait (bounded) until the runwire edge has attached every client to its feed.

    A client the server has not attached yet when a phase starts would begin
    its catch-up after the hot tier was trimmed (nothing here writes the
    replay log), and get CONN-0002 — correct, but not what is measured.
    """
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient() as http:
        while time.perf_counter() - started < limit_s:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            match = re.search(r"^runwire_edge_connections (\S+)$", text, re.M)
            if match and float(match.group(1)) >= total:
                return
            await asyncio.sleep(0.2)


async def connected_to(servers: list[Proc], total: int, limit_s: float = 120.0) -> None:
    """Wait (bounded) until the edge processes hold ``total`` sockets between them."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if sum(sockets(server.proc.pid) for server in servers) >= total:
            return
        await asyncio.sleep(0.2)


async def settle(clients: Load, limit_s: float = 30.0) -> None:
    """Wait (bounded) until the clients stop receiving: the previous phase's backlog is written."""
    last = -1
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        frames = clients.ask()["frames"]
        if frames == last:
            return
        last = frames
        await asyncio.sleep(1.0)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(impl: str, bus_url: str, clients: int, seconds: float, through_worker: bool = False,
                  edges: int = 1) -> dict[str, Any]:
    port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(open_bus(bus_url))
        publisher = None
        if through_worker:
            from runwire import Publisher

            data = stack.enter_context(tempfile.TemporaryDirectory())
            worker = Proc(["--role", "worker", "--bus", bus_url, "--data", data])
            stack.callback(worker.stop)
            publisher = await stack.enter_async_context(Publisher(bus))
        await bus.append((RESUME_RUN, "raw"), [make_event(RESUME_RUN, s) for s in range(1, 2001)])
        seqs = Seqs()
        main_run = f"{MAIN_RUN}-{impl}-{os.getpid()}"
        background = Background(bus, seqs, main_run, publisher)
        await background.published()
        server_bus = bus_url + ("&" if "?" in bus_url else "?") + "max_connections=50000"
        shared = ["--reuse-port"] if edges > 1 else []
        servers = [Proc(["--role", "server", "--impl", impl, "--bus", server_bus, "--port", str(port), *shared])
                   for _ in range(edges)]
        try:
            await wait_port(port)
            await resume_first_event(port, 3)  # warm up imports and connections
            if edges > 1:
                await asyncio.sleep(3.0)  # every process listening (one answering is not all)
            rss_before = sum(rss_kib(server.proc.pid) for server in servers)
            sockets_before = sum(sockets(server.proc.pid) for server in servers)
            await bus.append((main_run, "raw"), [make_event(main_run, s) for s in seqs.take(main_run, 1)])
            # the control run too, before its probes connect: a run nobody published within the edge's
            # unpublished wait (30 s) refuses them, and connecting 19,000 clients can take longer
            await bus.append((f"{main_run}-ctl", "raw"),
                             [make_event(f"{main_run}-ctl", s) for s in seqs.take(f"{main_run}-ctl", 1)])
            specs = [f"/v1/runs/{main_run}-bg-{i}/stream?detail=full*2" for i in range(BACKGROUND_RUNS)]
            specs.append(f"/v1/runs/{main_run}-ctl/stream?detail=full*{PROBES}")
            load = Load(port, f"/v1/runs/{main_run}/stream?detail=full", clients, specs)
            try:
                progress(f"{impl}: connecting clients")
                connected = load.first()["connected"]
                if edges > 1:
                    await connected_to(servers, sockets_before + connected)
                elif impl == "runwire":
                    await attached(port, connected)
                progress(f"{impl}: {connected} connected")
                await asyncio.sleep(1.0)
                rss_after = sum(rss_kib(server.proc.pid) for server in servers)
                resume_ms = await resume_first_event(port)
                progress(f"{impl}: resume done")
                latencies = (await control_latency(background, seqs, load, seconds, f"{main_run}-ctl"))["latencies_ms"]
                progress(f"{impl}: latency done ({len(latencies)} samples)")
                await settle(load)
                load.main = clients
                deliveries = await saturate(bus, seqs, load, max(200, 4_000_000 // clients), main_run)
                progress(f"{impl}: saturation done")
                await settle(load)
                before = load.ask("probe-all")
                cpu_before = sum(cpu_s(server.proc.pid) for server in servers)
                report = await control_latency(background, seqs, load, seconds, main_run)
                cpu = sum(cpu_s(server.proc.pid) for server in servers) - cpu_before
                cpu_per_frame = cpu / max(1, report["frames"] - before["frames"])
                cpu_per_write = cpu / max(1, report["reads"] - before["reads"])
                fanout, slowest = report["latencies_ms"], report["slowest_ms"]
                progress(f"{impl}: fan-out latency done ({len(fanout)} samples)")
            finally:
                load.stop()
        finally:
            for server in servers:
                server.stop()
    return {
        "clients": connected,
        "rss_per_client_kib": round((rss_after - rss_before) / max(1, connected), 1),
        "rss_total_per_client_kib": round(rss_after / max(1, connected), 1),
        "deliveries_per_s": round(deliveries),
        "control_latency_p50_ms": round(percentile(latencies, 0.5), 2),
        "control_latency_p99_ms": round(percentile(latencies, 0.99), 2),
        "control_samples": len(latencies),
        "fanout_latency_p50_ms": round(percentile(fanout, 0.5), 2),
        "fanout_latency_p99_ms": round(percentile(fanout, 0.99), 2),
        "fanout_last_client_p50_ms": round(percentile(slowest, 0.5), 2),
        "fanout_last_client_max_ms": round(max(slowest, default=float("nan")), 2),
        "fanout_cpu_us_per_delivery": round(cpu_per_frame * 1e6, 2),
        "fanout_cpu_us_per_client_write": round(cpu_per_write * 1e6, 2),
        "resume_first_event_ms": round(resume_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["bench", "server", "clients", "worker"], default="bench")
    parser.add_argument("--impl", choices=["runwire", "naive"], default="runwire")
    parser.add_argument("--bus", default=None, help="Redis URL (default: start redis-server on a free port)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--after", type=int, default=0)
    parser.add_argument("--clients", type=int, default=2000, help="SSE clients on the main run")
    parser.add_argument("--naive-clients", type=int, default=None, help="default: same as --clients")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each timed phase")
    parser.add_argument("--full", action="store_true", help="10 000 clients (the target)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--through-worker", action="store_true",
                        help="publish the background runs' deltas through a worker (the SDK into ingest)")
    parser.add_argument("--edges", type=int, default=1,
                        help="edge processes sharing the port (SO_REUSEPORT, as `runwire edge --reuse-port`)")
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    parser.add_argument("specs", nargs="*")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.impl, args.bus, args.port, args.reuse_port)
        return
    if args.role == "worker":
        from runwire.workers.cli import main as cli

        os.dup2(2, 1)  # its output to stderr: nobody reads this process's stdout
        cli(["worker", "--bus", args.bus, "--store", f"sqlite:///{args.data}/replay.db",
             "--data-dir", args.data])
        return
    if args.role == "clients":
        import uvloop

        uvloop.run(client_role(args.port, args.specs, args.after, args.source))
        return
    clients = 10_000 if args.full else args.clients
    naive_clients = args.naive_clients or clients
    redis = None
    bus_url = args.bus
    if bus_url is None:
        from tests.services import RedisServer

        redis = RedisServer("--maxclients", "30000")
        redis.start()
        bus_url = redis.url
    try:
        ours = asyncio.run(measure("runwire", bus_url, clients, args.seconds, args.through_worker, args.edges))
        naive = asyncio.run(measure("naive", bus_url, naive_clients, args.seconds, args.through_worker))
    finally:
        if redis is not None:
            redis.close()
    result = {**ours, **{f"naive_{k}": v for k, v in naive.items()}}
    result["deliveries_ratio"] = round(ours["deliveries_per_s"] / max(1, naive["deliveries_per_s"]), 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'':28}{'runwire':>14}{'naive':>14}")
    for key, value in ours.items():
        print(f"{key:28}{value:>14}{naive[key]:>14}")
    print(f"{'deliveries ratio':28}{result['deliveries_ratio']:>14}×")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
