"""What a ``memory://`` bus holds: shard logs, consumer groups with their
pending entries and leases, delivery streams and control channels (see
:mod:`runwire.bus.memory`). Shared by name between buses of one process.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterable
from itertools import repeat

import msgspec

from ...core.envelope import Event
from ..base import ControlCommand, DeadLetter, StreamKey

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


class Pending(msgspec.Struct, gc=False, eq=False):
    """A delivered, unacked entry (untracked by the collector: it holds no containers; hashed and
    compared as itself: a delivery's entries share one)."""

    consumer: str
    delivered_ms: float
    count: int


class _ShardLog:
    """One ingest shard: entries with increasing ids (the oldest may be trimmed).

    A list with a moving head: reading by id and trimming cost what they
    return or drop (the list is compacted once half of it is trimmed).
    """

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.head = 0
        """Index in ``data`` of the oldest entry kept."""
        self.base_id = 1
        """The id of ``data[0]``."""

    @property
    def next_id(self) -> int:
        return self.base_id + len(self.data)

    def __len__(self) -> int:
        return len(self.data) - self.head

    def append(self, data: bytes) -> None:
        self.data.append(data)

    def get(self, entry_id: int) -> bytes | None:
        index = entry_id - self.base_id
        if self.head <= index < len(self.data):
            return self.data[index]
        return None

    def after(self, entry_id: int, limit: int) -> tuple[int, list[bytes]]:
        """Up to ``limit`` entries with ids above ``entry_id``: the first one's id, their data."""
        start = max(self.head, entry_id + 1 - self.base_id)
        return self.base_id + start, self.data[start:start + max(limit, 0)]

    def trim_through(self, entry_id: int) -> int:
        """Drop the entries with ids up to ``entry_id``; returns how many were dropped."""
        head = min(len(self.data), max(self.head, entry_id + 1 - self.base_id))
        dropped, self.head = head - self.head, head
        if head and head * 2 >= len(self.data):
            del self.data[:head]
            self.base_id += head
            self.head = 0
        return dropped


class _GroupShard:
    """A group's position in one shard and its pending (delivered, unacked) entries.

    ``pending`` is kept in the order of (re)delivery, so the entries idle
    longest come first; ``held`` counts them per consumer; no entry below
    ``low`` is pending. Each fetch and ack costs what it returns or acks.
    """

    def __init__(self) -> None:
        self.last_delivered = 0
        self.pending: dict[int, Pending] = {}
        """(A dict, not an OrderedDict: in order of insertion too, a redelivery deleted and put
        back at the end; holding a fetch's entries costs about half of what it did.)"""
        self.held: dict[str, int] = {}
        self.low = 1

    def hold(self, first: int, count: int, consumer: str, now: float) -> None:
        """Record the first delivery of entries ``first`` … ``first + count - 1`` (the next ones).

        The entries of one delivery share one :class:`Pending` (never changed: a redelivery
        gives its entry a new one), so that holding and releasing them cost C-level passes."""
        if not self.pending:
            self.low = first
        self.pending.update(zip(range(first, first + count), repeat(Pending(consumer, now, 1))))
        self.held[consumer] = self.held.get(consumer, 0) + count
        self.last_delivered = first + count - 1

    def move(self, entry_id: int, pending: Pending, consumer: str, now: float) -> Pending:
        """Record a redelivery of a pending entry to ``consumer``: its new :class:`Pending`."""
        self._forget_holder(pending.consumer)
        self.held[consumer] = self.held.get(consumer, 0) + 1
        del self.pending[entry_id]  # (put back at the end: the newest delivery)
        moved = self.pending[entry_id] = Pending(consumer, now, pending.count + 1)
        return moved

    def release(self, entry_ids: Iterable[int]) -> bool:
        """Forget acked (or dead-lettered) entries; False if none of them was pending."""
        released: dict[str, int] = {}
        popped = list(map(self.pending.pop, entry_ids, repeat(None)))
        if popped and popped[0] is not None and popped.count(popped[0]) == len(popped):
            released[popped[0].consumer] = len(popped)  # (one delivery's entries: one Pending)
        else:
            for pending, count in Counter(popped).items():
                if pending is not None:
                    released[pending.consumer] = released.get(pending.consumer, 0) + count
        holders = self.held
        for consumer, count in released.items():
            left = holders[consumer] - count
            if left:
                holders[consumer] = left
            else:
                del holders[consumer]
        return bool(released)

    def _forget_holder(self, consumer: str) -> None:
        left = self.held[consumer] - 1
        if left:
            self.held[consumer] = left
        else:
            del self.held[consumer]

    def held_by_others(self, consumer: str) -> bool:
        return len(self.pending) > self.held.get(consumer, 0)

    def oldest(self) -> Pending | None:
        """The entry delivered longest ago (the first to become claimable)."""
        return next(iter(self.pending.values()), None)

    def done_through(self) -> int:
        """Every entry up to this id is delivered and acked by the group."""
        pending, low, last = self.pending, self.low, self.last_delivered
        if not pending:
            return last
        # the first id from low that is still pending (a C-level scan; none: all acked up to last)
        low = next(filter(pending.__contains__, range(low, last + 1)), last + 1)
        self.low = low
        return low - 1


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


