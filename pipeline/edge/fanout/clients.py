"""One client's bounded queue of frames, with the slow-client drop policy of Koder agent stream §4 R4.

The hub puts frames in without ever waiting; the client's writer takes them
out in batches. The queue is bounded in frames and in bytes. When a frame
does not fit, ``reasoning.delta`` frames are dropped first (the incoming one
or queued ones), then ``text.delta``; tool, step and lifecycle frames are
never dropped. If even such a frame does not fit, the client is marked
overflowed and its writer disconnects it with ``KAI-STREAM-BUF-0001``;
other clients are unaffected because nothing here ever blocks the hub.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from .frames import DROP_REASONING, DROP_TEXT, NEVER_DROP, Batch, Frame


class DirectWriter(Protocol):
    """What writes to a client at once while its writer waits (``StreamSession``): each returns
    False, having written nothing, when it can't now."""

    def write_now(self, batch: Batch) -> bool: ...

    def keepalive_now(self) -> bool: ...


class ClientQueue:
    """Frames waiting for one client, bounded by ``max_frames`` and ``max_bytes``."""

    __slots__ = ("_droppable", "_frames", "_waiter", "bytes", "direct", "keepalive_s", "last_write", "on_overflow", "dropped", "dropped_by_type", "max_bytes", "max_frames", "overflowed")

    def __init__(self, *, max_frames: int, max_bytes: int) -> None:
        self._frames: list[Frame] = []
        """Oldest first; taken whole by :meth:`take` (a list: ~0.6 KB less per client than a deque)."""
        self._droppable = [0, 0]
        """Queued frames per drop rank (reasoning, text): no scan when there is none to drop."""
        self._waiter: asyncio.Future[None] | None = None
        self.bytes = 0
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.dropped = 0
        """Events dropped for this client (§4 R4); reported in its terminal run.lifecycle."""
        self.dropped_by_type: dict[str, int] = {}
        self.on_overflow: Callable[[], None] | None = None
        self.last_write = time.monotonic()
        """When the writer last wrote to the client (the keepalive sweep reads it)."""
        self.keepalive_s: float | None = None
        """This client's idle time before a keepalive, when its protocol needs one sooner than the
        edge's ``keepalive_s`` (an A2A client times out a silent stream after 5 s)."""
        self.overflowed = False
        """True once a never-drop frame did not fit: the client is to be disconnected."""
        self.direct: DirectWriter | None = None
        """Writes a batch or a keepalive to the client at once, or declines; tried by
        :meth:`put_many` and :meth:`keepalive` only while the writer waits with nothing queued,
        so order holds."""

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: Frame) -> bool:
        """Queue a frame without waiting. False when it was dropped or the client overflowed."""
        if self.overflowed:
            return False
        if not self._fits(frame, 0, 0) and not self._make_room(frame):
            return False
        self._frames.append(frame)
        self.bytes += frame.size
        if frame.rank < NEVER_DROP:
            self._droppable[frame.rank] += 1
        self._wake()
        return True

    def put_many(self, frames: list[Frame]) -> list[Frame]:
        """Queue frames in order with one wake (or write them at once, see :attr:`direct`);
        returns the ones dropped (§4 R4)."""
        direct = self.direct
        if direct is not None and not self._frames and type(frames) is Batch:
            waiter = self._waiter
            if waiter is not None and not waiter.done() and direct.write_now(frames):
                return []
        size = 0
        for frame in frames:
            size += frame.size
        if self.overflowed:
            return []
        if len(self._frames) + len(frames) <= self.max_frames and self.bytes + size <= self.max_bytes:
            self._frames.extend(frames)
            self.bytes += size
            droppable = self._droppable
            for frame in frames:
                if frame.rank < NEVER_DROP:
                    droppable[frame.rank] += 1
            self._wake()
            return []
        return [frame for frame in frames if not self.put(frame) and frame.rank < NEVER_DROP]

    def _fits(self, frame: Frame, slack_frames: int, slack_bytes: int) -> bool:
        return (
            len(self._frames) + slack_frames < self.max_frames
            and self.bytes + frame.size + slack_bytes <= self.max_bytes
        )

    def _make_room(self, frame: Frame) -> bool:
        for rank in (DROP_REASONING, DROP_TEXT):
            if frame.rank == rank:
                self._count_drop(frame)
                return False
            if self._droppable[rank]:
                self._evict(rank, frame)
                if self._fits(frame, 0, 0):
                    return True
        self.overflowed = True
        self._wake()
        if self.on_overflow is not None:
            self.on_overflow()
        return False

    def _evict(self, rank: int, incoming: Frame) -> None:
        """Drop queued frames of ``rank``, oldest first, until ``incoming`` fits with an eighth
        of the bounds to spare: one scan then serves many puts (no O(queue) scan per drop)."""
        slack_frames, slack_bytes = self.max_frames // 8, self.max_bytes // 8
        kept: list[Frame] = []
        count = len(self._frames)
        for queued in self._frames:
            tight = count + slack_frames >= self.max_frames or (
                self.bytes + incoming.size + slack_bytes > self.max_bytes
            )
            if queued.rank == rank and tight:
                self.bytes -= queued.size
                count -= 1
                self._droppable[rank] -= 1
                self._count_drop(queued)
                continue
            kept.append(queued)
        self._frames = kept

    def _count_drop(self, frame: Frame) -> None:
        self.dropped += 1
        self.dropped_by_type[frame.event_type] = self.dropped_by_type.get(frame.event_type, 0) + 1

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[Frame]:
        """Every queued frame, oldest first (empties the queue)."""
        frames = self._frames
        self._frames = []
        self.bytes = 0
        self._droppable = [0, 0]
        return frames

    def keepalive(self) -> None:
        """Keep an idle client's connection open (the hub's keepalive sweep): written at once
        where :attr:`direct` can, else the writer is woken with nothing queued to send one."""
        direct = self.direct
        if direct is not None and not self._frames:
            waiter = self._waiter
            if waiter is not None and not waiter.done() and direct.keepalive_now():
                return
        self._wake()

    async def wait(self) -> bool:
        """Wait until a frame is queued, the client overflowed, or it is poked.

        True when there is something to take. There is no timer per wait:
        the hub's one keepalive sweep wakes idle clients (a timer per wait
        costs a heap push and pop per client per event).
        """
        if self._frames or self.overflowed:
            return True
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        return bool(self._frames) or self.overflowed
