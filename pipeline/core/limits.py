"""Every size, depth and count runwire accepts from outside: one table, every entrance.

HTTP ingest and control, Durable Streams appends, the WebSocket chat socket,
gRPC ``Ingest`` and ``Control``, the publisher SDK and ``replay import`` all
check their input against these numbers, with the same error family:
``KAI-STREAM-REQ-0002`` (too large: 413, WebSocket close 1009, gRPC
``RESOURCE_EXHAUSTED``) for bytes and counts, ``KAI-STREAM-REQ-0003`` or
``KAI-STREAM-PROTO-0001`` for depth and ids. ``docs/security.md`` § Limits is
this table in words; the edge's :class:`~runwire.edge.settings.EdgeSettings`
take their defaults from here, so a deployment tunes one place.

This module imports nothing of runwire's but the error tree: the codec, the
edge and the offline jobs all read it.
"""

from __future__ import annotations

from typing import Final

from .errors import BodyTooLarge

FRAME_BYTES: Final = 1 << 20
"""One encoded event, one JSONL line, one chat or WebSocket message: 1 MiB."""
DEPTH: Final = 64
"""Deepest JSON nesting of an event or a request body (the envelope object is level 1)."""
ID_CHARS: Final = 256
"""Longest run id, parent/root/child id, tenant, thread id, producer id or chat request id."""
REQUEST_BYTES: Final = 16 * 1024 * 1024
"""Largest ingest request: an HTTP ingest body, a Durable Streams append, one gRPC ``Ingest`` call."""
EVENTS_PER_REQUEST: Final = 100_000
"""Most events (lines, messages) in one ingest request of any entrance."""
CONTROL_BYTES: Final = 64 * 1024
"""Largest control command: the HTTP control body, a gRPC ``Control``'s ``args``."""
TOOL_VALUE_BYTES: Final = 256 * 1024
"""Largest tool input, output or error a framework integration publishes whole; a larger one
is cut to this many bytes of its JSON and marked (``runwire.integrations.values``)."""
WEBHOOKS_PER_TENANT: Final = 100
"""Most webhooks one tenant (or, without auth, the whole edge) may have at once."""
WEBHOOK_BODY_BYTES: Final = 16 * 1024
"""Largest ``POST /v1/webhooks`` body."""
TASK_HISTORY: Final = 100
"""Most messages of an A2A task's history kept and answered (the latest ones)."""
TASK_BYTES: Final = FRAME_BYTES
"""Most bytes of one A2A task's artifacts and history in an answer (``GetTask``, ``ListTasks``, a
blocking ``SendMessage``): past it the rest is cut and the task's metadata says so."""
TASK_PAGE_BYTES: Final = 8 * FRAME_BYTES
"""Most bytes of one ``ListTasks`` page: it ends early, with a ``nextPageToken``, before passing it."""
TASK_COUNT: Final = 10_000
"""Most tasks ``ListTasks`` counts for its ``totalSize`` (one query that stops there): past it, this."""
PUSH_SECRET_CHARS: Final = 4096
"""Longest token, or authentication scheme and credentials, of an A2A push-notification config."""
FORKS_PER_RUN: Final = 100
"""Most forks made of one run (``POST /v1/runs/{id}/fork``, a Durable Streams fork, ``replay fork``)."""
FORK_DEPTH: Final = 8
"""Longest chain of forks of forks: a run that is the 8th fork down from a run that is no fork is
not forked again (each run's forks are bounded by :data:`FORKS_PER_RUN`, so a tenant's forks from one
run are too)."""
HEADER_CHARS: Final = ID_CHARS
"""Longest value of a header that names something (``Thread-Id``, ``Producer-Id``)."""


def check_size(size: int, limit: int, what: str) -> None:
    """BodyTooLarge (``KAI-STREAM-REQ-0002``) when ``size`` bytes are over ``limit``."""
    if size > limit:
        raise BodyTooLarge(f"{what} of {size} bytes is over the {limit}-byte limit")


def check_count(count: int, limit: int, what: str) -> None:
    """BodyTooLarge (``KAI-STREAM-REQ-0002``) when a request carries more than ``limit`` items."""
    if count > limit:
        raise BodyTooLarge(f"{what} carries more than {limit} events, the limit of one request")
