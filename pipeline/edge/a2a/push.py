"""A2A push-notification configs: webhooks of the one delivery core (``runwire.webhooks``).

A config is a webhook (``/v1/webhooks``' table in the replay log's outbox) whose id starts with
:data:`~runwire.protocols.a2a.PUSH_CONFIG_PREFIX`, for the run notices ``run.finished`` and
``run.awaiting_approval`` of its task alone; the delivery core sends each as the
``StreamResponse`` A2A pushes (a ``statusUpdate``: ``TASK_STATE_COMPLETED`` … or
``TASK_STATE_INPUT_REQUIRED``), signed, retried on the webhooks' schedule, to a URL the
webhooks' target rules allow. Who may: ``control`` (as for ``/v1/webhooks``) and ``read`` on
the task; a tenant's configs count toward its webhooks bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import limits
from ...protocols.a2a import PUSH_CONFIG_PREFIX
from ...store.outbox import AWAITING_APPROVAL, FINISHED, Subscription
from ...webhooks.subscriptions import NewWebhook, add_webhook
from ..auth import Principal
from ..context import Edge
from .errors import A2AFault
from .methods import task_id_of


def view(sub: Subscription) -> dict[str, Any]:
    """A config as A2A shows it (``TaskPushNotificationConfig``)."""
    return {"id": sub.id, "taskId": sub.run_id or "", "url": sub.url}


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
                            allow_private=edge.settings.webhooks_allow_private, prefix=PUSH_CONFIG_PREFIX)
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
