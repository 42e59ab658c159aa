"""A2A push-notification configs: webhooks of the one delivery core (``runwire.webhooks``).

A config is a webhook (``/v1/webhooks``' table in the replay log's outbox) whose id starts with
:data:`~runwire.protocols.a2a.PUSH_CONFIG_PREFIX`, for the run notices ``run.finished`` and
``run.awaiting_approval`` of its task alone; the delivery core sends each as the
``StreamResponse`` A2A pushes (a ``statusUpdate``: ``TASK_STATE_COMPLETED`` … or
``TASK_STATE_INPUT_REQUIRED``), signed, retried on the webhooks' schedule, to a URL the
webhooks' target rules allow. Who may: ``control`` (as for ``/v1/webhooks``) and ``read`` on
the task; a tenant's configs count toward its webhooks bound. A config's ``token`` and
``authentication`` are kept with it (the webhook's ``headers``) and sent with every delivery
(``X-A2A-Notification-Token``, ``Authorization``); a config is shown with its token and its
authentication's scheme, never the credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...core import limits
from ...protocols.a2a import PUSH_CONFIG_PREFIX, PUSH_TOKEN_HEADER
from ...store.outbox import AWAITING_APPROVAL, FINISHED, Subscription
from ...webhooks.subscriptions import NewWebhook, add_webhook
from ..service.auth import Principal
from ..service.context import Edge
from .errors import A2AFault
from .methods import object_of, task_id_of, text_of


def view(sub: Subscription) -> dict[str, Any]:
    """A config as A2A shows it (``TaskPushNotificationConfig``): its ``token`` and its authentication's
    ``scheme``, never the credentials (write-only: the receiver has them)."""
    shown: dict[str, Any] = {"id": sub.id, "taskId": sub.run_id or "", "url": sub.url}
    if PUSH_TOKEN_HEADER in sub.headers:
        shown["token"] = sub.headers[PUSH_TOKEN_HEADER]
    if "Authorization" in sub.headers:
        shown["authentication"] = {"scheme": sub.headers["Authorization"].partition(" ")[0]}
    return shown


_SCHEME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def headers_of(params: Mapping[str, Any]) -> dict[str, str]:
    """The headers a config's deliveries carry: ``token`` as :data:`PUSH_TOKEN_HEADER`,
    ``authentication`` as ``Authorization: <scheme> <credentials>`` (A2A §4.3.3)."""
    headers: dict[str, str] = {}
    token = text_of(params, "token", chars=limits.PUSH_SECRET_CHARS)
    if token is not None:
        if not _VALUE.fullmatch(token):
            raise A2AFault("INVALID_PARAMS", "token must be printable ASCII (it is sent as a header)")
        headers[PUSH_TOKEN_HEADER] = token
    authentication = object_of(params, "authentication")
    if authentication:
        scheme = text_of(authentication, "scheme", chars=64)
        credentials = text_of(authentication, "credentials", chars=limits.PUSH_SECRET_CHARS)
        if scheme is None or not _SCHEME.fullmatch(scheme) or credentials is None or not _VALUE.fullmatch(credentials):
            raise A2AFault("INVALID_PARAMS", "authentication needs a scheme (an HTTP authentication scheme) and "
                                             "credentials (printable ASCII): they are sent as Authorization")
        headers["Authorization"] = f"{scheme} {credentials}"
    return headers


async def _task(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> str:
    edge.gate.require_scope(principal, "control")
    run_id = task_id_of(params, "taskId")
    await edge.gate.check_run(principal, run_id, "read")
    return run_id


async def create(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = await _task(edge, principal, params)
    url = params.get("url")
    if not isinstance(url, str) or not 0 < len(url) <= limits.FRAME_BYTES:
        raise A2AFault("INVALID_PARAMS", "url must be the receiver's http(s) URL")
    request = NewWebhook(url=url, events=[FINISHED, AWAITING_APPROVAL], run_id=run_id)
    sub = await add_webhook(edge.store.outbox(), principal.tenant if principal else None, request,
                            allow_private=edge.settings.webhooks_allow_private, prefix=PUSH_CONFIG_PREFIX,
                            headers=headers_of(params))
    return view(sub)


async def _owned(edge: Edge, principal: Principal | None, run_id: str, config_id: Any) -> Subscription:
    sub = await edge.store.outbox().webhook(config_id) if isinstance(config_id, str) else None
    if (sub is None or not sub.id.startswith(PUSH_CONFIG_PREFIX) or sub.run_id != run_id
            or (principal is not None and sub.tenant != principal.tenant)):
        raise A2AFault("TASK_NOT_FOUND", f"no push notification config {str(config_id)[:64]!r} of task {run_id}")
    return sub


async def get(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = await _task(edge, principal, params)
    return view(await _owned(edge, principal, run_id, params.get("id")))


async def list_configs(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = await _task(edge, principal, params)
    subs = await edge.store.outbox().webhooks(principal.tenant if principal else None, every=principal is None)
    return {"configs": [view(s) for s in subs if s.id.startswith(PUSH_CONFIG_PREFIX) and s.run_id == run_id]}


async def delete(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = await _task(edge, principal, params)
    sub = await _owned(edge, principal, run_id, params.get("id"))
    await edge.store.outbox().remove_webhook(sub.id)
    return {}


METHODS = {
    "CreateTaskPushNotificationConfig": create,
    "GetTaskPushNotificationConfig": get,
    "ListTaskPushNotificationConfigs": list_configs,
    "DeleteTaskPushNotificationConfig": delete,
}
