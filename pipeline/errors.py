"""runwire's one error tree.

::

    RunwireError
    ├── ProtocolError            a frame that is not a valid event   (final)
    │   ├── MalformedFrame       KAI-STREAM-PROTO-0001
    │   └── UnknownEventType     KAI-STREAM-PROTO-0002
    ├── ConfigError              a bad URL, flag or setting          (final)
    ├── AuthError                missing/invalid token or scope      (final)
    ├── ReplayExpired            KAI-STREAM-CONN-0002: cursor older than retention (final)
    ├── UnknownRun               no such run (or not visible to the tenant) (final)
    ├── BackpressureError        KAI-STREAM-BUF-0001: client can't keep up (final for the connection)
    ├── BusError                 the bus failed
    │   ├── BusUnavailable       connection lost/refused, timeout      (retriable)
    │   └── DeliveryTimeout      publisher gave up after its deadline (final; names what was not delivered)
    └── StoreError               the replay log failed
        └── StoreUnavailable     connection lost/refused               (retriable)

``retriable`` is part of the type: a caller may retry a retriable error with
backoff; a final one is reported. Wire-facing errors carry the spec's
``KAI-STREAM-*`` code in ``code``.
"""

from __future__ import annotations

PROTO_MALFORMED = "KAI-STREAM-PROTO-0001"
PROTO_UNKNOWN_TYPE = "KAI-STREAM-PROTO-0002"
CONN_DISCONNECTED = "KAI-STREAM-CONN-0001"
CONN_REPLAY_EXPIRED = "KAI-STREAM-CONN-0002"
BUF_DROP = "KAI-STREAM-BUF-0001"


class RunwireError(Exception):
    """Base of every error runwire raises on purpose."""

    retriable: bool = False
    code: str | None = None


class ProtocolError(RunwireError):
    """A frame that is not a valid event of the format it was read as."""

    code: str = PROTO_MALFORMED

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


class ConfigError(RunwireError):
    """A bad URL, flag or setting; the message says which and why."""


class AuthError(RunwireError):
    """A missing or invalid bearer token, or one without the needed scope."""

    def __init__(self, message: str, *, status: int = 401) -> None:
        self.status = status
        super().__init__(message)


class ReplayExpired(RunwireError):
    """The requested cursor is older than what the hot tier and the replay log keep."""

    code = CONN_REPLAY_EXPIRED


class UnknownRun(RunwireError):
    """No run with that id (or it expired, or belongs to another tenant)."""


class BackpressureError(RunwireError):
    """A client could not take even control events; it is disconnected and may resume."""

    code = BUF_DROP


class BusError(RunwireError):
    """The bus failed."""


class BusUnavailable(BusError):
    """The bus could not be reached; retry with backoff."""

    retriable = True


class DeliveryTimeout(BusError):
    """The publisher gave up after its deadline; ``undelivered`` names what was not sent."""

    def __init__(self, message: str, undelivered: list[tuple[str, int]]) -> None:
        self.undelivered = undelivered
        super().__init__(message)


class StoreError(RunwireError):
    """The replay log failed."""


class StoreUnavailable(StoreError):
    """The replay log could not be reached; retry with backoff."""

    retriable = True
