"""The edge's settings: one msgspec Struct, validated, unknown keys rejected."""

from __future__ import annotations

import msgspec

from ..core import limits


class EdgeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How one edge process serves its clients.

    The defaults suit thousands of clients per process; every limit is
    documented in ``docs/edge.md``.
    """

    keepalive_s: float = 15.0
    """Seconds between ``: keepalive`` comments on an idle SSE stream (Koder agent stream §5.1)."""
    client_queue_bytes: int = 512 * 1024
    """Bytes of encoded frames one client may have queued before slow-client drops start (Koder agent stream §4 R4)."""
    client_queue_events: int = 2048
    """Frames one client may have queued before slow-client drops start (Koder agent stream §4 R4)."""
    silence_s: float = 330.0
    """A run with no event for this long and no terminal event is ended as ``error``
    on every stream the edge serves, so no client waits forever (0 disables). A little
    longer than the worker's own silence limit, whose terminal event is then the real one."""
    secret: str | None = None
    """HS256 key for bearer tokens (``RUNWIRE_SECRET``); None serves without auth (loopback only)."""
    unpublished_wait_s: float = 30.0
    """How long a stream request for a run nobody has published yet waits for its first
    event before it gets the error ``KAI-STREAM-RUN-0003`` (no request waits without bound)."""
    durable_sse_s: float = 60.0
    """A Durable Streams ``live=sse`` response ends after about this long (after a control event;
    the client reconnects at its offset), so a CDN can collapse readers (0: only at the run's end)."""
    long_poll_s: float = 20.0
    """How long a Durable Streams ``live=long-poll`` read waits for new events before ``204``."""
    tail_block_ms: int = 200
    """How long one multiplexed bus read waits when no stream has news."""
    history_batch: int = 1000
    """Events per read while a client catches up."""
    max_ingest_bytes: int = limits.REQUEST_BYTES
    """Largest ingest request accepted: an HTTP ingest body, a Durable Streams append, a gRPC ``Ingest``."""
    max_ingest_events: int = limits.EVENTS_PER_REQUEST
    """Most events in one ingest request, of any entrance."""
    max_control_bytes: int = limits.CONTROL_BYTES
    """Largest control command accepted (HTTP body; gRPC ``Control`` args)."""
    streams_per_token: int = 64
    """Streams one token may hold open at once on this edge process, of every transport
    (waiting ones included); past it: 429, WebSocket 1008, gRPC RESOURCE_EXHAUSTED."""
    requests_per_socket: int = 8
    """Chat responses (``send``/``resume``) one ``/v1/threads`` socket may stream at once;
    one more closes the socket with 1008."""
    body_timeout_s: float = 60.0
    """Time a client has to send an ingest or control body (408 past it)."""
    refusal_floor_s: float = 0.05
    """With auth, a 404 for a run (another tenant's, or none) is answered no sooner than this
    after the lookup began, so the time it takes doesn't tell the two apart."""
    write_timeout_s: float = 2.0
    """How long a final error frame may take to reach a client before the connection is closed."""
    webhooks_allow_private: bool = False
    """Let webhooks point at loopback and private addresses (``--webhooks-allow-private``);
    otherwise such a URL is refused when the webhook is added."""
    default_detail: str = "shaped"
    """``detail`` when the client does not ask (``shaped``: Koder agent stream §4 R1)."""
