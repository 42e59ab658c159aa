"""``/v1/webhooks``: a tenant's webhooks, checked like control (the ``control`` scope).

=============================================  =========================================
``POST   /v1/webhooks``                          add: ``{"url", "events", "run_id"?}`` → 201, secret shown once
``GET    /v1/webhooks``                          the tenant's webhooks (status, last success/failure)
``GET    /v1/webhooks/{id}``                     one, with its queued and failed deliveries
``DELETE /v1/webhooks/{id}``                     remove it and what it still had to deliver → 204
``POST   /v1/webhooks/{id}/rotate``              a new secret (the old one honoured 24 h more)
``POST   /v1/webhooks/{id}/test``                queue a ``webhook.test`` delivery → 202
=============================================  =========================================

A test is refused with 409 on a disabled webhook (it would get nothing), and
with 429 (``Retry-After``) past :data:`~.quotas.WEBHOOK_TESTS` — per webhook
and per tenant, on each edge process.

A tenant sees only its own webhooks; another tenant's id answers 404 like
one that does not exist. A token limited to some runs may only add a
webhook for one of them (``run_id``), so it hears of no other run — and it
sees, rotates, tests or removes only webhooks of runs it covers (a
tenant-wide one, or one of another run, answers 404 to it: their URLs and
secrets are not its to read). Without auth (loopback only) webhooks have no
tenant and hear of every run.
What a webhook may be, and the deliveries, are ``runwire.webhooks``'.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...core import limits
from ...core.errors import AuthError, UnknownRun
from ...store.outbox import Subscription
from ...webhooks.notify import test_delivery
from ...webhooks.subscriptions import WebhookDisabled, add_webhook, new_webhook, rotate_secret, view
from ..service.auth import Principal
from ..service.context import Edge
from ..service.params import bounded_body


def webhook_routes(edge: Edge) -> list[Route]:
    """The routes of ``/v1/webhooks`` (what ``create_app`` mounts)."""

    def caller(request: Request) -> Principal | None:
        principal = edge.gate.principal(request.headers, request.query_params)
        edge.gate.require_scope(principal, "control")
        return principal

    async def owned(principal: Principal | None, webhook_id: str) -> Subscription:
        sub = await edge.store.outbox().webhook(webhook_id)
        if sub is None or not _visible(principal, sub):
            raise UnknownRun(f"no webhook {webhook_id!r}")
        return sub

    async def collection(request: Request) -> Response:
        principal = caller(request)
        outbox = edge.store.outbox()
        if request.method == "GET":
            subs = await outbox.webhooks(principal.tenant if principal else None, every=principal is None)
            return json_response({"webhooks": [view(sub) for sub in subs if _visible(principal, sub)]})
        body = new_webhook(await bounded_body(request, limits.WEBHOOK_BODY_BYTES,
                                              timeout_s=edge.settings.body_timeout_s, what="webhook"))
        if principal is not None:
            await _check_run_filter(edge, principal, body.run_id)
        sub = await add_webhook(outbox, principal.tenant if principal else None, body,
                                allow_private=edge.settings.webhooks_allow_private)
        return json_response(view(sub, secret=True), status=201)

    async def item(request: Request) -> Response:
        principal = caller(request)
        sub = await owned(principal, request.path_params["webhook_id"])
        outbox = edge.store.outbox()
        if request.method == "DELETE":
            await outbox.remove_webhook(sub.id)
            return Response(status_code=204)
        return json_response(view(sub, counts=await outbox.counts(sub.id)))

    async def rotate(request: Request) -> Response:
        sub = await owned(caller(request), request.path_params["webhook_id"])
        rotated = await rotate_secret(edge.store.outbox(), sub.id)
        if rotated is None:
            raise UnknownRun(f"no webhook {sub.id!r}")
        return json_response(view(rotated, secret=True))

    async def test(request: Request) -> Response:
        sub = await owned(caller(request), request.path_params["webhook_id"])
        if sub.disabled_at is not None:
            raise WebhookDisabled(f"webhook {sub.id} is disabled ({sub.disabled_reason}): it gets no deliveries,"
                                  " tests included; add it again once its receiver is fixed")
        edge.webhook_tests.take("webhook tests", webhook=sub.id, tenant=sub.tenant or "")
        delivery = test_delivery(sub)
        await edge.store.outbox().enqueue([delivery])
        return json_response({"delivery_id": delivery.id}, status=202)

    return [
        Route("/v1/webhooks", collection, methods=["GET", "POST"]),
        Route("/v1/webhooks/{webhook_id}", item, methods=["GET", "DELETE"]),
        Route("/v1/webhooks/{webhook_id}/rotate", rotate, methods=["POST"]),
        Route("/v1/webhooks/{webhook_id}/test", test, methods=["POST"]),
    ]


def _visible(principal: Principal | None, sub: Subscription) -> bool:
    """Whether the caller may see (and so manage) ``sub``: its tenant's, and for a token limited
    to some runs, one of those runs' (not a tenant-wide webhook)."""
    if principal is None:
        return True
    if sub.tenant != principal.tenant:
        return False
    return principal.runs is None or (sub.run_id is not None and principal.covers(sub.run_id))


async def _check_run_filter(edge: Edge, principal: Principal, run_id: str | None) -> None:
    """A webhook hears only of runs its caller may see: a token limited to some runs names one of
    them; a named run must be the caller's tenant's (or nobody's yet)."""
    if run_id is None:
        if principal.runs is not None:
            raise AuthError("a token limited to some runs may only add a webhook for one of them (run_id)",
                            status=403)
        return
    tenant = await edge.gate.tenant_of(run_id) if principal.covers(run_id) else principal.tenant + "\0"
    if tenant is not None and tenant != principal.tenant:
        raise UnknownRun(f"no run {run_id!r}")


def json_response(data: Any, status: int = 200) -> Response:
    return Response(_json.encode(data), status_code=status, media_type="application/json")


_json = msgspec.json.Encoder()
