"""Webhook subscriptions as the API sees them: a request checked, a webhook made, a webhook shown.

One code path for every entrance that manages webhooks (the edge's
``/v1/webhooks``, and through it ``runwire webhooks``). Who may do what is
the entrance's to check; what a webhook may be is checked here: an
``http(s)`` URL that is not refused (:func:`~.targets.check_url`), event types
runwire sends, a run id within the id bound, at most
:data:`~runwire.core.limits.WEBHOOKS_PER_TENANT` webhooks per tenant.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..core import limits
from ..core.errors import REQ_BAD_BODY, QuotaExceeded, RequestError
from ..core.ulid import new_random_ulid
from ..store.outbox import FINISHED, NOTICE_TYPES, Outbox, Subscription
from .signing import new_secret
from .targets import check_url

ROTATION_OVERLAP_S = 86400.0
"""After a rotation, deliveries are signed with the previous secret too for this long (a
receiver that still verifies with the old one keeps accepting them)."""


class WebhookDisabled(RequestError):
    """An action on a disabled webhook that would need it enabled (a test delivery): 409."""

    status = 409
    grpc = "FAILED_PRECONDITION"


class NewWebhook(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A ``POST /v1/webhooks`` body."""

    url: str
    events: list[str] = msgspec.field(default_factory=lambda: [FINISHED])
    run_id: str | None = None


def new_webhook(body: bytes) -> NewWebhook:
    """A request body decoded and its fields checked (RequestError ``KAI-STREAM-REQ-0003`` else)."""
    try:
        request = msgspec.json.decode(body, type=NewWebhook)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RequestError(f"bad webhook body: {exc}", code=REQ_BAD_BODY) from None
    unknown = sorted(set(request.events) - set(NOTICE_TYPES))
    if unknown or not request.events:
        raise RequestError(f"bad webhook events {unknown or '[]'}: use {', '.join(NOTICE_TYPES)}",
                           code=REQ_BAD_BODY)
    if request.run_id is not None and not 0 < len(request.run_id) <= limits.ID_CHARS:
        raise RequestError(f"a run id is 1 to {limits.ID_CHARS} characters", code=REQ_BAD_BODY)
    request.events = sorted(set(request.events))
    return request


async def add_webhook(outbox: Outbox, tenant: str | None, request: NewWebhook, *,
                      allow_private: bool, prefix: str = "wh_", headers: dict[str, str] | None = None) -> Subscription:
    """Make a webhook for ``tenant`` (its secret is in the result, and shown this once); ``prefix``
    of its id: ``wh_``, or an A2A push config's (``runwire.protocols.a2a.PUSH_CONFIG_PREFIX``);
    ``headers``: what its deliveries carry besides the signature (an A2A config's credentials)."""
    await check_url(request.url, allow_private=allow_private)
    sub = Subscription(id=new_random_ulid(prefix), tenant=tenant, url=request.url, events=request.events,
                       run_id=request.run_id, secret=new_secret(), created_at=time.time(), headers=headers or {})
    if not await outbox.add_webhook(sub, most=limits.WEBHOOKS_PER_TENANT):
        raise QuotaExceeded(f"a tenant has at most {limits.WEBHOOKS_PER_TENANT} webhooks; remove one first")
    return sub


async def rotate_secret(outbox: Outbox, webhook_id: str) -> Subscription | None:
    """A new secret for a webhook; the previous one is signed with too for :data:`ROTATION_OVERLAP_S`."""
    return await outbox.rotate_webhook(webhook_id, new_secret(), time.time() + ROTATION_OVERLAP_S)


def _time(value: float | None) -> str | None:
    return None if value is None else datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")


def view(sub: Subscription, *, secret: bool = False, counts: tuple[int, int] | None = None) -> dict[str, Any]:
    """A webhook as the API shows it: the secret only when it was just made (``secret``)."""
    shown: dict[str, Any] = {
        "id": sub.id, "url": sub.url, "events": sub.events, "run_id": sub.run_id, "tenant": sub.tenant,
        "status": "disabled" if sub.disabled_at is not None else "active",
        "created_at": _time(sub.created_at), "disabled_at": _time(sub.disabled_at),
        "disabled_reason": sub.disabled_reason, "last_success_at": _time(sub.last_success_at),
        "last_failure_at": _time(sub.last_failure_at), "last_error": sub.last_error,
    }
    if counts is not None:
        shown["queued"], shown["failed"] = counts
    if secret:
        shown["secret"] = sub.secret
    return shown
