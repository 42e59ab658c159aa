"""The webhook deliverer of one process, on a thread of its own.

``runwire up``, ``runwire edge`` and ``runwire worker`` each run one
(``runwire.webhooks.deliverer``): its event loop is not the process's, so a
receiver that answers slowly, or a burst of deliveries, never holds a
worker's writes or an edge's streams; its database work goes through the
replay log it is given (SQLite: the log's thread; PostgreSQL: a connection
of the outbox's own), or one it opens from a URL (the Kafka worker, whose
replay log lives inside faust's loop) — and opens again until it can, when
it is down as the process starts. Nothing the replay log does ends the
thread: deliveries pause (``problem()``, the edge's ``/readyz``) and go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click
from prometheus_client import CollectorRegistry

from runwire.store import ReplayLog, open_store
from runwire.webhooks.deliverer import Deliverer, DeliveryMetrics, Outage
from runwire.webhooks.notify import build
from runwire.webhooks.sender import Sender

if TYPE_CHECKING:
    from runwire.edge.service.context import Edge

log = logging.getLogger("runwire.webhooks")

allow_private_option = click.option(
    "--webhooks-allow-private", "webhooks_allow_private", is_flag=True, default=False,
    envvar="RUNWIRE_WEBHOOKS_ALLOW_PRIVATE",
    help="Let webhooks reach loopback and private addresses (refused otherwise).")


class DeliveryThread:
    """A :class:`Deliverer` on its own thread and event loop, until :meth:`stop`."""

    def __init__(self, store: ReplayLog | str, *, allow_private: bool, registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.allow_private = allow_private
        self.metrics = DeliveryMetrics(registry)
        self._opening = Outage(self.metrics)
        self._deliverer: Deliverer | None = None
        self._sender: Sender
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="runwire-webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop delivering (attempts under way get ~2 s to finish and be recorded); again: nothing."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)

    def problem(self) -> str | None:
        """Why deliveries are paused or stopped (for ``/readyz``), None while they go on."""
        if self._thread.ident is not None and not self._thread.is_alive():
            return "stopped"
        return self._opening.problem or (None if self._deliverer is None else self._deliverer.problem())

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:
            log.exception("webhook deliveries stopped")

    async def _run(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        sender = self._sender = Sender(allow_private=self.allow_private)
        try:
            if isinstance(self.store, str):
                await self._open_and_deliver(self.store)
            else:
                await self._deliver(self.store)
        finally:
            await sender.aclose()

    async def _open_and_deliver(self, url: str) -> None:
        """Deliver from the replay log at ``url``, opened here: one that can't be opened (down as
        the process starts) pauses deliveries like a failed round, and is tried again."""
        assert self._stop is not None
        while not self._stop.is_set():
            try:
                async with open_store(url) as store:
                    self._opening.over()
                    await self._deliver(store)
            except Exception as exc:  # whatever opening or closing it raised: tried again
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._opening.failed(exc, " (opening the replay log)"))

    async def _deliver(self, store: ReplayLog) -> None:
        assert self._stop is not None
        self._deliverer = Deliverer(store.outbox(), self._sender, build=build, metrics=self.metrics)
        await self._deliverer.run(self._stop)


@contextlib.contextmanager
def deliveries(store: ReplayLog | str, *, allow_private: bool,
               registry: CollectorRegistry | None = None) -> Iterator[DeliveryThread]:
    """Deliver webhooks from ``store`` while the block runs (counting in ``registry``, a
    ``/metrics`` page's, when given)."""
    thread = DeliveryThread(store, allow_private=allow_private, registry=registry)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


@contextlib.contextmanager
def edge_deliveries(edge: Edge, store: ReplayLog, *, allow_private: bool) -> Iterator[DeliveryThread]:
    """:func:`deliveries` beside an edge (``runwire edge``, ``runwire up``): counted in its
    ``/metrics``, and a pause shown in its ``/readyz`` (``"webhooks": "unavailable"``)."""
    with deliveries(store, allow_private=allow_private, registry=edge.metrics.registry) as thread:
        edge.readiness["webhooks"] = thread.problem
        try:
            yield thread
        finally:
            edge.readiness.pop("webhooks", None)
