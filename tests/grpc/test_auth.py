"""gRPC auth: the HTTP edge's HS256 tokens in ``authorization`` metadata, same tenant and scope rules."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings, issue_token
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.store.base import ReplayLog
from tests.edge.harness import RUN_A, RUN_B, SECRET, token, two_tenants_runs

from .harness import Served, read_all, serve

OK = grpc.StatusCode.OK


@pytest.fixture
async def secured(memory_bus: Bus, store: ReplayLog) -> AsyncIterator[Served]:
    """An edge with a secret, and one finished run for each of tenants A and B."""
    await two_tenants_runs(memory_bus, store)
    async with serve(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        yield edge


async def status(call: object) -> grpc.StatusCode:
    """The status a call ends with (its messages read and dropped)."""
    try:
        if hasattr(call, "__aiter__"):
            await asyncio.wait_for(read_all(call), 10)
        else:
            await asyncio.wait_for(call, 10)  # type: ignore[arg-type]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return OK


async def test_auth_matrix_tokens_tenants_and_scopes(secured: Served) -> None:
    """Invariant 6 (tenants are isolated) over gRPC: a token of tenant A can't read, control or list B's runs
    (NOT_FOUND, as for a run that does not exist) nor ingest into them (PERMISSION_DENIED, the
    write rule's KAI-STREAM-AUTH-0003, as HTTP's 403); no, expired or forged tokens are
    UNAUTHENTICATED; a token without the method's scope is PERMISSION_DENIED."""
    expired = jwt.encode({"tenant": "A", "runs": "*", "scopes": ["read"], "exp": int(time.time()) - 5}, SECRET, "HS256")
    forged = issue_token("another-secret-of-at-least-32-bytes!!", tenant="A", scopes=["read"])
    full_a = secured.client(token("A", "read", "write", "control"))
    read_a = secured.client(token("A", "read"))
    b_event = pb.Event(id="01J00000000000000000000099", ts="2026-01-01T00:00:00Z", type="text.delta",
                       run_id=RUN_B, seq=9, payload='{"text": "x"}')

    assert await status(full_a.stream(RUN_A)) == OK
    assert await status(full_a.stream(RUN_B)) == grpc.StatusCode.NOT_FOUND
    assert await status(full_a.stream("run-nobody-has-seen")) == grpc.StatusCode.NOT_FOUND
    assert await status(secured.client(token("A", runs=[RUN_B])).stream(RUN_A)) == grpc.StatusCode.NOT_FOUND
    assert await status(full_a.weave(RUN_B)) == grpc.StatusCode.NOT_FOUND
    assert await status(full_a.control(RUN_B, "cancel")) == grpc.StatusCode.NOT_FOUND
    assert await status(full_a.control(RUN_A, "pause")) == grpc.StatusCode.FAILED_PRECONDITION  # A's run ended
    assert await status(full_a.ingest([b_event])) == grpc.StatusCode.PERMISSION_DENIED
    listed = await full_a.list_runs()
    assert [r.run_id for r in listed.runs] == [RUN_A]

    for bad in (None, expired, forged):
        assert await status(secured.client(bad).stream(RUN_A)) == grpc.StatusCode.UNAUTHENTICATED
    assert await status(secured.client(None).list_runs()) == grpc.StatusCode.UNAUTHENTICATED
    assert await status(read_a.control(RUN_A, "pause")) == grpc.StatusCode.PERMISSION_DENIED
    a_event = pb.Event(id="01J00000000000000000000098", ts="2026-01-01T00:00:00Z", type="text.delta",
                       run_id=RUN_A, seq=9, payload='{"text": "x"}')
    assert await status(read_a.ingest([a_event])) == grpc.StatusCode.PERMISSION_DENIED
    assert await status(secured.client(token("A", "write")).list_runs()) == grpc.StatusCode.PERMISSION_DENIED


async def test_health_and_reflection_answer_without_a_token(secured: Served) -> None:
    """grpc.health.v1 says SERVING for the server and runwire.v1.Runwire; server reflection
    lists the services and serves runwire.v1's descriptors (what grpcurl needs)."""
    channel = grpc.aio.insecure_channel(secured.target)
    secured.channels.append(channel)
    checker = health_pb2_grpc.HealthStub(channel)
    for name in ("", "runwire.v1.Runwire"):
        answer = await checker.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="runwire.v1.Runwire"),
    ]
    answers = [a async for a in stub.ServerReflectionInfo(iter(requests), timeout=5)]
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"runwire.v1.Runwire", "grpc.health.v1.Health"} <= names
    files = answers[1].file_descriptor_response.file_descriptor_proto
    assert files and b"runwire/v1/runwire.proto" in files[0]
