"""``GET /v1/threads/{thread_id}/stream``: a thread's active run, for AI SDK resume (see
:mod:`runwire.edge.service.threads`)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request

from ..fanout.session import StreamRequest
from ..service.context import Edge
from ..service.threads import active_run, chat_stream


async def thread_stream(edge: Edge, request: Request) -> StreamRequest | None:
    """What ``GET /v1/threads/{thread_id}/stream`` serves: the active run's stream, or None (204)."""
    principal = edge.gate.principal(request.headers, request.query_params)
    edge.gate.require_scope(principal, "read")
    run = await active_run(edge, principal, request.path_params["thread_id"])
    if run is None:
        return None
    stream = chat_stream(edge, run.run_id, request.query_params)
    return msgspec.structs.replace(stream, holder=principal.token_id) if principal is not None else stream
