"""What a publishing process keeps until the consumer groups are done with it, on any bus that
can lose what it acknowledged: the task that checks it, and the wait when closing.

Redis (:mod:`runwire.bus.redis.retain`) and Kafka (:mod:`runwire.bus.kafka.retain`) each say
what is kept, how a loss is found and when an entry may go; this is the part they share: while
anything is kept, a round of checks (``confirm``) every :data:`CONFIRM_INTERVAL_S`, and a
closing process waiting up to ``close_wait_ms`` for the groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)

CONFIRM_INTERVAL_S = 0.5
"""How often kept entries are checked (lost? done by every group?) while any are kept."""


class Confirming:
    """The confirming task of a process's kept entries (see the module docstring)."""

    bytes: int
    """Bytes kept now: the task runs while there are any."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._rounds = asyncio.Lock()
        """One round at a time: the task's and a closing process's would otherwise both let go of
        the same confirmed entries, and share (and close) one another's clients mid-call."""

    async def confirm(self) -> None:
        """One round of checks: send again what the bus lost, let go of what the groups are
        done with."""
        raise NotImplementedError

    def awaited(self) -> bool:
        """Whether a closing process waits: something kept that a group is still to finish."""
        raise NotImplementedError

    def _start(self) -> None:
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to confirm from
                self._task = asyncio.get_running_loop().create_task(self._confirming())

    async def _confirming(self) -> None:
        while self.bytes > 0:
            await asyncio.sleep(CONFIRM_INTERVAL_S)
            await self._round()

    async def _round(self) -> None:
        async with self._rounds:
            try:
                await self.confirm()
            except Exception as exc:  # a bus outage: the publish path reports it; retry next round
                log.debug("confirming kept ingest entries: %s", exc)

    async def drain(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` until every group is done with what was kept (a closing process)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self.awaited() and loop.time() < deadline:
            await self._round()
            if self.awaited():
                await asyncio.sleep(min(CONFIRM_INTERVAL_S / 5, max(0.0, deadline - loop.time())))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
