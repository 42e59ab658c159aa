"""Threads: a chat's runs, and ``GET /v1/threads/{thread_id}/stream`` for AI SDK resume.

A run answers at most one thread (``thread_id`` on its own events: the
publisher SDK's ``pub.run(..., thread=…)``, HTTP ingest's ``Thread-Id``).
The thread's **active run** is its newest run (by creation) when that run has
not ended and has not been silent for longer than the edge's ``silence_s``;
an older unfinished run behind a newer one is not active (the chat moved on).

``GET /v1/threads/{thread_id}/stream`` is what the AI SDK's
``DefaultChatTransport.reconnectToStream`` asks for when its ``api`` is
``{edge}/v1/threads``: the active run as an AI SDK UI message stream from
its start (``x-vercel-ai-ui-message-stream: v1``, ``data: [DONE]`` at the
end), or ``204 No Content`` when the thread has no active run. The stream's
``start`` chunk's ``messageId`` is the run id, so the resumed message replaces
the partial one. Same auth as a run's stream: ``read`` scope, and only the
token's tenant's (and ``runs``') runs are a thread's runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ... import protocols
from ...core.errors import ConfigError
from ...store.base import RunInfo
from ..fanout.filters import CHILDREN, PROFILE_NAMES
from ..fanout.session import StreamRequest
from .auth import Principal
from .context import Edge

AI_SDK = "ai-sdk"
THREAD_RUNS = 20
"""Newest runs of a thread looked at to find its latest."""


async def active_run(edge: Edge, principal: Principal | None, thread_id: str) -> RunInfo | None:
    """The thread's active run as the replay log knows it, or None."""
    runs = await edge.store.runs(
        tenant=principal.tenant if principal else None, thread_id=thread_id, limit=THREAD_RUNS
    )
    visible = [r for r in runs if principal is None or principal.covers(r.run_id)]
    if not visible:
        return None
    latest = max(visible, key=lambda r: (r.created_at.timestamp() if r.created_at else 0.0, r.run_id))
    if latest.terminal:
        return None
    silence = edge.settings.silence_s
    if silence > 0 and latest.updated_at is not None and time.time() - latest.updated_at.timestamp() > silence:
        return None
    return latest


def chat_stream(edge: Edge, run_id: str, query: Mapping[str, str]) -> StreamRequest:
    """The AI SDK stream of a run from its start (``detail``, ``profile``, ``children`` apply)."""
    detail = query.get("detail") or edge.settings.default_detail
    profile, children = query.get("profile", "default"), query.get("children", "flatten")
    for name, value, allowed in (("detail", detail, ("full", "shaped")), ("profile", profile, PROFILE_NAMES),
                                 ("children", children, CHILDREN)):
        if value not in allowed:
            raise ConfigError(f"unknown {name} {value!r}; use one of {', '.join(sorted(allowed))}")
    return StreamRequest(run_id=run_id, view="raw" if detail == "full" else "shaped", format=AI_SDK,
                         profile=profile, children=children)


AI_SDK_HEADERS: dict[str, str] = dict(protocols.egress(AI_SDK).headers)
