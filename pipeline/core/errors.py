"""runwire's one error tree.

::

    RunwireError
    ├── ProtocolError            a frame that is not a valid event   (final)
    │   ├── MalformedFrame       KAI-STREAM-PROTO-0001
    │   └── UnknownEventType     KAI-STREAM-PROTO-0002
    ├── ConfigError              a bad URL, flag or setting          (final)
    ├── AuthError                KAI-STREAM-AUTH-0001 (401) · -0002 (403, scope)   (final)
    │   └── WriteRefused         KAI-STREAM-AUTH-0003: a run the write names is not the caller's
    ├── RequestError             KAI-STREAM-REQ-*: a bad parameter or body (final)
    │   ├── BodyTooLarge         KAI-STREAM-REQ-0002 (413)
    │   └── QuotaExceeded        KAI-STREAM-REQ-0005 (429 + Retry-After): a token or socket is at its quota
    ├── ReplayExpired            KAI-STREAM-CONN-0002: cursor older than retention (final)
    ├── UnknownRun               KAI-STREAM-RUN-0001: no such run (or not the tenant's) (final)
    │   └── RunNotPublished      KAI-STREAM-RUN-0003: nothing published within the edge's wait
    ├── RunFinished              KAI-STREAM-RUN-0002: control for a run that has ended (final)
    ├── BusError                 the bus failed
    │   ├── BusUnavailable       connection lost/refused, timeout      (retriable)
    │   │   └── BusFull          a write refused at the bus's memory limit (retriable)
    │   ├── DeliveryTimeout      publisher gave up after its deadline (final; names what was not delivered)
    │   └── LeasesLost           a worker's shard leases lapsed while a write waited (final for that write)
    └── StoreError               the replay log failed
        └── StoreUnavailable     connection lost/refused               (retriable)
            └── StoreFull        a write refused: the log's disk is full (retriable)

Every entrance answers an error from the same table, the class's ``status``
(HTTP; a refused WebSocket closes with 4000 + it) and ``grpc`` (the gRPC
status code's name): 400/INVALID_ARGUMENT for a bad frame, setting or
parameter, 401/UNAUTHENTICATED and 403/PERMISSION_DENIED, 404/NOT_FOUND,
409/FAILED_PRECONDITION for a finished run, 413 and 429/RESOURCE_EXHAUSTED,
400/OUT_OF_RANGE for an expired cursor, 503/UNAVAILABLE when the bus or the
replay log failed, 500/INTERNAL for anything else.

``retriable`` is part of the type: a caller may retry a retriable error with
backoff; a final one is reported. Wire-facing errors carry the spec's
``KAI-STREAM-*`` code in ``code``. The messages of ConfigError, BusError and
StoreError — the ones that name URLs — are redacted when the error is made
(``runwire.core.redaction``): no password or token reaches a log, a traceback or
an answer through them.
"""

from __future__ import annotations

import msgspec

from .redaction import redact_text

PROTO_MALFORMED = "KAI-STREAM-PROTO-0001"
PROTO_UNKNOWN_TYPE = "KAI-STREAM-PROTO-0002"
CONN_DISCONNECTED = "KAI-STREAM-CONN-0001"
CONN_REPLAY_EXPIRED = "KAI-STREAM-CONN-0002"
BUF_DROP = "KAI-STREAM-BUF-0001"
# Codes of runwire's own (the Koder agent stream §8 list has none for these):
AUTH_UNAUTHENTICATED = "KAI-STREAM-AUTH-0001"
AUTH_SCOPE = "KAI-STREAM-AUTH-0002"
AUTH_WRITE_REFUSED = "KAI-STREAM-AUTH-0003"
REQ_BAD_PARAMETER = "KAI-STREAM-REQ-0001"
REQ_TOO_LARGE = "KAI-STREAM-REQ-0002"
REQ_BAD_BODY = "KAI-STREAM-REQ-0003"
REQ_SLOW_BODY = "KAI-STREAM-REQ-0004"
REQ_QUOTA = "KAI-STREAM-REQ-0005"
RUN_UNKNOWN = "KAI-STREAM-RUN-0001"
RUN_FINISHED = "KAI-STREAM-RUN-0002"
RUN_NOT_PUBLISHED = "KAI-STREAM-RUN-0003"


class RunwireError(Exception):
    """Base of every error runwire raises on purpose."""

    retriable: bool = False
    code: str | None = None
    status: int = 500
    """The HTTP status of this error (see the module's table)."""
    grpc: str = "INTERNAL"
    """The name of its gRPC status code (a ``grpc.StatusCode`` member)."""
    reason: str | None = None
    """A retriable error's state in a word (``unavailable``, ``full``): what ``/readyz`` and
    the pause log lines say."""


class ProtocolError(RunwireError):
    """A frame that is not a valid event of the format it was read as."""

    code: str = PROTO_MALFORMED
    status = 400
    grpc = "INVALID_ARGUMENT"

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None) -> None:
        self.message = message
        self.field = field
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" at `{self.field}`" if self.field else ""
        return f"{self.code}: {self.message}{where}"

    def at_line(self, line: int) -> ProtocolError:
        """The same error, tagged with the input line it came from."""
        self.line = line
        return self


class MalformedFrame(ProtocolError):
    code = PROTO_MALFORMED


class UnknownEventType(ProtocolError):
    code = PROTO_UNKNOWN_TYPE


class _Redacted(RunwireError):
    """An error whose message may name a URL: its password and secret parameters become ``***``."""

    def __init__(self, message: str = "") -> None:
        super().__init__(redact_text(message))


class ConfigError(_Redacted):
    """A bad URL, flag or setting; the message says which and why."""

    status = 400
    grpc = "INVALID_ARGUMENT"


class AuthError(RunwireError):
    """A missing or invalid bearer token (401), or one without the needed scope (403)."""

    def __init__(self, message: str, *, status: int = 401) -> None:
        self.status = status
        self.code = AUTH_UNAUTHENTICATED if status == 401 else AUTH_SCOPE
        self.grpc = "UNAUTHENTICATED" if status == 401 else "PERMISSION_DENIED"
        super().__init__(message)


class WriteRefused(AuthError):
    """A write names a run (its ``run_id``, ``parent_id`` or ``root_id``) that belongs to
    another tenant or lies outside the token's ``runs``: 403 ``KAI-STREAM-AUTH-0003``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=403)
        self.code = AUTH_WRITE_REFUSED


class RequestError(RunwireError):
    """A request parameter or body the edge refuses: ``status`` and a ``KAI-STREAM-REQ-*`` code."""

    code = REQ_BAD_PARAMETER
    status = 400
    grpc = "INVALID_ARGUMENT"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message)


class BodyTooLarge(RequestError):
    """A request body over its endpoint's limit (413)."""

    code = REQ_TOO_LARGE
    status = 413
    grpc = "RESOURCE_EXHAUSTED"


class QuotaExceeded(RequestError):
    """A token (or one socket) holds as much of the edge as its quota allows: 429, retry later.

    HTTP answers 429 with ``Retry-After``, a WebSocket closes with 1008 (policy
    violation), gRPC ends the call with ``RESOURCE_EXHAUSTED``.
    """

    code = REQ_QUOTA
    status = 429
    grpc = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReplayExpired(RunwireError):
    """The requested cursor is older than what the hot tier and the replay log keep."""

    code = CONN_REPLAY_EXPIRED
    status = 400
    grpc = "OUT_OF_RANGE"


class UnknownRun(RunwireError):
    """No run with that id (or it expired, or belongs to another tenant)."""

    code = RUN_UNKNOWN
    status = 404
    grpc = "NOT_FOUND"


class RunFinished(RunwireError):
    """The run has ended (``done``, ``aborted``, ``error``): nothing can control it any more."""

    code = RUN_FINISHED
    status = 409
    grpc = "FAILED_PRECONDITION"


class RunNotPublished(UnknownRun):
    """A stream asked for a run that nobody published within the edge's ``unpublished_wait_s``."""

    code = RUN_NOT_PUBLISHED


class BusError(_Redacted):
    """The bus failed."""

    status = 503
    grpc = "UNAVAILABLE"


class BusUnavailable(BusError):
    """The bus could not be reached; retry with backoff."""

    retriable = True
    reason = "unavailable"


class BusFull(BusUnavailable):
    """The bus refused a write at its memory limit (Redis ``maxmemory`` under ``noeviction``).

    A pause, not a failure: nothing was written by the refused command, and
    the write is retried with backoff like one to an unreachable bus, until
    memory is freed (streams trimmed or expired, ``maxmemory`` raised)."""

    reason = "full"


class LeasesLost(BusError):
    """A worker's leases on shards lapsed while one of its writes waited out a pause (a full or
    unreachable Redis): the write is not tried again — those shards' new owner redoes their
    entries from the stored checkpoints — and the worker drops what it holds for them."""


class DeliveryTimeout(BusError):
    """The publisher gave up after its deadline; ``undelivered`` names what was not sent."""

    def __init__(self, message: str, undelivered: list[tuple[str, int]]) -> None:
        self.undelivered = undelivered
        super().__init__(message)


class StoreError(_Redacted):
    """The replay log failed."""

    status = 503
    grpc = "UNAVAILABLE"


class StoreUnavailable(StoreError):
    """The replay log could not be reached; retry with backoff."""

    retriable = True
    reason = "unavailable"


class StoreFull(StoreUnavailable):
    """The replay log refused a write because its disk is full (PostgreSQL's SQLSTATE 53100
    ``disk_full``: "could not extend file", a full ``pg_wal``; SQLite's "database or disk is full").

    A pause, like :class:`BusFull`: the refused transaction wrote nothing, and the write is
    retried with backoff until there is room again."""

    reason = "full"


class LineError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A bad line of an input (HTTP ingest body, JSONL import): 1-based line number,
    ``KAI-STREAM-*`` code, reason, and the field at fault when one is known."""

    line: int
    code: str
    message: str
    field: str | None = None


def line_error(number: int, exc: RunwireError) -> LineError:
    """The per-line report of an error with a ``KAI-STREAM-*`` code."""
    field = exc.field if isinstance(exc, ProtocolError) else None
    message = exc.message if isinstance(exc, ProtocolError) else str(exc)
    return LineError(line=number, code=exc.code or PROTO_MALFORMED, message=message, field=field)
