"""The outbox in the replay log's store (SQLite and PostgreSQL): run notices written with the
events, fanned out to the webhooks that want them, deliveries claimed, leased and settled."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from runwire.core import limits
from runwire.core.errors import QuotaExceeded
from runwire.store import open_store
from runwire.store.base import ReplayLog
from runwire.store.outbox import AWAITING_APPROVAL, FINISHED, Delivery, Outbox, Subscription
from runwire.webhooks.notify import build
from runwire.webhooks.subscriptions import NewWebhook, add_webhook
from tests.events import event
from tests.store.conftest import Clock


def lifecycle(run_id: str, seq: int, state: str, **fields: str) -> object:
    return event(run_id, seq, "run.lifecycle", {"state": state}, **fields)


def webhook(sub_id: str, tenant: str | None, events: tuple[str, ...] = (FINISHED,), run_id: str | None = None,
            secret: str = "whsec_AAAA") -> Subscription:
    return Subscription(id=sub_id, tenant=tenant, url=f"https://example.com/{sub_id}", events=list(events),
                        run_id=run_id, secret=secret, created_at=1.0)


def bodies(deliveries: list[Delivery], type_: str = FINISHED) -> dict[tuple[str, str], dict[str, object]]:
    """(channel, run_id) → body of each delivery of ``type_`` (each key once)."""
    found: dict[tuple[str, str], dict[str, object]] = {}
    for delivery in deliveries:
        body = msgspec.json.decode(delivery.body)
        if body["type"] == type_:
            key = (delivery.channel, body["data"]["run_id"])
            assert key not in found, f"{key} twice"
            found[key] = body
    return found


async def tree(log: ReplayLog) -> None:
    """Tenant t: root R with child C (its own stream, and fanned into R's with child_id), both
    finished; R asked for approval once. Tenant u: root U, finished. Each write twice (a redelivery)."""
    writes = [
        [lifecycle("R", 1, "running", tenant="t"), lifecycle("R", 2, "awaiting_approval", tenant="t")],
        [lifecycle("C", 1, "running", tenant="t", parent_id="R", root_id="R"),
         lifecycle("C", 2, "done", tenant="t", parent_id="R", root_id="R")],
        [lifecycle("R", 3, "done", tenant="t", child_id="C"), lifecycle("R", 4, "running", tenant="t"),
         lifecycle("R", 5, "error", tenant="t")],
        [lifecycle("U", 1, "done", tenant="u")],
    ]
    for write in writes * 2:
        await log.append(write)  # type: ignore[arg-type]


async def test_run_finished_is_noticed_once_per_run_root_or_child(store_url: str) -> None:
    async with open_store(store_url) as log:
        outbox = log.outbox()
        await outbox.add_webhook(webhook("wh_t", "t", (FINISHED, AWAITING_APPROVAL)))
        await outbox.add_webhook(webhook("wh_u", "u"))
        await tree(log)
        assert await outbox.fan_out(build) == 4  # R finished, R awaiting, C finished, U finished
        assert await outbox.fan_out(build) == 0
        await log.append([lifecycle("R", 5, "error", tenant="t")])  # already stored: nothing new
        assert await outbox.fan_out(build) == 0
        claimed = await outbox.claim(100, 60.0)
    finished = bodies(claimed)
    assert sorted(bodies(claimed, AWAITING_APPROVAL)) == [("wh_t", "R")]
    assert len(claimed) == 4
    assert sorted(finished) == [("wh_t", "C"), ("wh_t", "R"), ("wh_u", "U")]
    assert finished[("wh_t", "R")]["data"] == {"run_id": "R", "root_id": "R", "tenant": "t", "state": "error",
                                              "last_seq": 5}
    assert finished[("wh_t", "C")]["data"] == {"run_id": "C", "root_id": "R", "tenant": "t", "state": "done",
                                              "last_seq": 2}
    assert set(finished[("wh_t", "R")]) == {"type", "timestamp", "data"}


async def test_a_webhook_hears_only_its_tenant_its_events_and_its_run(store_url: str) -> None:
    async with open_store(store_url) as log:
        outbox = log.outbox()
        await outbox.add_webhook(webhook("wh_approvals", "t", (AWAITING_APPROVAL,)))
        await outbox.add_webhook(webhook("wh_child", "t", run_id="C"))
        await outbox.add_webhook(webhook("wh_tree", "t", run_id="R"))
        await outbox.add_webhook(webhook("wh_other", "v"))
        await tree(log)
        await outbox.fan_out(build)
        claimed = await outbox.claim(100, 60.0)
    assert sorted(bodies(claimed)) == [("wh_child", "C"), ("wh_tree", "C"), ("wh_tree", "R")]
    approvals = bodies(claimed, AWAITING_APPROVAL)
    assert sorted(approvals) == [("wh_approvals", "R")] and len(claimed) == 4
    assert approvals[("wh_approvals", "R")]["data"]["state"] == "awaiting_approval"  # type: ignore[index]


async def test_claims_lease_and_attempts_settle(store_url: str, clock: Clock) -> None:
    async with open_store(store_url, clock=clock) as log:
        outbox = log.outbox()
        await outbox.add_webhook(webhook("wh", "t"))
        await outbox.enqueue([Delivery(id=f"msg_{n}", channel="wh", url="https://example.com/", body=b"{}")
                              for n in range(3)])
        claimed = await outbox.claim(10, 60.0)
        assert sorted(d.id for d in claimed) == ["msg_0", "msg_1", "msg_2"]
        assert await outbox.claim(10, 60.0) == []  # leased
        clock.advance(seconds=61)  # the process that claimed them died: due again
        assert len(await outbox.claim(10, 60.0)) == 3
        now = clock().timestamp()
        await outbox.settle([("msg_0", "wh", now, None)], [(("msg_1", "wh", now, "HTTP 500"), now + 5)], [])
        assert await outbox.counts("wh") == (2, 0)
        clock.advance(seconds=66)
        again = await outbox.claim(10, 60.0)
        assert sorted((d.id, d.attempts) for d in again) == [("msg_1", 1), ("msg_2", 0)]
        assert (await outbox.webhook("wh")).last_error == "HTTP 500"  # type: ignore[union-attr]
        await outbox.settle([], [], [("msg_1", "wh", now, "HTTP 500")])
        sub = await outbox.webhook("wh")
        assert sub is not None and sub.disabled_at is not None and "msg_1" in (sub.disabled_reason or "")
        assert await outbox.counts("wh") == (0, 2)  # the channel's other delivery stopped too


async def test_rotation_re_signs_what_is_queued_and_removal_drops_it(store_url: str) -> None:
    async with open_store(store_url) as log:
        outbox: Outbox = log.outbox()
        await outbox.add_webhook(webhook("wh", "t", secret="whsec_old"))
        await outbox.enqueue([Delivery(id="msg_1", channel="wh", url="https://example.com/", body=b"{}",
                                       secrets="whsec_old")])
        rotated = await outbox.rotate_webhook("wh", "whsec_new", previous_until=2e9)
        assert rotated is not None and rotated.secret == "whsec_new" and rotated.previous_secret == "whsec_old"
        assert rotated.secrets(now=1e9) == "whsec_new whsec_old" and rotated.secrets(now=3e9) == "whsec_new"
        assert [d.secrets for d in await outbox.claim(10, 60.0)] == ["whsec_new whsec_old"]
        assert await outbox.remove_webhook("wh") and not await outbox.remove_webhook("wh")
        assert await outbox.counts("wh") == (0, 0) and await outbox.webhooks("t") == []


@pytest.mark.parametrize("every", [False, True])
async def test_listing_is_per_tenant(store_url: str, every: bool) -> None:
    async with open_store(store_url) as log:
        outbox = log.outbox()
        for sub_id, tenant in (("a", "t"), ("b", "u"), ("c", None)):
            await outbox.add_webhook(webhook(sub_id, tenant))
        listed = [s.id for s in await outbox.webhooks("t", every=every)]
    assert listed == (["a", "b", "c"] if every else ["a"])


async def test_a_claim_takes_at_most_a_channels_share(store_url: str) -> None:
    """What keeps one slow receiver from taking every slot: a claim leaves out what is over each
    channel's share, or over what is left of it while some of its attempts are under way."""
    async with open_store(store_url) as log:
        outbox = log.outbox()
        await outbox.enqueue([Delivery(id=f"msg_{channel}{n}", channel=channel, url="https://example.com/",
                                       body=b"{}") for channel, count in (("a", 5), ("b", 5), ("c", 1))
                              for n in range(count)])

        def channels(claimed: list[Delivery]) -> dict[str, int]:
            found: dict[str, int] = {}
            for d in claimed:
                found[d.channel] = found.get(d.channel, 0) + 1
            return found

        assert channels(await outbox.claim(10, 60.0, per_channel=3, rooms={"a": 1, "b": 0})) == {"a": 1, "c": 1}
        assert channels(await outbox.claim(10, 60.0, per_channel=3)) == {"a": 3, "b": 3}
        assert channels(await outbox.claim(10, 60.0)) == {"a": 1, "b": 2}


async def test_concurrent_adds_never_pass_the_bound_of_webhooks_per_tenant(store_url: str) -> None:
    """The bound is counted and the webhook added in one transaction: of 12 adds racing on two edges
    (two connections to one log) at one below the bound, exactly one is made (counted in one
    transaction and added in another, each saw room for one)."""
    async with open_store(store_url) as one, open_store(store_url) as two:
        for n in range(limits.WEBHOOKS_PER_TENANT - 1):
            assert await one.outbox().add_webhook(webhook(f"wh_{n:03}", "t"), most=limits.WEBHOOKS_PER_TENANT)
        request = NewWebhook(url="https://93.184.215.14/hook")

        async def add(log: ReplayLog) -> bool:
            try:
                await add_webhook(log.outbox(), "t", request, allow_private=False)
            except QuotaExceeded:
                return False
            return True

        made = await asyncio.gather(*(add(log) for _ in range(6) for log in (one, two)))
        assert sum(made) == 1
        assert len(await one.outbox().webhooks("t")) == limits.WEBHOOKS_PER_TENANT
        assert await add(two) is False
        assert await one.outbox().remove_webhook("wh_000") and await add(two) is True
        other = NewWebhook(url="https://93.184.215.14/other")
        assert (await add_webhook(one.outbox(), "u", other, allow_private=False)).tenant == "u"
