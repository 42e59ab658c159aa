"""What a ``memory://`` bus holds: shard logs, consumer groups with their
pending entries and leases, delivery streams and control channels (see
:mod:`runwire.bus.memory`). Shared by name between buses of one process.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import msgspec

from ..core.envelope import Event
from .base import ControlCommand, DeadLetter, StreamKey

CONTROL_MAXLEN = 1000


def now_ms() -> float:
    return time.monotonic() * 1000


class Notifier:
    """Wakes every waiter when something changed (loop-agnostic, unlike Condition)."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Return on the next notify, or after ``timeout_s``."""
        if timeout_s <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)


class Pending(msgspec.Struct):
    consumer: str
    delivered_ms: float
    count: int


class _ShardLog:
    """One ingest shard: entries with increasing ids (the oldest may be trimmed)."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, bytes]] = deque()
        self.next_id = 1

    def append(self, data: bytes) -> None:
        self.entries.append((self.next_id, data))
        self.next_id += 1

    def get(self, entry_id: int) -> bytes | None:
        if not self.entries:
            return None
        index = entry_id - self.entries[0][0]
        if 0 <= index < len(self.entries):
            return self.entries[index][1]
        return None

    def after(self, entry_id: int, limit: int) -> list[tuple[int, bytes]]:
        if not self.entries or limit <= 0:
            return []
        start = max(0, entry_id + 1 - self.entries[0][0])
        end = min(len(self.entries), start + limit)
        return [self.entries[i] for i in range(start, end)]

    def trim_through(self, entry_id: int) -> int:
        dropped = 0
        while self.entries and self.entries[0][0] <= entry_id:
            self.entries.popleft()
            dropped += 1
        return dropped


class _GroupShard:
    def __init__(self) -> None:
        self.last_delivered = 0
        self.pending: dict[int, Pending] = {}

    def done_through(self) -> int:
        """Every entry up to this id is delivered and acked by the group."""
        if self.pending:
            return min(self.pending) - 1
        return self.last_delivered


class Group:
    def __init__(self, shards: int) -> None:
        self.shards = [_GroupShard() for _ in range(shards)]
        self.members: dict[str, int] = {}
        """Live member name → number of open consumer objects with that name."""
        self.leases: dict[int, str] = {}

    def desired(self, name: str, shards: int) -> set[int]:
        live = sorted(self.members)
        if name not in live:
            return set()
        rank, count = live.index(name), len(live)
        return {s for s in range(shards) if s % count == rank}


class DeliveryStream:
    def __init__(self, maxlen: int) -> None:
        self.events: deque[Event] = deque(maxlen=maxlen)
        self.last = 0
        self.state: bytes | None = None
        self.expires_ms = 0.0


class MemoryState:
    """Everything a memory bus holds; shared by name between buses of one process."""

    def __init__(self, shards: int, dead_letter_maxlen: int = 10_000) -> None:
        self.shards = [_ShardLog() for _ in range(shards)]
        self.groups: dict[str, Group] = {}
        self.users = 0
        self.next_sweep_ms = 0.0
        self.backlog = 0
        self.dead: deque[DeadLetter] = deque(maxlen=dead_letter_maxlen)
        self.streams: dict[StreamKey, DeliveryStream] = {}
        self.controls: dict[str, ControlChannel] = {}
        self.ingest_changed = Notifier()
        self.ingest_drained = Notifier()
        self.streams_changed = Notifier()

    def group(self, name: str) -> Group:
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = Group(len(self.shards))
        return found

    def trim(self, shard: int) -> None:
        """Drop entries every group has acked (all kept while no group exists)."""
        if not self.groups:
            return
        through = min(g.shards[shard].done_through() for g in self.groups.values())
        dropped = self.shards[shard].trim_through(through)
        if dropped:
            self.backlog -= dropped
            self.ingest_drained.notify()


class ControlChannel:
    def __init__(self) -> None:
        self.entries: deque[tuple[int, ControlCommand]] = deque(maxlen=CONTROL_MAXLEN)
        self.next_id = 1
        self.expires_ms = 0.0
        self.changed = Notifier()


