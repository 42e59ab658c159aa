"""`runwire up --grpc-port`: gRPC beside HTTP in the one process, from the same hub."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.edge.harness import free_port
from tests.ops.conftest import TERMINAL, start_up  # noqa: F401 - the fixture

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
