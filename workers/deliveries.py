"""The webhook deliverer of one process, on a thread of its own.

``runwire up``, ``runwire edge`` and ``runwire worker`` each run one
(``runwire.webhooks.deliverer``): its event loop is not the process's, so a
receiver that answers slowly, or a burst of deliveries, never holds a
worker's writes or an edge's streams; its database work goes through the
replay log it is given (SQLite: the log's thread; PostgreSQL: a connection
of the outbox's own), or one it opens from a URL (the Kafka worker, whose
replay log lives inside faust's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator

import click

from runwire.store import ReplayLog, open_store
from runwire.webhooks.deliverer import Deliverer
from runwire.webhooks.notify import build
from runwire.webhooks.sender import Sender

log = logging.getLogger("runwire.webhooks")

allow_private_option = click.option(
    "--webhooks-allow-private", "webhooks_allow_private", is_flag=True, default=False,
    envvar="RUNWIRE_WEBHOOKS_ALLOW_PRIVATE",
    help="Let webhooks reach loopback and private addresses (refused otherwise).")


class DeliveryThread:
    """A :class:`Deliverer` on its own thread and event loop, until :meth:`stop`."""

    def __init__(self, store: ReplayLog | str, *, allow_private: bool) -> None:
        self.store = store
        self.allow_private = allow_private
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

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:
            log.exception("webhook deliveries stopped")

    async def _run(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        sender = Sender(allow_private=self.allow_private)
        try:
            if isinstance(self.store, str):
                async with open_store(self.store) as store:
                    await Deliverer(store.outbox(), sender, build=build).run(self._stop)
            else:
                await Deliverer(self.store.outbox(), sender, build=build).run(self._stop)
        finally:
            await sender.aclose()


@contextlib.contextmanager
def deliveries(store: ReplayLog | str, *, allow_private: bool) -> Iterator[DeliveryThread]:
    """Deliver webhooks from ``store`` while the block runs."""
    thread = DeliveryThread(store, allow_private=allow_private)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
