"""Every entrance answers an error from one table on the error classes (runwire.core.errors):
the HTTP status and the gRPC code of each kind of error agree, whichever entrance refuses it."""

from __future__ import annotations

import grpc
import pytest

# the modules that define error classes of their own, so every_error_class() sees them
import runwire.edge.http.app
import runwire.jobs.fork
import runwire.webhooks.subscriptions  # noqa: F401
from runwire.core import errors
from runwire.edge.fanout.transports import http_status
from runwire.edge.grpc.server import status_of

AGREE = {
    400: {"INVALID_ARGUMENT", "OUT_OF_RANGE"}, 401: {"UNAUTHENTICATED"}, 403: {"PERMISSION_DENIED"},
    404: {"NOT_FOUND"}, 408: {"DEADLINE_EXCEEDED"}, 409: {"FAILED_PRECONDITION", "ALREADY_EXISTS"},
    413: {"RESOURCE_EXHAUSTED"}, 429: {"RESOURCE_EXHAUSTED"}, 500: {"INTERNAL"}, 503: {"UNAVAILABLE"},
}
"""HTTP status → the gRPC codes that say the same (gRPC's own HTTP mapping, where it has one)."""


def every_error_class() -> list[type[errors.RunwireError]]:
    seen: list[type[errors.RunwireError]] = []
    todo = [errors.RunwireError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


def sample(cls: type[errors.RunwireError]) -> errors.RunwireError:
    if issubclass(cls, errors.AuthError) and cls is errors.AuthError:
        return cls("no token")
    if cls is errors.DeliveryTimeout:
        return cls("gave up", [])
    return cls("refused")


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
def test_each_error_has_one_http_status_and_the_grpc_code_that_says_the_same(
        cls: type[errors.RunwireError]) -> None:
    exc = sample(cls)
    assert http_status(exc) == exc.status
    assert status_of(exc) is grpc.StatusCode[exc.grpc]
    assert exc.grpc in AGREE[exc.status], (cls.__name__, exc.status, exc.grpc)


def test_a_failing_bus_or_replay_log_is_unavailable_on_every_entrance_and_a_scope_refusal_forbidden() -> None:
    for exc in (errors.StoreUnavailable("down"), errors.StoreError("broken"), errors.BusFull("full"),
                errors.BusError("broken")):
        assert (http_status(exc), status_of(exc)) == (503, grpc.StatusCode.UNAVAILABLE)
    assert (http_status(errors.AuthError("no scope", status=403)),
            status_of(errors.AuthError("no scope", status=403))) == (403, grpc.StatusCode.PERMISSION_DENIED)
    assert status_of(errors.UnknownRun("r")) is grpc.StatusCode.NOT_FOUND
