"""What a webhook hears: a run notice as a Standard Webhooks body, for each subscription that wants it.

The body is the Standard Webhooks shape::

    {"type": "run.finished", "timestamp": "2026-…Z",
     "data": {"run_id": …, "root_id": …, "tenant": …, "state": "done", "last_seq": 42}}

``timestamp`` is the ``run.lifecycle`` event's own time; ``last_seq`` its
seq in the run's raw delivery stream (a run's terminal event is its last).
A delivery's id — the ``webhook-id`` — is derived from the subscription and
the notice, so a notice fanned out twice (it can't be, but a retry of the
fan-out after a lost answer could) still makes one delivery, and a receiver
dedupes every retry on it.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from ..core.envelope import now_ts
from ..protocols.a2a import A2A_MEDIA_TYPE, PUSH_CONFIG_PREFIX, push_body
from ..store.outbox import Delivery, Notice, Subscription

TEST_TYPE = "webhook.test"
_json = msgspec.json.Encoder()


class RunData(msgspec.Struct, kw_only=True):
    run_id: str
    root_id: str
    tenant: str | None
    state: str
    last_seq: int


class Body(msgspec.Struct, kw_only=True):
    type: str
    timestamp: str
    data: RunData | dict[str, str]


def wants(sub: Subscription, notice: Notice) -> bool:
    """Whether ``sub`` is to hear of ``notice``: its tenant's (or any, without auth), a type it
    asked for, and its run — or a run under it — when it names one (an A2A push config: its task's
    own status only)."""
    if sub.id.startswith(PUSH_CONFIG_PREFIX) and notice.run_id != sub.run_id:
        return False
    return ((sub.tenant is None or sub.tenant == notice.tenant) and notice.type in sub.events
            and (sub.run_id is None or sub.run_id in (notice.run_id, notice.root_id)))


def delivery_id(sub_id: str, key: str) -> str:
    return "msg_" + hashlib.sha256(f"{sub_id}\n{key}".encode()).hexdigest()[:32]


def build(notice: Notice, subs: list[Subscription]) -> list[Delivery]:
    """The deliveries of one notice (``Outbox.fan_out``'s ``build``): a Standard Webhooks body, or
    for an A2A push config (``runwire.protocols.a2a``) the ``StreamResponse`` A2A pushes."""
    body = _json.encode(Body(type=notice.type, timestamp=notice.ts, data=RunData(
        run_id=notice.run_id, root_id=notice.root_id, tenant=notice.tenant, state=notice.state,
        last_seq=notice.seq)))
    now = time.time()
    return [Delivery(id=delivery_id(sub.id, notice.key), channel=sub.id, url=sub.url,
                     body=_a2a_body(notice) if sub.id.startswith(PUSH_CONFIG_PREFIX) else body,
                     secrets=sub.secrets(now), headers=_headers(sub)) for sub in subs if wants(sub, notice)]


def _headers(sub: Subscription) -> dict[str, str]:
    """The subscription's own headers; an A2A push body is ``application/a2a+json`` (A2A §4.3.3)."""
    if sub.id.startswith(PUSH_CONFIG_PREFIX):
        return {"content-type": A2A_MEDIA_TYPE, **sub.headers}
    return sub.headers


def _a2a_body(notice: Notice) -> bytes:
    return _json.encode(push_body(notice.run_id, notice.state, notice.ts, notice.seq))


def test_delivery(sub: Subscription) -> Delivery:
    """A ``webhook.test`` delivery to ``sub`` now (``runwire webhooks test``): signed and retried
    like any other."""
    moment = now_ts()
    body = _json.encode(Body(type=TEST_TYPE, timestamp=moment, data={"webhook_id": sub.id}))
    return Delivery(id=delivery_id(sub.id, f"test {moment} {time.time_ns()}"), channel=sub.id, url=sub.url,
                    body=body, secrets=sub.secrets(time.time()), headers=sub.headers)
