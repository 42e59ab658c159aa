"""`runwire up --grpc-port`: gRPC beside HTTP in the one process, from the same hub."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.edge.harness import free_port
from tests.ops.conftest import RUNWIRE, TERMINAL, start_up  # noqa: F401 - the fixture

from .harness import Client, read_all

pytestmark = pytest.mark.slow


def test_up_serves_grpc_beside_http(start_up: Any, tmp_path: Path) -> None:  # noqa: F811
    """`runwire up --demo --grpc-port P`: health SERVING, and a demo run streamed over gRPC to its end."""
    port = free_port()
    up = start_up("--demo", "--demo-rate", "2", "--data-dir", str(tmp_path / "data"), "--grpc-port", str(port))
    run = up.wait_for_run()
    assert f"runwire up: gRPC on 127.0.0.1:{port}" in up.out.read_text()

    async def check() -> list[Any]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            return await asyncio.wait_for(read_all(Client(channel, None).stream(run["run_id"], detail="full")), 60)

    events = asyncio.run(check())
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == "run.lifecycle" and json.loads(events[-1].payload)["state"] in TERMINAL
    assert up.terminate() == 0


def test_edge_serves_grpc_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """`runwire edge --grpc-port P`: HTTP and gRPC from one process; health SERVING; SIGTERM
    stops both without a traceback (uvicorn re-raises the signal after its shutdown)."""
    http_port, grpc_port = free_port(), free_port()
    env = {**os.environ, "RUNWIRE_SECRET": ""}
    env.pop("RUNWIRE_SECRET")
    process = subprocess.Popen(
        [str(RUNWIRE), "edge", "--port", str(http_port), "--grpc-port", str(grpc_port),
         "--store", f"sqlite:///{tmp_path / 'replay.db'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )
    try:
        async def check() -> int:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                answer = await stub.Check(health_pb2.HealthCheckRequest(service="runwire.v1.Runwire"),
                                          timeout=20, wait_for_ready=True)
                return int(answer.status)

        assert asyncio.run(check()) == health_pb2.HealthCheckResponse.SERVING
        assert httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
        assert process.returncode == 0  # the bus and the replay log closed, as a worker
        assert b"Traceback" not in err, err.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_edge_does_not_import_grpcio_unless_asked() -> None:
    """gRPC is an optional extra: the edge app and the CLI load without importing grpcio."""
    code = (
        "import sys; import runwire.edge, runwire.edge.http.app, runwire.workers.cli, runwire.workers.commands.edge, "
        "runwire.workers.commands.up; sys.exit(1 if [m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'grpc_health', 'grpc_reflection', 'google')] else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_edge_on_a_taken_grpc_port_fails_with_one_clear_error(tmp_path: Path) -> None:
    """A gRPC port another process holds is one error line, not a traceback (and not a second
    server silently sharing the port: SO_REUSEPORT is off)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = subprocess.run(
            [str(RUNWIRE), "edge", "--port", str(free_port()), "--grpc-port", str(taken),
             "--store", f"sqlite:///{tmp_path / 'replay.db'}"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "RUNWIRE_SECRET"},
        )
    assert result.returncode == 1, result.stderr
    assert "cannot listen for gRPC on 127.0.0.1:" in result.stderr and "Traceback" not in result.stderr
