"""``GET /v1/runs/{run_id}/spans``: a run's span tree (:mod:`runwire.jobs.spans`) as JSON.

The page's timeline draws it, and the span exporter sends the same derivation over OTLP, so what
a backend shows and what the page shows cannot drift apart. Read from the replay log (which has
every event a client has seen: the worker writes it first), derived afresh per request; the page
asks again at most once a second while a run is live. Spans still open have no ``end_ts``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import UnknownRun
from ..jobs.spans import SpanTree
from .context import Edge

_encoder = msgspec.json.Encoder()


def spans_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        principal = edge.gate.principal(request.headers, request.query_params)
        await edge.gate.check_run(principal, run_id, "read")
        if await edge.store.run(run_id) is None:
            raise UnknownRun(f"no run {run_id!r} in the replay log")
        tree = SpanTree(run_id)
        async for event in edge.store.iter_events(run_id):
            tree.apply(event)
        body = {"run_id": run_id, "trace_id": tree.trace_id, "last_seq": tree.last_seq, "spans": tree.spans()}
        return Response(_encoder.encode(body), media_type="application/json")

    return endpoint
