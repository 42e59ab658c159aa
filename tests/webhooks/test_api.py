"""``/v1/webhooks`` on a real edge: scope-checked like control, a tenant's own webhooks only, a
secret the ``standardwebhooks`` library takes as it is, private URLs refused, rotation, test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from runwire.bus.base import Bus
from runwire.core import limits
from runwire.edge import EdgeSettings
from runwire.store.base import ReplayLog
from runwire.webhooks.deliverer import Deliverer
from runwire.webhooks.sender import Sender
from tests.edge.harness import RUN_A, RUN_B, SECRET, EdgeServer, serve_edge, token, two_tenants_runs
from tests.waiting import until

from .receiver import Receiver, serve_receiver

PUBLIC = "https://93.184.215.14/runwire"
"""A public address (never fetched here: no deliverer runs in these tests)."""


@pytest.fixture
async def secured(memory_bus: Bus, store: ReplayLog) -> AsyncIterator[EdgeServer]:
    await two_tenants_runs(memory_bus, store)
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge:
        yield edge


def as_(tenant: str, *scopes: str, runs: list[str] | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {token(tenant, *scopes, runs=runs)}"}


async def test_a_webhook_is_added_listed_rotated_and_removed_by_its_tenant(secured: EdgeServer) -> None:
    async with httpx.AsyncClient(base_url=secured.url) as http:
        made = await http.post("/v1/webhooks", json={"url": PUBLIC, "events": ["run.finished",
                               "run.awaiting_approval"]}, headers=as_("A", "control"))
        assert made.status_code == 201, made.text
        hook = made.json()
        assert hook["secret"].startswith("whsec_") and Webhook(hook["secret"])  # taken as it is
        assert hook["events"] == ["run.awaiting_approval", "run.finished"] and hook["status"] == "active"
        listed = (await http.get("/v1/webhooks", headers=as_("A", "control"))).json()["webhooks"]
        assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
        one = (await http.get(f"/v1/webhooks/{hook['id']}", headers=as_("A", "control"))).json()
        assert one["queued"] == 0 and one["failed"] == 0

        rotated = await http.post(f"/v1/webhooks/{hook['id']}/rotate", headers=as_("A", "control"))
        assert rotated.status_code == 200 and rotated.json()["secret"] not in ("", hook["secret"])
        tested = await http.post(f"/v1/webhooks/{hook['id']}/test", headers=as_("A", "control"))
        assert tested.status_code == 202 and tested.json()["delivery_id"].startswith("msg_")
        one = (await http.get(f"/v1/webhooks/{hook['id']}", headers=as_("A", "control"))).json()
        assert one["queued"] == 1  # no deliverer runs in this test: it waits in the outbox

        assert (await http.delete(f"/v1/webhooks/{hook['id']}", headers=as_("A", "control"))).status_code == 204
        assert (await http.get("/v1/webhooks", headers=as_("A", "control"))).json()["webhooks"] == []
        assert (await http.delete(f"/v1/webhooks/{hook['id']}", headers=as_("A", "control"))).status_code == 404


async def test_tenants_see_and_touch_only_their_own_webhooks(secured: EdgeServer) -> None:
    """Invariant 6 (tenants are isolated), for webhooks."""
    async with httpx.AsyncClient(base_url=secured.url) as http:
        hook = (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))).json()
        assert (await http.get("/v1/webhooks", headers=as_("B", "control"))).json()["webhooks"] == []
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/rotate"), ("POST", "/test")):
            answer = await http.request(method, f"/v1/webhooks/{hook['id']}{path}", headers=as_("B", "control"))
            assert answer.status_code == 404, (method, path)
        other = await http.post("/v1/webhooks", json={"url": PUBLIC, "run_id": RUN_B}, headers=as_("A", "control"))
        assert other.status_code == 404  # another tenant's run, as for every run endpoint
        own = await http.post("/v1/webhooks", json={"url": PUBLIC, "run_id": RUN_A}, headers=as_("A", "control"))
        assert own.status_code == 201 and own.json()["run_id"] == RUN_A


async def test_webhooks_need_the_control_scope(secured: EdgeServer) -> None:
    async with httpx.AsyncClient(base_url=secured.url) as http:
        assert (await http.get("/v1/webhooks")).status_code == 401
        for scopes in (("read",), ("read", "write")):
            assert (await http.get("/v1/webhooks", headers=as_("A", *scopes))).status_code == 403
            made = await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", *scopes))
            assert made.status_code == 403
        limited = as_("A", "control", runs=[RUN_A])
        assert (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=limited)).status_code == 403
        mine = await http.post("/v1/webhooks", json={"url": PUBLIC, "run_id": RUN_A}, headers=limited)
        assert mine.status_code == 201


async def test_a_token_limited_to_some_runs_sees_only_their_webhooks(secured: EdgeServer) -> None:
    """A tenant-wide webhook's URL and secret are not for a token that may see one run: listing
    leaves it out, and reading, rotating (a new secret), testing or removing it answers 404."""
    async with httpx.AsyncClient(base_url=secured.url) as http:
        wide = (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))).json()
        limited = as_("A", "control", runs=[RUN_A])
        mine = (await http.post("/v1/webhooks", json={"url": PUBLIC, "run_id": RUN_A}, headers=limited)).json()
        listed = (await http.get("/v1/webhooks", headers=limited)).json()["webhooks"]
        assert [hook["id"] for hook in listed] == [mine["id"]]
        for method, path in (("GET", ""), ("POST", "/rotate"), ("POST", "/test"), ("DELETE", "")):
            answer = await http.request(method, f"/v1/webhooks/{wide['id']}{path}", headers=limited)
            assert answer.status_code == 404 and "whsec_" not in answer.text, (method, path)
        assert (await http.post(f"/v1/webhooks/{mine['id']}/rotate", headers=limited)).status_code == 200
        everything = (await http.get("/v1/webhooks", headers=as_("A", "control"))).json()["webhooks"]
        assert {hook["id"] for hook in everything} == {wide["id"], mine["id"]}


@pytest.mark.parametrize("body", [
    {"url": "http://127.0.0.1:8080/hook"}, {"url": "http://169.254.169.254/latest"},
    {"url": "http://localhost/x"}, {"url": "http://10.0.0.7/"}, {"url": "ftp://93.184.215.14/"},
    {"url": PUBLIC, "events": ["run.started"]}, {"url": PUBLIC, "events": []}, {"url": PUBLIC, "extra": 1},
    {"url": PUBLIC, "run_id": "x" * (limits.ID_CHARS + 1)}, {"events": ["run.finished"]},
])
async def test_a_bad_or_private_webhook_is_refused(secured: EdgeServer, body: dict[str, object]) -> None:
    async with httpx.AsyncClient(base_url=secured.url) as http:
        answer = await http.post("/v1/webhooks", json=body, headers=as_("A", "control"))
    assert answer.status_code == 400 and answer.json()["code"].startswith("KAI-STREAM-REQ-"), answer.text


async def test_private_targets_are_allowed_when_the_operator_says_so(memory_bus: Bus, store: ReplayLog) -> None:
    async with serve_edge(memory_bus, store, EdgeSettings(webhooks_allow_private=True)) as edge:
        async with httpx.AsyncClient(base_url=edge.url) as http:
            made = await http.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})
            assert made.status_code == 201 and made.json()["tenant"] is None  # no auth: every tenant's runs
            assert len((await http.get("/v1/webhooks")).json()["webhooks"]) == 1


async def test_a_tenant_has_a_bounded_number_of_webhooks(secured: EdgeServer) -> None:
    async with httpx.AsyncClient(base_url=secured.url) as http:
        for _ in range(limits.WEBHOOKS_PER_TENANT):
            made = await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))
            assert made.status_code == 201
        over = await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))
        assert over.status_code == 429
        assert (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("B", "control"))).status_code == 201


class FrozenClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_test_deliveries_are_bounded_per_webhook_and_per_tenant(secured: EdgeServer) -> None:
    """``POST /v1/webhooks/{id}/test`` queues a delivery to a URL the tenant chose: 3 at once per
    webhook then one per 20 s, 10 at once per tenant then one per 6 s; past that 429 with
    ``Retry-After``, and nothing queued (the edge's clock held still, then moved by hand)."""
    clock = FrozenClock()
    secured.edge.webhook_tests.clock = clock
    async with httpx.AsyncClient(base_url=secured.url) as http:
        hooks = [(await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))).json()["id"]
                 for _ in range(4)]
        answers = [(await http.post(f"/v1/webhooks/{hooks[0]}/test", headers=as_("A", "control")))
                   for _ in range(4)]
        assert [a.status_code for a in answers] == [202, 202, 202, 429]
        assert answers[3].headers["retry-after"] == "20" and answers[3].json()["code"] == "KAI-STREAM-REQ-0005"
        queued = (await http.get(f"/v1/webhooks/{hooks[0]}", headers=as_("A", "control"))).json()["queued"]
        assert queued == 3
        statuses = [(await http.post(f"/v1/webhooks/{hook}/test", headers=as_("A", "control"))).status_code
                    for hook in hooks[1:] for _ in range(3)]
        assert statuses == [202] * 7 + [429, 429]  # the tenant's 10 taken
        other = (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("B", "control"))).json()
        assert (await http.post(f"/v1/webhooks/{other['id']}/test", headers=as_("B", "control"))).status_code == 202
        clock.now += 20
        again = await http.post(f"/v1/webhooks/{hooks[0]}/test", headers=as_("A", "control"))
        assert again.status_code == 202


async def test_a_test_of_a_disabled_webhook_is_refused(secured: EdgeServer) -> None:
    async with httpx.AsyncClient(base_url=secured.url) as http:
        hook = (await http.post("/v1/webhooks", json={"url": PUBLIC}, headers=as_("A", "control"))).json()
        await secured.store.outbox().disable_channel(hook["id"], "delivery msg_x failed for good: HTTP 503")
        answer = await http.post(f"/v1/webhooks/{hook['id']}/test", headers=as_("A", "control"))
        assert answer.status_code == 409 and "disabled" in answer.json()["error"]
        assert "HTTP 503" in answer.json()["error"]
        one = (await http.get(f"/v1/webhooks/{hook['id']}", headers=as_("A", "control"))).json()
        assert one["queued"] == 0 and one["status"] == "disabled"


async def test_a_target_the_deliverer_refuses_disables_its_webhook_at_once(memory_bus: Bus, store: ReplayLog) -> None:
    """An edge that allows private targets accepts a loopback webhook; a deliverer that does not
    (another process, started without ``--webhooks-allow-private``) refuses it at its first
    attempt: no retry, no connection, the webhook disabled with the refusal as its reason."""
    async with serve_receiver(Receiver()) as receiver, \
            serve_edge(memory_bus, store, EdgeSettings(webhooks_allow_private=True)) as edge, \
            httpx.AsyncClient(base_url=edge.url) as http:
        made = await http.post("/v1/webhooks", json={"url": receiver.url + "/hook"})
        assert made.status_code == 201
        hook = made.json()
        assert (await http.post(f"/v1/webhooks/{hook['id']}/test")).status_code == 202
        strict = Sender(allow_private=False)
        stop = asyncio.Event()
        task = asyncio.create_task(Deliverer(store.outbox(), strict, poll_s=0.05).run(stop))

        async def shown() -> dict[str, Any] | None:
            one: dict[str, Any] = (await http.get(f"/v1/webhooks/{hook['id']}")).json()
            return one if one["status"] == "disabled" else None

        try:
            one = await until(shown, what="the webhook disabled")
        finally:
            stop.set()
            await task
            await strict.aclose()
        assert one["disabled_reason"].startswith("refused: 127.0.0.1 is a loopback address")
        assert "--webhooks-allow-private" in one["disabled_reason"] and one["last_error"] == one["disabled_reason"]
        assert one["failed"] == 1 and one["queued"] == 0
        assert (await http.post(f"/v1/webhooks/{hook['id']}/test")).status_code == 409
    assert receiver.requests == []
