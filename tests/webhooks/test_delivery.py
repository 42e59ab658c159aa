"""The delivery core on a real receiver: Standard Webhooks signatures the ``standardwebhooks``
library accepts (and refuses when tampered with or stale), retries under one webhook-id, a
channel that keeps failing disabled, no delivery to private addresses, no redirect followed,
no response read past its bound."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import sqlite3
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from runwire.bus.base import Bus
from runwire.store import open_store
from runwire.store.base import ReplayLog
from runwire.store.outbox import Delivery, Notice, Subscription
from runwire.webhooks.deliverer import Deliverer, DeliveryMetrics
from runwire.webhooks.notify import build
from runwire.webhooks.sender import RESPONSE_BYTES, Sender
from runwire.webhooks.signing import new_secret, signed_headers
from runwire.webhooks.subscriptions import NewWebhook, add_webhook, view
from runwire.webhooks.targets import TargetRefused, allowed, check_url
from runwire.workers.deliveries import DeliveryThread, edge_deliveries
from tests.edge.harness import serve_edge
from tests.events import event
from tests.services import PostgresServer
from tests.waiting import until

from .receiver import Receiver, serve_receiver

QUICK = (0.2, 0.2, 0.2, 0.2)
"""A retry schedule for tests: four retries, 0.2 s apart."""


@pytest.fixture
async def log(tmp_path: object) -> AsyncIterator[ReplayLog]:
    async with open_store(f"sqlite:///{tmp_path}/replay.db") as opened:
        yield opened


@pytest.fixture
async def sender() -> AsyncIterator[Sender]:
    sent = Sender(allow_private=True, attempt_s=5.0)
    yield sent
    await sent.aclose()


async def deliver_until(deliverer: Deliverer, done: object, what: str) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(deliverer.run(stop))
    try:
        await until(done, within=30, what=what)  # type: ignore[arg-type]
    finally:
        stop.set()
        await task


def delivery(url: str, secret: str, msg_id: str = "msg_1", body: bytes = b'{"type":"t"}') -> Delivery:
    return Delivery(id=msg_id, channel="wh_test", url=url, body=body, secrets=secret)


async def test_each_attempt_is_signed_afresh_under_one_webhook_id(log: ReplayLog, sender: Sender) -> None:
    async with serve_receiver(Receiver(fail_first=3)) as receiver:
        receiver.secret = new_secret()
        await log.outbox().enqueue([delivery(receiver.url + "/hook", receiver.secret)])
        deliverer = Deliverer(log.outbox(), sender, schedule=QUICK, poll_s=0.05)
        await deliver_until(deliverer, lambda: receiver.accepted, "the fourth attempt accepted")
    assert receiver.attempts == {"msg_1": 4} and receiver.refused == []
    assert [body for body in receiver.accepted["msg_1"]] == [{"type": "t"}]
    assert {headers["webhook-id"] for _, headers, _ in receiver.requests} == {"msg_1"}
    assert await log.outbox().counts("wh_test") == (0, 0)  # delivered: gone from the outbox


async def test_a_tampered_or_stale_signature_is_refused_by_the_library() -> None:
    secret, body = new_secret(), b'{"type":"run.finished","data":{"run_id":"r"}}'
    headers = signed_headers(secret, "msg_1", int(time.time()), body)
    assert Webhook(secret).verify(body, headers) == {"type": "run.finished", "data": {"run_id": "r"}}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b'"r"', b'"x"'), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, {**headers, "webhook-id": "msg_2"})
    stale = signed_headers(secret, "msg_1", int(time.time()) - 600, body)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, stale)
    rotated = new_secret()  # after a rotation both secrets sign: either verifies
    both = signed_headers(f"{rotated} {secret}", "msg_1", int(time.time()), body)
    assert Webhook(secret).verify(body, both) and Webhook(rotated).verify(body, both)


async def test_a_webhook_that_keeps_failing_is_disabled_and_shown_so(log: ReplayLog, sender: Sender) -> None:
    async with serve_receiver(Receiver(status=503)) as receiver:
        outbox = log.outbox()
        sub = await add_webhook(outbox, "t", NewWebhook(url=receiver.url + "/hook"), allow_private=True)
        receiver.secret = sub.secret
        await outbox.enqueue([Delivery(id=f"msg_{n}", channel=sub.id, url=sub.url, body=b"{}",
                                       secrets=sub.secret) for n in range(2)])
        deliverer = Deliverer(outbox, sender, schedule=(0.1, 0.1), poll_s=0.05)

        async def disabled() -> bool:
            found = await outbox.webhook(sub.id)
            return found is not None and found.disabled_at is not None

        await deliver_until(deliverer, disabled, "the webhook disabled")
    shown = view((await outbox.webhooks("t"))[0], counts=await outbox.counts(sub.id))
    assert shown["status"] == "disabled" and "HTTP 503" in shown["disabled_reason"]
    assert shown["last_error"] == "HTTP 503" and shown["last_success_at"] is None
    assert shown["queued"] == 0 and shown["failed"] == 2
    assert receiver.accepted == {} and max(receiver.attempts.values()) <= 3


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/", "http://192.168.0.1/",
    "http://172.16.0.1/", "http://169.254.169.254/latest/meta-data/", "http://[::1]/", "http://[fd00::1]/",
    "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/", "http://100.64.0.1/", "http://224.0.0.1/",
    "ftp://example.com/", "http://user:pass@example.com/", "file:///etc/passwd",
])
async def test_private_and_odd_targets_are_refused_when_added(url: str) -> None:
    with pytest.raises(TargetRefused):
        await check_url(url, allow_private=False)


async def test_private_targets_are_refused_at_delivery_too() -> None:
    """A URL whose name resolves to a loopback address by the time of delivery (DNS rebinding)
    gets no connection: the check is made on every connection."""
    async with serve_receiver(Receiver()) as receiver:
        guarded = Sender(allow_private=False)
        try:
            for url in (receiver.url + "/hook", f"http://localhost:{receiver.port}/hook"):
                error, final = await guarded.send(delivery(url, new_secret()))
                assert final and error is not None and "loopback" in error
        finally:
            await guarded.aclose()
    assert receiver.requests == []
    await check_url(receiver.url + "/hook", allow_private=True)


async def test_redirects_are_not_followed(sender: Sender) -> None:
    async with serve_receiver(Receiver(status=307)) as receiver:
        receiver.secret = new_secret()
        error, final = await sender.send(delivery(receiver.url + "/hook", receiver.secret))
    assert error is not None and "307" in error and not final
    assert [path for path, _, _ in receiver.requests] == ["/hook"]


async def test_a_response_is_not_read_past_its_bound(sender: Sender) -> None:
    answer = b"x" * (64 * RESPONSE_BYTES)
    async with serve_receiver(Receiver(status=200, answer=answer)) as receiver:
        receiver.secret = new_secret()
        error, _ = await sender.send(delivery(receiver.url + "/hook", receiver.secret))
    assert error is None


async def test_a_slow_receiver_ends_its_attempt_at_the_bound() -> None:
    async with serve_receiver(Receiver(delay_s=30)) as receiver:
        receiver.secret = new_secret()
        quick = Sender(allow_private=True, attempt_s=0.5)
        try:
            started = time.monotonic()
            error, final = await quick.send(delivery(receiver.url + "/hook", receiver.secret))
        finally:
            await quick.aclose()
    assert error is not None and not final and time.monotonic() - started < 10


async def test_a_slow_receiver_delays_only_its_own_deliveries(log: ReplayLog) -> None:
    """A receiver that holds every request open gets at most ``per_channel`` of the deliverer's
    slots; another channel's deliveries, queued after its, all go out meanwhile."""
    patient = Sender(allow_private=True, attempt_s=60.0)
    async with serve_receiver(Receiver(delay_s=60)) as slow, serve_receiver(Receiver()) as fast:
        slow.secret = fast.secret = new_secret()
        outbox = log.outbox()
        await outbox.enqueue([Delivery(id=f"msg_slow{n}", channel="slow", url=slow.url + "/hook", body=b"{}",
                                       secrets=slow.secret) for n in range(20)])
        await outbox.enqueue([Delivery(id=f"msg_fast{n}", channel="fast", url=fast.url + "/hook", body=b"{}",
                                       secrets=fast.secret) for n in range(10)])
        deliverer = Deliverer(outbox, patient, concurrency=8, per_channel=3, poll_s=0.05)
        try:
            await deliver_until(deliverer, lambda: len(fast.accepted) == 10, "the fast receiver's deliveries")
        finally:
            await patient.aclose()
        assert slow.accepted == {} and len(slow.attempts) <= 3


EMBEDDING = ["http://[2002:7f00:1::]/", "http://[2002:a00:1::]/hook", "http://[2002:a9fe:a9fe::]/",
             "http://[64:ff9b::7f00:1]/", "http://[64:ff9b::a00:7]/", "http://[64:ff9b:1::a00:1]/",
             "http://[::ffff:a00:1]/", "http://[::ffff:7f00:1]:8080/",
             "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/"]
"""6to4, NAT64, IPv4-mapped and Teredo addresses whose IPv4 address is loopback, private or
link-local (Teredo's client ``80ff:fffe`` is ``127.0.0.1`` obfuscated)."""


@pytest.mark.parametrize("url", EMBEDDING)
async def test_ipv6_addresses_that_carry_a_private_ipv4_one_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match="inside an IPv6 address|a private address"):
        await check_url(url, allow_private=False)
    await check_url(url, allow_private=True)
    guarded = Sender(allow_private=False)
    try:
        error, final = await guarded.send(delivery(url, new_secret()))
    finally:
        await guarded.aclose()
    assert final and error is not None and error.startswith("refused:")


async def test_a_resolver_answer_carrying_a_private_ipv4_address_is_refused() -> None:
    """What the resolver answers for a name is judged like a literal (the guard every connection
    goes through): a name resolving to ``2002:7f00:1::`` reaches no one, one with a public
    address among such answers reaches only that one."""
    carried = [ipaddress.ip_address(url.split("[")[1].split("]")[0]) for url in EMBEDDING]
    with pytest.raises(TargetRefused, match=r"^refused: hooks\.example\.com \(2002:7f00:1::\) is a loopback"):
        allowed(carried, "hooks.example.com", allow_private=False)
    public = [ipaddress.ip_address("2606:4700::1111"), ipaddress.ip_address("64:ff9b::5db8:d70e")]
    assert allowed([*carried, *public], "hooks.example.com", allow_private=False) == public
    assert allowed(carried, "hooks.example.com", allow_private=True) == carried
    await check_url("http://[64:ff9b::5db8:d70e]/", allow_private=False)  # NAT64 to a public address


async def test_the_loop_goes_on_after_the_replay_log_fails(store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """An error of the replay log, outage or not (PostgreSQL: the table is not there), pauses the
    loop — counted, shown by ``problem()`` (``/readyz``), one log line — and deliveries go on once
    the log answers again, with one line saying so; it never ends the loop."""
    caplog.set_level(logging.WARNING, logger="runwire")
    async with open_store(store_url) as log, serve_receiver(Receiver()) as receiver:
        receiver.secret = new_secret()
        outbox = log.outbox()
        sender = Sender(allow_private=True, attempt_s=5.0)
        metrics = DeliveryMetrics()
        deliverer = Deliverer(outbox, sender, schedule=QUICK, poll_s=0.05, metrics=metrics)
        stop = asyncio.Event()
        task = asyncio.create_task(deliverer.run(stop))
        try:
            await outbox.enqueue([delivery(receiver.url + "/hook", receiver.secret, "msg_before")])
            await until(lambda: "msg_before" in receiver.accepted, what="the first delivery")
            await asyncio.to_thread(rename_table, store_url, "deliveries", "deliveries_away")
            await until(deliverer.problem, what="the loop paused")
            assert metrics.errors.labels("store")._value.get() >= 1 and metrics.paused._value.get() == 1
            await asyncio.to_thread(rename_table, store_url, "deliveries_away", "deliveries")
            await outbox.enqueue([delivery(receiver.url + "/hook", receiver.secret, "msg_after")])
            await until(lambda: "msg_after" in receiver.accepted, what="a delivery after the failure")
            await until(lambda: deliverer.problem() is None, what="the loop going on")
            assert not task.done() and metrics.paused._value.get() == 0
        finally:
            stop.set()
            await task
            await sender.aclose()
    assert receiver.refused == [] and set(receiver.accepted) == {"msg_before", "msg_after"}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("webhook deliveries ")]
    assert [line.split(":")[0].split(" after")[0] for line in lines] == \
        ["webhook deliveries paused", "webhook deliveries resumed"], lines


def rename_table(store_url: str, old: str, new: str) -> None:
    """``ALTER TABLE old RENAME TO new`` in the replay log at ``store_url``, from a connection of
    its own (as an operator's migration would)."""
    if store_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(store_url.removeprefix("sqlite:///"), timeout=30)) as conn:
            conn.execute(f"ALTER TABLE {old} RENAME TO {new}")
            conn.commit()
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {old} RENAME TO {new}")


async def test_a_notice_that_cannot_be_built_is_dropped_and_the_others_go_out(log: ReplayLog, sender: Sender) -> None:
    """A fault building one notice's deliveries (here: a build that refuses run ``run-b``) drops that
    notice, logged and counted; the other notices of its round are delivered."""
    async with serve_receiver(Receiver()) as receiver:
        outbox = log.outbox()
        sub = await add_webhook(outbox, None, NewWebhook(url=receiver.url + "/hook"), allow_private=True)
        receiver.secret = sub.secret

        def picky(notice: Notice, subs: list[Subscription]) -> list[Delivery]:
            if notice.run_id == "run-b":
                raise ValueError("cannot build this one")
            return build(notice, subs)

        await log.append([event(run, 1, "run.lifecycle", {"state": "done"}) for run in ("run-a", "run-b", "run-c")])
        metrics = DeliveryMetrics()
        deliverer = Deliverer(outbox, sender, build=picky, poll_s=0.05, metrics=metrics)
        await deliver_until(deliverer, lambda: len(receiver.accepted) == 2, "the other runs' deliveries")
    assert receiver.run_ids() == ["run-a", "run-c"] and metrics.errors.labels("notice")._value.get() == 1


async def test_readyz_and_metrics_show_deliveries_paused(memory_bus: Bus, store_url: str) -> None:
    """An edge's webhook deliveries (``runwire edge``, ``runwire up``), paused by a failing replay
    log: ``/readyz`` answers 503 naming them, ``/metrics`` counts the errors; ready again after."""
    async with open_store(store_url) as log, serve_edge(memory_bus, log) as edge, \
            httpx.AsyncClient(base_url=edge.url) as http:
        with edge_deliveries(edge.edge, log, allow_private=True):
            assert (await http.get("/readyz")).status_code == 200
            await asyncio.to_thread(rename_table, store_url, "deliveries", "deliveries_away")

            async def not_ready() -> dict[str, object] | None:
                answer = await http.get("/readyz")
                return answer.json() if answer.status_code == 503 else None  # type: ignore[no-any-return]

            assert (await until(not_ready, what="/readyz 503"))["webhooks"] in ("unavailable", "error")
            metrics = (await http.get("/metrics")).text
            assert "runwire_webhook_deliveries_paused 1.0" in metrics
            assert 'runwire_webhook_errors_total{part="store"}' in metrics
            await asyncio.to_thread(rename_table, store_url, "deliveries_away", "deliveries")
            await until(lambda: ready(http), what="/readyz 200 again")


async def ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200


async def test_deliveries_wait_for_a_replay_log_that_is_down_at_start(own_postgres: PostgresServer) -> None:
    """A process that opens its own replay log for deliveries (the Kafka worker) and finds it
    down: deliveries pause (``problem()``), the log is tried again, and once it is up what was
    queued goes out."""
    async with open_store(own_postgres.url):
        pass  # the outbox's tables made
    await asyncio.to_thread(own_postgres.stop)
    async with serve_receiver(Receiver()) as receiver:
        receiver.secret = new_secret()
        thread = DeliveryThread(own_postgres.url, allow_private=True)
        thread.start()
        try:
            assert await until(thread.problem, what="deliveries paused") == "unavailable"
            await asyncio.to_thread(own_postgres.resume)
            async with open_store(own_postgres.url) as log:
                await log.outbox().enqueue([delivery(receiver.url + "/hook", receiver.secret, "msg_late")])
                await until(lambda: "msg_late" in receiver.accepted, what="the delivery once the log is up")
            assert thread.problem() is None
            assert thread.metrics.errors.labels("store")._value.get() >= 1
        finally:
            await asyncio.to_thread(thread.stop)
