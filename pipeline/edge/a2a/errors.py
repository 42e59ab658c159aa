"""A2A's errors, as both bindings carry them (the A2A 1.0 specification's error table).

A refusal the edge gives every entrance — no valid token (401), a missing
scope (403), a token over its quota (429), the bus or the replay log
unavailable (503) — stays the app's own HTTP answer (``app.error_response``,
the one error mapping): an A2A client sees the HTTP status, as the
specification has authentication fail. What A2A names itself is an
:class:`A2AFault`, rendered here for JSON-RPC (``error.code``) and HTTP+JSON
(``google.rpc.Status`` with an ``ErrorInfo`` reason).
"""

from __future__ import annotations

from typing import Any

from ...core.errors import (
    AuthError,
    QuotaExceeded,
    RequestError,
    RunFinished,
    RunwireError,
    UnknownRun,
)

DOMAIN = "a2a-protocol.org"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"

FAULTS: dict[str, tuple[int, int, str]] = {
    "TASK_NOT_FOUND": (-32001, 404, "NOT_FOUND"),
    "TASK_NOT_CANCELABLE": (-32002, 400, "FAILED_PRECONDITION"),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": (-32003, 400, "FAILED_PRECONDITION"),
    "UNSUPPORTED_OPERATION": (-32004, 400, "FAILED_PRECONDITION"),
    "CONTENT_TYPE_NOT_SUPPORTED": (-32005, 400, "INVALID_ARGUMENT"),
    "EXTENDED_AGENT_CARD_NOT_CONFIGURED": (-32007, 400, "FAILED_PRECONDITION"),
    "VERSION_NOT_SUPPORTED": (-32009, 400, "FAILED_PRECONDITION"),
    "INVALID_REQUEST": (-32600, 400, "INVALID_ARGUMENT"),
    "METHOD_NOT_FOUND": (-32601, 404, "NOT_FOUND"),
    "INVALID_PARAMS": (-32602, 400, "INVALID_ARGUMENT"),
    "INTERNAL_ERROR": (-32603, 500, "INTERNAL"),
    "PARSE_ERROR": (-32700, 400, "INVALID_ARGUMENT"),
}
"""reason → (JSON-RPC code, HTTP status, gRPC status), as the specification's table has them."""


class A2AFault(Exception):
    """An error A2A names (``reason`` is a key of :data:`FAULTS`)."""

    def __init__(self, reason: str, message: str, *, status: int | None = None) -> None:
        assert reason in FAULTS
        self.reason = reason
        self.message = message
        self.status = status
        """An HTTP status other than the reason's (the app's own for the bus or log failing: 503)."""
        super().__init__(message)

    @property
    def http_status(self) -> int:
        return self.status or FAULTS[self.reason][1]

    def jsonrpc(self, request_id: Any) -> dict[str, Any]:
        """The JSON-RPC error response."""
        code = FAULTS[self.reason][0]
        return {"jsonrpc": "2.0", "id": request_id, "error": {
            "code": code, "message": self.message, "data": [self._info()]}}

    def rest(self) -> dict[str, Any]:
        """The HTTP+JSON error body (``google.rpc.Status``)."""
        _code, status, name = FAULTS[self.reason]
        status = self.http_status
        name = "UNAVAILABLE" if status == 503 else name
        return {"error": {"code": status, "status": name, "message": self.message, "details": [self._info()]}}

    def _info(self) -> dict[str, Any]:
        return {"@type": ERROR_INFO, "reason": self.reason, "domain": DOMAIN, "metadata": {}}


def as_fault(exc: RunwireError, status: int, *, finished: str = "UNSUPPORTED_OPERATION") -> A2AFault | None:
    """The A2A error a runwire error is, or None when it stays the app's HTTP refusal.

    ``status`` is the app's one mapping's HTTP status for ``exc`` (``transports.http_status``): a
    server-side failure (5xx: the bus or the replay log) is A2A's internal error with that status
    (JSON-RPC −32603; HTTP+JSON that status, ``UNAVAILABLE`` for 503). ``finished`` is the reason a
    run that has ended gets (``TASK_NOT_CANCELABLE`` for a cancel).
    """
    if status >= 500:
        return A2AFault("INTERNAL_ERROR", str(exc), status=status)
    if isinstance(exc, AuthError | QuotaExceeded):
        return None
    if isinstance(exc, UnknownRun):
        return A2AFault("TASK_NOT_FOUND", str(exc))
    if isinstance(exc, RunFinished):
        return A2AFault(finished, str(exc))
    if isinstance(exc, RequestError) and exc.status == 413:
        return None
    return A2AFault("INVALID_PARAMS", str(exc))
