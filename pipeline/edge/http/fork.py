"""``POST /v1/runs/{run_id}/fork`` (see :mod:`runwire.edge.service.fork`) and a run's metadata,
``GET /v1/runs/{run_id}``, with its forks."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..service.context import Edge
from ..service.fork import answer, fork_for, fork_request, with_forks
from ..service.params import bounded_body

_json = msgspec.json.Encoder()


def fork_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        principal = edge.gate.principal(request.headers, request.query_params)
        body = fork_request(await bounded_body(
            request, edge.settings.max_control_bytes, timeout_s=edge.settings.body_timeout_s, what="fork"))
        result = await fork_for(edge, principal, request.path_params["run_id"], at=body.at, run_id=body.run_id)
        return Response(_json.encode(answer(result)), status_code=201 if result.created else 200,
                        media_type="application/json",
                        headers={"location": f"/v1/runs/{result.fork.run_id}/stream"})

    return endpoint


def run_endpoint(edge: Edge) -> Any:
    """``GET /v1/runs/{run_id}``: one run's metadata (what ``GET /v1/runs`` lists), with its forks."""
    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        principal = edge.gate.principal(request.headers, request.query_params)
        await edge.gate.check_run(principal, run_id, "read")
        info = await edge.store.require_run(run_id)
        [info] = await with_forks(edge, principal, [info])
        return Response(_json.encode(info), media_type="application/json")

    return endpoint


def fork_routes(edge: Edge) -> list[Route]:
    return [Route("/v1/runs/{run_id}", run_endpoint(edge)),
            Route("/v1/runs/{run_id}/fork", fork_endpoint(edge), methods=["POST"])]
