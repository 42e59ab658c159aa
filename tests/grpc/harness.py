"""Serve the edge for real — HTTP (uvicorn) and gRPC from one app and hub — and a grpcio client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings, create_app
from runwire.edge.grpc.server import GrpcServer, start_grpc
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.edge.service.context import Edge
from runwire.store.base import ReplayLog
from tests.edge.harness import free_port, loopback_config, start_uvicorn, stop_uvicorn

SERVICE = "/runwire.v1.Runwire/"


class Served:
    """A running edge: ``http`` base URL, ``edge`` (its hub and gate) and ``client()`` for gRPC."""

    def __init__(self, edge: Edge, http: str, grpc_server: GrpcServer) -> None:
        self.edge = edge
        self.http = http
        self.grpc = grpc_server
        self.target = f"127.0.0.1:{grpc_server.port}"
        self.channels: list[grpc.aio.Channel] = []

    def client(self, token: str | None = None, options: Sequence[tuple[str, Any]] = ()) -> Client:
        channel = grpc.aio.insecure_channel(self.target, options=list(options))
        self.channels.append(channel)
        return Client(channel, token)


class Client:
    """The five runwire.v1 methods and StreamWeave over a real grpcio channel."""

    def __init__(self, channel: grpc.aio.Channel, token: str | None) -> None:
        self.channel = channel
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def stream(self, run_id: str, **fields: Any) -> Any:
        call = self.channel.unary_stream(
            SERVICE + "Stream",
            request_serializer=pb.StreamRequest.SerializeToString,
            response_deserializer=pb.Event.FromString,
        )
        return call(pb.StreamRequest(run_id=run_id, **fields), metadata=self.metadata)

    def weave(self, session_id: str, service: str = SERVICE) -> Any:
        call = self.channel.unary_stream(
            service + "StreamWeave",
            request_serializer=pb.WeaveRequest.SerializeToString,
            response_deserializer=pb.WeaveProgress.FromString,
        )
        return call(pb.WeaveRequest(query="q", session_id=session_id), metadata=self.metadata)

    async def control(self, run_id: str, command: str, args: str = "") -> pb.ControlReply:
        call = self.channel.unary_unary(
            SERVICE + "Control",
            request_serializer=pb.ControlRequest.SerializeToString,
            response_deserializer=pb.ControlReply.FromString,
        )
        reply: pb.ControlReply = await call(
            pb.ControlRequest(run_id=run_id, command=command, args=args), metadata=self.metadata
        )
        return reply

    async def ingest(self, events: Sequence[pb.Event]) -> pb.IngestReply:
        call = self.channel.stream_unary(
            SERVICE + "Ingest",
            request_serializer=pb.Event.SerializeToString,
            response_deserializer=pb.IngestReply.FromString,
        )
        reply: pb.IngestReply = await call(iter(events), metadata=self.metadata)
        return reply

    async def list_runs(self, **fields: Any) -> pb.ListRunsReply:
        call = self.channel.unary_unary(
            SERVICE + "ListRuns",
            request_serializer=pb.ListRunsRequest.SerializeToString,
            response_deserializer=pb.ListRunsReply.FromString,
        )
        reply: pb.ListRunsReply = await call(pb.ListRunsRequest(**fields), metadata=self.metadata)
        return reply


async def read_all(call: Any) -> list[Any]:
    """Every message of a server stream until it ends (raises AioRpcError on a non-OK status)."""
    return [message async for message in call]


@contextlib.asynccontextmanager
async def serve(
    bus: Bus, store: ReplayLog, settings: EdgeSettings | None = None
) -> AsyncIterator[Served]:
    """uvicorn and gRPC on free loopback ports, from one ``create_app`` (one hub)."""
    app = create_app(bus, store, settings or EdgeSettings())
    port = free_port()
    server, task = await start_uvicorn(loopback_config(app, port))
    grpc_server = await start_grpc(app.state.edge, "127.0.0.1", 0)
    served = Served(app.state.edge, f"http://127.0.0.1:{port}", grpc_server)
    try:
        yield served
    finally:
        for channel in served.channels:
            await channel.close()
        await grpc_server.stop(0.5)
        await stop_uvicorn(server, task)


async def read_rest(call: Any) -> list[Any]:
    """The rest of a server stream read with ``read()`` (iteration and read() can't be mixed)."""
    out: list[Any] = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out
