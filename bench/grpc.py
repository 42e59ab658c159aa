"""gRPC streams beside SSE streams: the same edge process, the same run, measured side by side.

Run: ``.venv/bin/python bench/grpc.py [--clients 2000] [--seconds 5] [--json]``

One edge server process (``--role server``) serves HTTP (uvicorn) and gRPC
(``start_grpc``) from one hub, as ``runwire edge --grpc-port`` does, over a
real Redis (started on a free port unless ``--bus`` is given). The same
phases run twice, each time against a fresh server: once with ``clients``
gRPC ``Stream`` calls (grpcio asyncio clients in a separate process, 100
calls per channel, opened 200 at a time, messages counted without
decoding except on probe calls), once with ``clients`` raw SSE readers (``bench/edge.py``'s client
process). Per transport:

1. ``clients`` streams on one run plus 2 on each of 50 background runs and
   20 probes on a control run; ``rss_per_stream_kib`` = the server's RSS
   growth / streams.
2. Control latency: 5 000 deltas/s over the background runs while a
   ``tool.start`` stamped with its publish time goes 10×/s to the control
   run: publish → client p50/p99.
3. Saturation: 4 000 000 / ``clients`` events appended to the main run:
   ``deliveries_per_s`` = messages received by all clients per second
   (drops by Koder agent stream §4 R4 are not deliveries).

Between 2 and 3, against the gRPC server with every stream connected and
idle, ``control_rpc_p50_ms``/``_p99_ms``: 200 ``Control`` calls one after
another, call → the command read from the run's control channel (what the
agent's ``run.controls()`` does). And ``--payload`` adds a micro-benchmark of the ``Event.payload``
choice: JSON text vs ``google.protobuf.Struct`` (encode, decode, bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is called grpc.py: keep its directory off the path so `import grpc` is grpcio.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from runwire.bus import open_bus  # noqa: E402
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb  # noqa: E402

_spec = importlib.util.spec_from_file_location("edge_bench", HERE / "edge.py")
assert _spec is not None and _spec.loader is not None
eb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eb)

PER_CHANNEL = 100
OPEN_AT_ONCE = 200
STREAM = "/runwire.v1.Runwire/Stream"


# ---------------------------------------------------------------- server
def serve(bus_url: str, port: int, grpc_port: int) -> None:
    """HTTP and gRPC from one create_app (one hub), as `runwire edge --grpc-port`."""
    import uvicorn

    from runwire.edge import EdgeSettings, create_app
    from runwire.edge.grpc.server import start_grpc
    from runwire.store import open_store
    from runwire.workers.commands.edge import tune_gc

    async def main() -> None:
        store_path = Path(tempfile.mkdtemp()) / "replay.db"
        async with open_bus(bus_url) as bus, open_store(f"sqlite:///{store_path}") as store:
            app = create_app(bus, store, EdgeSettings())
            tune_gc()
            config = uvicorn.Config(
                app, host="127.0.0.1", port=port, log_level="warning", loop="none",
                http="httptools", backlog=16384, timeout_graceful_shutdown=1,
            )
            grpc_server = await start_grpc(app.state.edge, "127.0.0.1", grpc_port)  # kept: a dropped server stops
            await uvicorn.Server(config).serve()
            await grpc_server.stop(0)

    asyncio.run(main())  # grpc.aio runs on asyncio's own loop; both transports share it


# ---------------------------------------------------------------- gRPC clients
async def opened(counters: Any, total: int) -> None:
    """Wait (bounded) until ``total`` calls got their first message or failed."""
    deadline = time.monotonic() + 120
    while True:
        if counters.connected + len(counters.failed) >= total or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)


async def read(call: Any, probe: bool, counters: Any) -> None:
    """Count a call's messages; a probe decodes tool.start events for their publish stamp."""
    try:
        await _read(call, probe, counters)
    except grpc.aio.AioRpcError as exc:
        counters.failed.append(f"{exc.code().name}: {exc.details()}")


async def _read(call: Any, probe: bool, counters: Any) -> None:
    first = True
    async for message in call:
        if first:
            counters.connected += 1
            first = False
        counters.frames += 1
        if probe:
            event = pb.Event.FromString(message)
            if event.type == "tool.start":
                stamp = json.loads(event.payload)["input"]["t_ns"]
                counters.latencies_ms.append((time.time_ns() - stamp) / 1e6)


async def grpc_client_role(port: int, specs: list[str]) -> None:
    """Open ``run_id*count`` Stream calls (100 per channel); answer ``report`` like edge.py's clients."""
    counters = eb.Counters()
    counters.failed = []
    channels: list[grpc.aio.Channel] = []
    calls: list[Any] = []
    tasks: list[asyncio.Task[None]] = []

    def channel() -> grpc.aio.Channel:
        if not channels or len(calls) % PER_CHANNEL == 0:
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        return channels[-1]

    for spec in specs:
        run_id, _, count = spec.rpartition("*")
        for _ in range(int(count)):
            stream = channel().unary_stream(STREAM, request_serializer=pb.StreamRequest.SerializeToString)
            call = stream(pb.StreamRequest(run_id=run_id, detail="full"))
            calls.append(call)
            probe = run_id.endswith("-ctl")
            tasks.append(asyncio.create_task(read(call, probe, counters)))
            if len(calls) % OPEN_AT_ONCE == 0:  # as edge.py's clients: 200 openings in flight
                await opened(counters, len(calls))
    total = len(calls)
    await opened(counters, total)
    if counters.failed:
        print(f"{len(counters.failed)} calls failed, e.g. {counters.failed[0]}", file=sys.stderr, flush=True)
    print(json.dumps({"connected": counters.connected}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        latencies, counters.latencies_ms = counters.latencies_ms, []
        alive = sum(1 for t in tasks if not t.done())
        print(json.dumps({"frames": counters.frames, "alive": alive, "latencies_ms": latencies}), flush=True)
    for call in calls:
        call.cancel()


# ---------------------------------------------------------------- orchestration
async def control_rpc_latency(bus: Any, grpc_port: int, run_id: str, count: int = 200) -> list[float]:
    """Control call → the command read from the run's control channel, one at a time."""
    samples: list[float] = []
    commands = bus.controls(run_id, after="0")  # a fresh channel: each call reads its own command
    iterator = aiter(commands)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        control = channel.unary_unary(
            "/runwire.v1.Runwire/Control", request_serializer=pb.ControlRequest.SerializeToString,
            response_deserializer=pb.ControlReply.FromString,
        )
        await control(pb.ControlRequest(run_id=run_id, command="pause"))
        await anext(iterator)
        for _ in range(count):
            started = time.perf_counter()
            await control(pb.ControlRequest(run_id=run_id, command="pause"))
            await anext(iterator)
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def measure(transport: str, bus_url: str, clients: int, seconds: float) -> dict[str, Any]:
    port, grpc_port = eb.free_port(), eb.free_port()
    async with open_bus(bus_url) as bus:
        seqs = eb.Seqs()
        main_run = f"{eb.MAIN_RUN}-{transport}-{os.getpid()}"
        ctl_run = f"{main_run}-ctl"
        server_bus = bus_url + ("&" if "?" in bus_url else "?") + "max_connections=50000"
        server = Proc(["--role", "server", "--bus", server_bus, "--port", str(port), "--grpc-port", str(grpc_port)])
        try:
            await eb.wait_port(port)
            await eb.wait_port(grpc_port)
            rss_before = eb.rss_kib(server.proc.pid)
            for run in (main_run, ctl_run, *(f"{main_run}-bg-{i}" for i in range(eb.BACKGROUND_RUNS))):
                await bus.append((run, "raw"), [eb.make_event(run, s) for s in seqs.take(run, 1)])
            if transport == "grpc":
                specs = [f"{main_run}*{clients}", f"{ctl_run}*{eb.PROBES}"]
                specs += [f"{main_run}-bg-{i}*2" for i in range(eb.BACKGROUND_RUNS)]
                load = Proc(["--role", "clients", "--port", str(grpc_port), *specs])
            else:
                specs = [f"/v1/runs/{main_run}/stream?detail=full*{clients}"]
                specs += [f"/v1/runs/{main_run}-bg-{i}/stream?detail=full*2" for i in range(eb.BACKGROUND_RUNS)]
                specs.append(f"/v1/runs/{ctl_run}/stream?detail=full*{eb.PROBES}")
                load = eb.Proc(["--role", "clients", "--port", str(port), "--after", "0", *specs])
            try:
                eb.progress(f"{transport}: connecting")
                connected = load.first()["connected"]
                await eb.attached(port, connected)
                await asyncio.sleep(1.0)
                rss_after = eb.rss_kib(server.proc.pid)
                eb.progress(f"{transport}: {connected} streams")
                latencies = await eb.control_latency(bus, seqs, load, seconds, main_run, ctl_run)
                eb.progress(f"{transport}: latency done ({len(latencies)} samples)")
                await eb.settle(load)
                rpc = []
                if transport == "grpc":  # Control calls while every stream is connected and idle
                    rpc = await asyncio.wait_for(control_rpc_latency(bus, grpc_port, ctl_run), 120)
                await eb.settle(load)
                load.main = clients
                deliveries = await eb.saturate(bus, seqs, load, max(200, 4_000_000 // clients), main_run)
                eb.progress(f"{transport}: saturation done")
            finally:
                load.stop()
        finally:
            server.stop()
    out = {
        "streams": connected,
        "rss_per_stream_kib": round((rss_after - rss_before) / max(1, connected), 1),
        "deliveries_per_s": round(deliveries),
        "publish_to_client_p50_ms": round(eb.percentile(latencies, 0.5), 2),
        "publish_to_client_p99_ms": round(eb.percentile(latencies, 0.99), 2),
    }
    if rpc:
        out["control_rpc_p50_ms"] = round(eb.percentile(rpc, 0.5), 2)
        out["control_rpc_p99_ms"] = round(eb.percentile(rpc, 0.99), 2)
    return out


class Proc(eb.Proc):
    """A client process of this file (edge.py's Proc starts edge.py)."""

    def __init__(self, args: list[str]) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )


# ---------------------------------------------------------------- payload encoding
def payload_bench(rounds: int = 20_000) -> dict[str, Any]:
    """``Event.payload`` as JSON text (what runwire sends) vs ``google.protobuf.Struct``."""
    import msgspec
    from google.protobuf import json_format, struct_pb2

    payloads = {
        "text.delta": {"text": "Hello, world. "},
        "tool.start": {"call_id": "c_01", "tool": "web.search", "input": {"q": "runwire", "limit": 10}},
        "tool.end": {"call_id": "c_01", "ok": True, "output": {"rows": [{"id": i, "score": i / 10} for i in range(10)]},
                     "duration_ms": 412},
    }
    out: dict[str, Any] = {}
    for name, payload in payloads.items():
        raw = msgspec.json.encode(payload)

        def timed(fn: Any) -> float:
            started = time.perf_counter()
            for _ in range(rounds):
                fn()
            return (time.perf_counter() - started) / rounds * 1e6

        def json_encode(name: str = name, raw: bytes = raw) -> bytes:
            return pb.Event(type=name, payload=raw.decode()).SerializeToString()

        def struct_encode(payload: dict[str, Any] = payload) -> bytes:
            struct = struct_pb2.Struct()
            struct.update(payload)
            return struct.SerializeToString()

        json_wire, struct_wire = json_encode(), struct_encode()

        def json_decode(wire: bytes = json_wire) -> Any:
            return msgspec.json.decode(pb.Event.FromString(wire).payload)

        def struct_decode(wire: bytes = struct_wire) -> Any:
            return json_format.MessageToDict(struct_pb2.Struct.FromString(wire))

        round_trip = json_format.MessageToDict(struct_pb2.Struct.FromString(struct_wire))
        out[name] = {
            "json_bytes": len(raw), "struct_bytes": len(struct_wire),
            "json_encode_us": round(timed(json_encode), 2), "struct_encode_us": round(timed(struct_encode), 2),
            "json_decode_us": round(timed(json_decode), 2), "struct_decode_us": round(timed(struct_decode), 2),
            "struct_round_trips": round_trip == payload and msgspec.json.encode(round_trip) == raw,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["bench", "server", "clients"], default="bench")
    parser.add_argument("--bus", default=None, help="Redis URL (default: start redis-server on a free port)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--clients", type=int, default=2000, help="streams on the main run, per transport")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the latency phase")
    parser.add_argument("--payload", action="store_true", help="also the Event.payload micro-benchmark")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("specs", nargs="*")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.bus, args.port, args.grpc_port)
        return
    if args.role == "clients":
        asyncio.run(grpc_client_role(args.port, args.specs))
        return
    redis = None
    bus_url = args.bus
    if bus_url is None:
        from tests.services import RedisServer

        redis = RedisServer("--maxclients", "30000")
        redis.start()
        bus_url = redis.url
    try:
        result = {
            "grpc": asyncio.run(measure("grpc", bus_url, args.clients, args.seconds)),
            "sse": asyncio.run(measure("sse", bus_url, args.clients, args.seconds)),
        }
    finally:
        if redis is not None:
            redis.close()
    result["load_average"] = os.getloadavg()[0]
    if args.payload:
        result["payload"] = payload_bench()
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'':28}{'gRPC':>14}{'SSE':>14}")
    for key, value in result["grpc"].items():
        print(f"{key:28}{value:>14}{result['sse'].get(key, ''):>14}")
    print(f"load average (1 min): {result['load_average']:.1f}")
    for name, figures in result.get("payload", {}).items():
        print(name, figures)


if __name__ == "__main__":
    main()
