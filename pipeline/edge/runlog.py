"""What the edge serves from a run's replay log whole: its JSONL export and its span tree.

``GET /v1/runs/{run_id}/events.jsonl`` streams the run in any egress format (the bytes
``runwire replay export`` writes). ``GET /v1/runs/{run_id}/spans`` is the run's span tree
(:mod:`runwire.jobs.spans`) as JSON: the page's timeline draws it, and the span exporter sends the
same derivation over OTLP, so what a backend shows and what the page shows cannot drift apart. It
is derived afresh per request from the log (which has every event a client has seen: the worker
writes it first); the page asks again at most once a second while a run is live. Spans still
open have no ``end_ts``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .. import protocols
from ..core.errors import UnknownRun
from ..jobs.replay import export_chunks
from ..jobs.spans import SpanTree
from .context import Edge
from .params import choice
from .transports import NDJSON_MEDIA_TYPE

_encoder = msgspec.json.Encoder()


async def _readable(edge: Edge, request: Request) -> str:
    """The run of the request, once the caller may read it and the log has it."""
    run_id: str = request.path_params["run_id"]
    principal = edge.gate.principal(request.headers, request.query_params)
    await edge.gate.check_run(principal, run_id, "read")
    if await edge.store.run(run_id) is None:
        raise UnknownRun(f"no run {run_id!r} in the replay log")
    return run_id


def export_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = await _readable(edge, request)
        format_name = choice(request.query_params.get("format", "koder"), tuple(protocols.EGRESS), "format")
        chunks = export_chunks(edge.store, run_id, format=format_name)
        return StreamingResponse((chunk async for chunk, _ in chunks), media_type=NDJSON_MEDIA_TYPE)

    return endpoint


def spans_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = await _readable(edge, request)
        tree = SpanTree(run_id)
        async for event in edge.store.iter_events(run_id):
            tree.apply(event)
        body = {"run_id": run_id, "trace_id": tree.trace_id, "last_seq": tree.last_seq, "spans": tree.spans()}
        return Response(_encoder.encode(body), media_type="application/json")

    return endpoint
