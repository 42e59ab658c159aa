"""A stream's request from its parameters, the same whichever entrance asks (HTTP, WebSocket,
gRPC): the view, the format, the profile, the children and the cursor, each checked."""

from __future__ import annotations

from datetime import datetime

from ... import protocols
from ..fanout.filters import CHILDREN, PROFILE_NAMES
from ..fanout.session import StreamRequest
from ..settings import EdgeSettings
from .params import choice, cursor, moment


def stream_request(
    run_id: str, query: dict[str, str], headers: dict[str, str], settings: EdgeSettings
) -> StreamRequest:
    """Validate a stream's parameters (query, ``Last-Event-ID``, ``Detail`` header)."""
    detail = query.get("detail") or headers.get("detail") or settings.default_detail
    choice(detail, ("full", "shaped"), "detail")
    format_name = choice(query.get("format", "koder"), tuple(protocols.EGRESS), "format")
    after, live = cursor(query, headers.get("last-event-id"))
    return StreamRequest(
        run_id=run_id,
        view="raw" if detail == "full" else "shaped",
        format=format_name,
        profile=choice(query.get("profile", "default"), PROFILE_NAMES, "profile"),
        children=choice(query.get("children", "flatten"), CHILDREN, "children"),
        after=after,
        live=live,
    )


def parse_time(value: str | None, name: str = "time") -> datetime | None:
    """A time parameter (RFC 3339); RequestError ``KAI-STREAM-REQ-0001`` when it isn't one."""
    return moment(value, name)
