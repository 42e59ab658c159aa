"""An OTLP/HTTP trace receiver for tests: each request decoded with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator

import httpx
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
    """Answers ``/v1/traces``: ``fail`` requests first with 503 (and all while ``refusing``), then
    200 — or, with ``forward``, what that backend answers — and keeps what it took."""

    def __init__(self, fail: int = 0, forward: str | None = None, port: int | None = None) -> None:
        self.fail = fail
        self.refusing = False
        self.forward = forward
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        self.refused = 0
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def traces(self, request: Request) -> Response:
        raw = body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.fail > 0 or self.refusing:
            self.fail = max(0, self.fail - 1)
            self.refused += 1
            return Response(status_code=503)
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(body)
        if self.forward is not None:
            passed = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with httpx.AsyncClient(timeout=30) as http:
                answer = await http.post(f"{self.forward}/v1/traces", content=raw, headers=passed)
            if not answer.is_success:
                return Response(answer.content, status_code=answer.status_code)
        self.requests.append((dict(request.headers), decoded))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def spans(self) -> list[Span]:
        return [span for _, request in self.requests for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]


@contextlib.asynccontextmanager
async def otlp_receiver(fail: int = 0, forward: str | None = None,
                        port: int | None = None) -> AsyncIterator[OtlpReceiver]:
    """A receiver serving meanwhile (on ``port``, say a backend's that came back, else a free one)."""
    receiver = OtlpReceiver(fail, forward, port)
    app = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=receiver.port, log_level="warning", lifespan="off")
    server, task = await start_uvicorn(config)
    try:
        yield receiver
    finally:
        await stop_uvicorn(server, task)
        await asyncio.sleep(0)
