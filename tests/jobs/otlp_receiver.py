"""An OTLP/HTTP trace receiver for tests: each request decoded with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.edge.harness import start_uvicorn, stop_uvicorn
from tests.services import free_port


class OtlpReceiver:
    """Answers ``/v1/traces``: ``fail`` requests first with 503, then 200; keeps what it took."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        self.refused = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def traces(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.fail > 0:
            self.fail -= 1
            self.refused += 1
            return Response(status_code=503)
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(body)
        self.requests.append((dict(request.headers), decoded))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def spans(self) -> list[Span]:
        return [span for _, request in self.requests for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]


@contextlib.asynccontextmanager
async def otlp_receiver(fail: int = 0) -> AsyncIterator[OtlpReceiver]:
    receiver = OtlpReceiver(fail)
    app = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=receiver.port, log_level="warning", lifespan="off")
    server, task = await start_uvicorn(config)
    try:
        yield receiver
    finally:
        await stop_uvicorn(server, task)
        await asyncio.sleep(0)
