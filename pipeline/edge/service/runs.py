"""The runs a caller may list: one rule for every entrance (``GET /v1/runs``, gRPC ``ListRuns``,
A2A ``ListTasks``)."""

from __future__ import annotations

from datetime import datetime

from ...core.errors import RequestError
from ...store.base import RunInfo
from .auth import Principal
from .context import Edge
from .fork import with_forks


async def list_runs(
    edge: Edge,
    principal: Principal | None,
    *,
    tenant: str | None,
    state: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    thread_id: str | None = None,
) -> list[RunInfo]:
    """The runs a caller may see, newest first (``tenant`` applies only without auth; ``limit`` 1–1000)."""
    edge.gate.require_scope(principal, "read")
    if not 1 <= limit <= 1000:
        raise RequestError(f"bad limit {limit}: must be between 1 and 1000")
    runs = await edge.store.runs(
        tenant=principal.tenant if principal else tenant,
        state=state,
        since=since,
        until=until,
        limit=limit,
        thread_id=thread_id,
    )
    return await with_forks(edge, principal, [r for r in runs if principal is None or principal.covers(r.run_id)])
