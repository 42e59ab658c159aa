"""gRPC beside HTTP: ``runwire.v1.Runwire`` (``proto/runwire/v1/runwire.proto``) from the edge's hub.

The Koder agent stream §5.3 names a gRPC server stream with the same shape
as the JSON envelope; the StreamWeave RPC defines ``StreamWeave``. Both are
served here from the **same** :class:`~runwire.edge.http.app.Edge` as the HTTP
app in the same process — one hub (one bus reader), one encode per feed,
the same resume, R1 shaping, R4 drops, gate (tokens, tenants, scopes),
control path and ingest path:

=========================  ====================================================
``Stream``                 a run's events (``Event``), exact resume from
                           ``after_seq`` on any instance; OK after the run's
                           terminal ``run.lifecycle``
``StreamWeave``            the StreamWeave RPC's progress view; FAILED, then
                           status ``INTERNAL`` with the same message; the
                           client cancelling sends ``cancel`` to the run
``Control``                ``control.send_control`` (as ``POST …/control``)
``Ingest``                 ``authz.authorize_write`` per run, then
                           ``ingest.publish_body`` (as ``POST …/events``)
``ListRuns``               ``runs.list_runs`` (as ``GET /v1/runs``)
=========================  ====================================================

Errors map to status codes in :func:`status_of`; a ``KAI-STREAM-*`` code
leads the status message and is in the trailing metadata
``runwire-error-code``. Frames are serialized once per frame (not per
client) and written with an identity serializer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import msgspec
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ...core import limits
from ...core.errors import (
    BUF_DROP,
    CONN_DISCONNECTED,
    ConfigError,
    RunwireError,
)
from ..fanout.frames import Frame
from ..fanout.session import Overflowed, Sink, StreamRequest, StreamSession
from ..proto.runwire.v1 import runwire_pb2 as pb
from ..service.auth import Principal
from ..service.context import Edge
from ..service.control import send_control
from ..service.params import check_depth
from ..service.runs import list_runs
from ..service.streams import parse_time, stream_request
from .ingest import Ingestion
from .messages import (
    EVENT,
    WEAVE,
    event_message,
    frames_message,
    run_info,
    weave_message,
)

log = logging.getLogger(__name__)

SERVICE = "runwire.v1.Runwire"
LOOM_SERVICE = "loom.v1.LoomService"
"""The StreamWeave RPC's own service name, so a Loom client works unchanged."""
ERROR_CODE_KEY = "runwire-error-code"
FAILED_STAGE = "EXECUTION_STAGE_FAILED"

Context = grpc.aio.ServicerContext[Any, Any]
_R = TypeVar("_R")


def status_of(exc: RunwireError) -> grpc.StatusCode:
    """The gRPC status for an error: the error's own (:mod:`runwire.core.errors` has the table)."""
    return grpc.StatusCode[exc.grpc]


async def abort(context: Context, code: grpc.StatusCode, message: str, error_code: str | None = None) -> NoReturn:
    """End the call with ``code``; a ``KAI-STREAM-*`` code leads the message and is in the trailers."""
    if error_code:
        context.set_trailing_metadata(((ERROR_CODE_KEY, error_code),))
        if not message.startswith(error_code):
            message = f"{error_code}: {message}"
    await context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")


async def abort_with(context: Context, exc: RunwireError) -> NoReturn:
    await abort(context, status_of(exc), str(exc), exc.code)


class EventSink(Sink):
    """``Stream``: each frame as one ``Event`` message, serialized once per frame."""

    def __init__(self, context: Context, format_name: str) -> None:
        self.context = context
        self.format_name = format_name
        self.render = event_message if format_name == "koder" else frames_message

    async def send(self, frames: list[Frame]) -> None:
        for frame in frames:
            await self.context.write(frame.encoded(EVENT, self.render))

    async def keepalive(self) -> None:
        """HTTP/2 keeps a gRPC call alive (server pings); nothing to send."""


class WeaveSink(Sink):
    """``StreamWeave``: each progress frame as one ``WeaveProgress``; remembers a FAILED ending."""

    format_name = "streamweave"

    def __init__(self, context: Context) -> None:
        self.context = context
        self.failed: str | None = None

    async def send(self, frames: list[Frame]) -> None:
        for frame in frames:
            if len(frame.payloads) != 1:
                continue  # an event the progress view renders as nothing
            if frame.terminal:
                data = msgspec.json.decode(frame.payloads[0])
                if data.get("stage") == FAILED_STAGE:
                    self.failed = str(data.get("message") or "execution failed")
            await self.context.write(frame.encoded(WEAVE, weave_message))

    async def keepalive(self) -> None:
        """HTTP/2 keeps a gRPC call alive (server pings); nothing to send."""


class RunwireService:
    """The ``runwire.v1.Runwire`` handlers over one edge."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.stopping = False
        """Set while the server shuts down: calls it cancels are not the clients' cancels."""
        self._background: set[asyncio.Task[None]] = set()

    def principal(self, context: Context) -> Principal | None:
        metadata = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        return self.edge.gate.principal(metadata, {})

    # ---- streams ----------------------------------------------------------
    async def stream(self, request: pb.StreamRequest, context: Context) -> None:
        principal = self.principal(context)
        if not request.run_id:
            raise ConfigError("run_id is required")
        await self.edge.gate.check_run(principal, request.run_id, "read")
        stream = self.stream_request(request)
        with self.edge.quotas.stream(principal.token_id if principal else ""):
            await self.serve(context, stream, EventSink(context, stream.format))

    def stream_request(self, request: pb.StreamRequest) -> StreamRequest:
        """The HTTP edge's validation of the same parameters (``streams.stream_request``)."""
        query = {
            "detail": request.detail,
            "format": request.format or "koder",
            "profile": request.profile or "default",
            "children": request.children or "flatten",
            "after": "live" if request.live else str(request.after_seq),
        }
        return stream_request(request.run_id, {k: v for k, v in query.items() if v}, {}, self.edge.settings)

    async def serve(self, context: Context, stream: StreamRequest, sink: Sink) -> None:
        """One session until the run ends (OK), the client leaves, or it must be cut off."""
        metrics = self.edge.hub.metrics
        try:
            await StreamSession(self.edge.hub, stream, sink).run()
        except Overflowed:
            metrics.disconnects.labels(BUF_DROP).inc()
            await abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the client fell too far behind to receive control events; call again with after_seq to resume",
                BUF_DROP,
            )
        except RunwireError as exc:
            metrics.disconnects.labels(exc.code or "").inc()
            await abort_with(context, exc)
        except asyncio.CancelledError:
            if not self.stopping:
                metrics.disconnects.labels(CONN_DISCONNECTED).inc()
            raise

    async def stream_weave(self, request: pb.WeaveRequest, context: Context) -> None:
        """The StreamWeave RPC for the run named by ``session_id``."""
        run_id = request.session_id
        principal = self.principal(context)
        if not run_id:
            raise ConfigError("session_id is required: it names the run to follow")
        await self.edge.gate.check_run(principal, run_id, "read")
        hold = self.edge.quotas.stream(principal.token_id if principal else "")
        sink = WeaveSink(context)
        try:
            with hold:
                await self.serve(context, StreamRequest(run_id=run_id, format="streamweave"), sink)
        except asyncio.CancelledError:
            if not self.stopping:
                self._cancel_run(principal, run_id)
            raise
        if sink.failed is not None:
            await abort(context, grpc.StatusCode.INTERNAL, sink.failed)

    def _cancel_run(self, principal: Principal | None, run_id: str) -> None:
        """The client cancelled the call: the StreamWeave RPC stops the agent too."""
        task = asyncio.create_task(self._send_cancel(principal, run_id), name="runwire-grpc-cancel")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_cancel(self, principal: Principal | None, run_id: str) -> None:
        try:
            await send_control(
                self.edge.bus, self.edge.gate, principal, run_id, "cancel",
                {"reason": "the StreamWeave call was cancelled by its client"},
            )
        except RunwireError as exc:
            log.warning("StreamWeave call on %s cancelled; cancel not sent: %s", run_id, exc)

    # ---- unary and client-streaming calls ----------------------------------
    async def control(self, request: pb.ControlRequest, context: Context) -> pb.ControlReply:
        principal = self.principal(context)
        limits.check_size(len(request.args.encode()), self.edge.settings.max_control_bytes, "the control args")
        args = _json_object(request.args, "args")
        sent = await send_control(self.edge.bus, self.edge.gate, principal, request.run_id, request.command, args)
        return pb.ControlReply(id=sent.id, command=sent.command)

    async def ingest(self, messages: AsyncIterator[pb.Event], context: Context) -> pb.IngestReply:
        return await Ingestion(self.edge, self.principal(context)).run(messages)

    async def list_runs(self, request: pb.ListRunsRequest, context: Context) -> pb.ListRunsReply:
        try:
            principal = self.principal(context)
            runs = await list_runs(
                self.edge,
                principal,
                tenant=request.tenant or None,
                state=request.state or None,
                since=parse_time(request.since),
                until=parse_time(request.until),
                limit=request.limit or 100,
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.ListRunsReply(runs=[run_info(r) for r in runs])

    # ---- registration -------------------------------------------------------
    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        weave = grpc.unary_stream_rpc_method_handler(
            _refusing(self.stream_weave), request_deserializer=pb.WeaveRequest.FromString, response_serializer=_raw
        )
        runwire = grpc.method_handlers_generic_handler(SERVICE, {
            "Stream": grpc.unary_stream_rpc_method_handler(
                _refusing(self.stream), request_deserializer=pb.StreamRequest.FromString, response_serializer=_raw
            ),
            "StreamWeave": weave,
            "Control": grpc.unary_unary_rpc_method_handler(
                _refusing(self.control), request_deserializer=pb.ControlRequest.FromString,
                response_serializer=pb.ControlReply.SerializeToString,
            ),
            "Ingest": grpc.stream_unary_rpc_method_handler(
                _refusing(self.ingest), request_deserializer=pb.Event.FromString,
                response_serializer=pb.IngestReply.SerializeToString,
            ),
            "ListRuns": grpc.unary_unary_rpc_method_handler(
                _refusing(self.list_runs), request_deserializer=pb.ListRunsRequest.FromString,
                response_serializer=pb.ListRunsReply.SerializeToString,
            ),
        })
        loom = grpc.method_handlers_generic_handler(LOOM_SERVICE, {"StreamWeave": weave})
        return runwire, loom


def _refusing(handler: Callable[[Any, Context], Awaitable[_R]]) -> Callable[[Any, Context], Awaitable[_R]]:
    """``handler`` with the service's one error mapping: a :class:`RunwireError` it raises ends
    the call with :func:`status_of`'s status, its ``KAI-STREAM-*`` code leading the message."""

    @functools.wraps(handler)
    async def call(request: Any, context: Context) -> _R:
        try:
            return await handler(request, context)
        except RunwireError as exc:
            await abort_with(context, exc)

    return call


def _raw(data: bytes) -> bytes:
    """Frames are serialized once per frame; the call writes those bytes as they are."""
    return data


def _json_object(text: str, name: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object")
    check_depth(value, name)
    return value


class GrpcServer:
    """A started gRPC server over an edge; :meth:`stop` drains it."""

    def __init__(self, server: grpc.aio.Server, service: RunwireService,
                 health_servicer: health.aio.HealthServicer, port: int) -> None:
        self.server = server
        self.service = service
        self.health = health_servicer
        self.port = port

    async def stop(self, grace: float | None = 2.0) -> None:
        """Refuse new calls, let running ones end for ``grace`` seconds, then cancel them.

        Calls cancelled here are not client cancels: no run is cancelled.
        """
        self.service.stopping = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_grpc(edge: Edge, host: str, port: int) -> GrpcServer:
    """Serve ``runwire.v1.Runwire``, StreamWeave, health and reflection on ``host:port`` (0: any).

    Keep the returned server: grpcio stops a server whose object is garbage collected.
    """
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    service = RunwireService(edge)
    server.add_generic_rpc_handlers(service.handlers())
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {address}: {exc}") from None
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return GrpcServer(server, service, health_servicer, bound)


__all__ = ["GrpcServer", "RunwireService", "start_grpc", "status_of"]
