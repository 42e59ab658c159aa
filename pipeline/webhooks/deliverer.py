"""The delivery loop: queued deliveries out of the outbox, to their URLs, at least once.

``deliver this JSON body to this URL, signed with this secret, durably, at
least once``: anything that queues a :class:`~runwire.store.outbox.Delivery`
(:meth:`Outbox.enqueue`, or a notice's fan-out) gets that from any process
running a :class:`Deliverer` on the same replay log — ``runwire up``,
``runwire edge`` and ``runwire worker`` each run one, on a thread of its own
(``runwire.workers.deliveries``), so a slow receiver never holds the
worker's event loop.

Each round settles the attempts that finished, turns new run notices into
deliveries (:meth:`Outbox.fan_out`, when a ``build`` is given), claims due
deliveries for its free slots (leased for :data:`LEASE_S`: a process that
dies mid-send leaves them due again after it) and starts them — at most
``per_channel`` of one channel at once, so a receiver that answers slowly
delays its own deliveries, not everyone's. A failed
attempt is due again after the next step of :data:`RETRY_SCHEDULE` (±10 %):
three retries within the first minute, then further apart, for ~28 hours in
all; a delivery whose schedule is spent is marked failed and its channel
disabled — a webhook that keeps failing shows as disabled, with the reason,
and gets nothing more until it is added again. A delivery whose target this
process refuses (``runwire.webhooks.targets``: an address that is not
public, and private targets not allowed here) is not retried: it fails at
once and disables its channel with the refusal (``refused: …``) as the
reason, whichever attempt it was.

Nothing one round meets ends the loop: an attempt that raises is a failed
attempt (retried on the schedule); a notice that can't be built into
deliveries is dropped, logged; a replay log that fails (unreachable, or an
error of any other kind) pauses the loop, with a backoff from 1 s to
:data:`PAUSE_MAX_S`, logged once per outage, counted in
``runwire_webhook_errors_total`` and shown in the edge's ``/readyz``
(:meth:`Deliverer.problem`) until a round succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..core.errors import RunwireError
from ..core.redaction import redact_text
from ..store.outbox import Build, Delivery, Notice, Outbox, Outcome, Subscription
from .sender import Sender

log = logging.getLogger(__name__)

RETRY_SCHEDULE: tuple[float, ...] = (5, 15, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200)
"""Seconds from each failed attempt to the next: retries 1–3 within a minute of the first
attempt (5 + 15 + 30 s, 55 s at most with jitter), then 2 min … 12 h; the 12th failure, ~27.7 h
after the first, exhausts it."""
LEASE_S = 60.0
"""How long a claimed delivery is this process's (several attempts' worth of :data:`~.sender.ATTEMPT_S`)."""
FAILED_KEPT_S = 7 * 86400.0
"""How long a delivery that exhausted its schedule stays in the outbox (for ``failed`` counts)."""
NOTICES_KEPT_S = 86400.0
"""A run notice no process took for this long is dropped (nothing fans out from this log)."""
PURGE_EVERY_S = 600.0
FAN_OUT_BATCH = 500
"""Notices one fan-out takes (the next follows at once when it took this many, else after a poll)."""
GATHER_S = 0.02
"""After an attempt finishes, how long a round waits for others to finish too: their outcomes are
recorded in one transaction."""


PAUSE_MAX_S = 30.0
"""The longest pause between rounds while the replay log keeps failing (1 s, doubling up to it)."""
ERROR_CHARS = 500
"""Longest error kept with a delivery (what a receiver or a connection said, cut)."""


class DeliveryStats(msgspec.Struct, kw_only=True):
    delivered: int = 0
    retried: int = 0
    exhausted: int = 0
    notices: int = 0


class DeliveryMetrics:
    """What the deliverer did and met, in ``registry`` (a ``/metrics`` page's) or one of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.outcomes = Counter("runwire_webhook_deliveries", "Webhook delivery attempts by outcome",
                                ["outcome"], registry=r)
        self.errors = Counter("runwire_webhook_errors", "Errors the webhook delivery loop met and went on"
                              " after: store (the replay log), attempt, notice", ["part"], registry=r)
        self.paused = Gauge("runwire_webhook_deliveries_paused",
                            "1 while webhook deliveries wait for the replay log", registry=r)


class Outage:
    """The replay log failing under deliveries: each failure counted, the first of an outage
    logged (with its traceback when it is no outage the log reports as passing), the pause
    before the next try doubled from 1 s up to :data:`PAUSE_MAX_S`; :attr:`problem` says why
    until :meth:`over`."""

    def __init__(self, metrics: DeliveryMetrics) -> None:
        self.metrics = metrics
        self.problem: str | None = None
        """``unavailable`` (or the log's own reason) or ``error`` during an outage, else None."""
        self.pause_s = 0.0
        self.since = 0.0

    def failed(self, exc: Exception, what: str = "") -> float:
        """Count ``exc``; the seconds to wait before the next try."""
        self.metrics.errors.labels("store").inc()
        self.pause_s = min(2 * self.pause_s or 1.0, PAUSE_MAX_S)
        if self.problem is None:
            retriable = isinstance(exc, RunwireError) and exc.retriable
            self.problem = (exc.reason if isinstance(exc, RunwireError) and exc.reason else None) or (
                "unavailable" if retriable else "error")
            self.metrics.paused.set(1)
            self.since = time.monotonic()
            log.warning("webhook deliveries paused%s: %s", what, _redacted(exc), exc_info=not retriable)
        return self.pause_s

    def over(self) -> None:
        if self.problem is not None:
            log.warning("webhook deliveries resumed after %.1fs of %s", time.monotonic() - self.since, self.problem)
            self.problem = None
            self.metrics.paused.set(0)
        self.pause_s = 0.0


class Deliverer:
    """Delivers an outbox's due deliveries, ``concurrency`` at once."""

    def __init__(self, outbox: Outbox, sender: Sender, *, build: Build | None = None,
                 schedule: tuple[float, ...] = RETRY_SCHEDULE, concurrency: int = 64, per_channel: int = 16,
                 poll_s: float = 0.5, lease_s: float = LEASE_S, clock: Callable[[], float] = time.time,
                 metrics: DeliveryMetrics | None = None) -> None:
        self.outbox = outbox
        self.sender = sender
        self.build = build
        self.schedule = schedule
        self.concurrency = concurrency
        self.per_channel = per_channel
        """Attempts of one channel under way at once: a receiver that answers slowly holds at most
        this many of the ``concurrency`` slots, and the others' deliveries go on."""
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.clock = clock
        self.stats = DeliveryStats()
        self.metrics = metrics or DeliveryMetrics()
        self.outage = Outage(self.metrics)
        self._inflight: set[asyncio.Task[None]] = set()
        self._channels: dict[str, int] = {}
        self._finished: list[tuple[Delivery, str | None, bool, float]] = []
        self._wake = asyncio.Event()
        self._next_purge = 0.0
        self._next_fan_out = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; then wait a little for the attempts under way and record
        them (those still running are left to their lease)."""
        try:
            while not stop.is_set():
                pause = 0.0
                try:
                    busy = await self.step()
                except Exception as exc:  # whatever the replay log raised: paused, never ended
                    pause, busy = self.outage.failed(exc), False
                else:
                    self.outage.over()
                if not busy:
                    await self._idle(stop, pause or self.poll_s)
        finally:
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=2.0)
            for task in self._inflight:
                task.cancel()
            try:
                await self._settle()
            except Exception as exc:  # left to the lease: the deliveries are attempted again
                log.warning("webhook deliveries: the last attempts' outcomes are not recorded: %s",
                            _redacted(exc))

    def problem(self) -> str | None:
        """Why deliveries are paused (``unavailable``, ``error``), or None while they go on."""
        return self.outage.problem

    async def _idle(self, stop: asyncio.Event, wait_s: float) -> None:
        """Until ``stop``, an attempt finished (and :data:`GATHER_S` more), or ``wait_s`` passed."""
        stopping = asyncio.ensure_future(stop.wait())
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stopping, woken}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            woken.cancel()
        if self._wake.is_set() and self._inflight and not stop.is_set():
            await asyncio.sleep(GATHER_S)
        self._wake.clear()

    async def step(self) -> bool:
        """One round (see the module docstring); True when it found work, so the next can follow at once."""
        settled = await self._settle()
        notices = 0
        if self.build is not None and self.clock() >= self._next_fan_out:
            notices = await self.outbox.fan_out(self._build, FAN_OUT_BATCH)
            self._next_fan_out = 0.0 if notices == FAN_OUT_BATCH else self.clock() + self.poll_s
        self.stats.notices += notices
        free = self.concurrency - len(self._inflight)
        rooms = {channel: self.per_channel - count for channel, count in self._channels.items()}
        claimed = (await self.outbox.claim(free, self.lease_s, per_channel=self.per_channel, rooms=rooms)
                   if free > 0 else [])
        for delivery in claimed:  # (the claim left out what is over a channel's share)
            self._channels[delivery.channel] = self._channels.get(delivery.channel, 0) + 1
            task = asyncio.create_task(self._attempt(delivery))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        if self.clock() >= self._next_purge:
            now = self.clock()
            await self.outbox.purge(now - FAILED_KEPT_S, now - NOTICES_KEPT_S)
            self._next_purge = now + PURGE_EVERY_S
        return bool(settled or notices or len(claimed) == free > 0)

    def _build(self, notice: Notice, subs: list[Subscription]) -> list[Delivery]:
        """``build``, for one notice: one that can't be built is dropped (logged, counted), and the
        other notices of its round are fanned out."""
        assert self.build is not None
        try:
            return self.build(notice, subs)
        except Exception:
            self.metrics.errors.labels("notice").inc()
            log.exception("webhook deliveries: run notice %s of run %s dropped", notice.type, notice.run_id)
            return []

    async def _attempt(self, delivery: Delivery) -> None:
        try:
            error, final = await self.sender.send(delivery)
        except Exception as exc:  # a bug in one attempt must not end the loop: it is retried
            self.metrics.errors.labels("attempt").inc()
            log.exception("webhook delivery %s failed unexpectedly", delivery.id)
            error, final = f"{type(exc).__name__}: {exc}", False
        if error is not None:  # kept as text by the replay log: no NUL (PostgreSQL refuses it), bounded
            error = error.replace("\x00", "")[:ERROR_CHARS]
        self._finished.append((delivery, error, final, self.clock()))
        left = self._channels.pop(delivery.channel, 1) - 1
        if left:
            self._channels[delivery.channel] = left
        self._wake.set()

    async def _settle(self) -> int:
        """Record the attempts that finished; how many."""
        finished, self._finished = self._finished, []
        delivered: list[Outcome] = []
        retries: list[tuple[Outcome, float]] = []
        exhausted: list[Outcome] = []
        refused: list[Outcome] = []
        for delivery, error, final, at in finished:
            outcome = (delivery.id, delivery.channel, at, error)
            if error is None:
                delivered.append(outcome)
            elif final:
                refused.append(outcome)
            elif delivery.attempts >= len(self.schedule):
                exhausted.append(outcome)
            else:
                pause = self.schedule[delivery.attempts] * random.uniform(0.9, 1.1)
                retries.append((outcome, at + pause))
        try:
            await self.outbox.settle(delivered, retries, exhausted, refused)
        except BaseException:
            self._finished[:0] = finished  # recorded on the next round (or left to the lease)
            raise
        for delivery_id, channel, _, error in exhausted:
            log.warning("webhook delivery %s to %s failed for good (%s): the channel is disabled",
                        delivery_id, channel, error)
        for delivery_id, channel, _, error in refused:
            log.warning("webhook delivery %s to %s: %s; the channel is disabled", delivery_id, channel, error)
        self.stats.delivered += len(delivered)
        self.stats.retried += len(retries)
        self.stats.exhausted += len(exhausted) + len(refused)
        for name, count in (("delivered", len(delivered)), ("retried", len(retries)),
                            ("failed", len(exhausted)), ("refused", len(refused))):
            if count:
                self.metrics.outcomes.labels(name).inc(count)
        return len(finished)


def _redacted(exc: BaseException) -> str:
    return redact_text(str(exc) or type(exc).__name__)
