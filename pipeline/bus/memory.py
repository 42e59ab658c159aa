"""``memory://`` — the bus in one process, with the same semantics as Redis.

``memory://`` is private to the bus object; ``memory://<name>`` shares its
state with every other open ``memory://<name>`` bus of the process (for
publishers and workers wired together in one process); the state is dropped
when the last of them closes.

It models Redis Streams closely so that the contract suite means the same
thing on every backend: shard logs with increasing entry ids, consumer groups
with a last-delivered position and a pending-entries list per shard (owner,
delivery time, delivery counter), shard leases split fairly among the live
members, claims of entries idle longer than ``claim_idle_ms``, and a consumer
that dead-letters entries delivered more than ``max_deliveries`` times.

Bounded: an ingest entry is kept until every group has acked it; when more
than ``max_backlog`` entries are kept, ``publish`` waits for consumers
rather than growing the process. Delivery streams keep their last
``maxlen`` events and disappear ``ttl`` seconds after their last append.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec

from ..envelope import Event, encode
from .base import Bus, Consumer, ControlCommand, DeadLetter, Delivery, StreamKey
from .options import split_url

log = logging.getLogger(__name__)

ACCEPTED_OPTIONS = (
    "shards", "maxlen", "ttl", "claim_idle_ms", "lease_ms", "max_deliveries", "max_backlog",
    "dead_letter_maxlen",
)
_CONTROL_MAXLEN = 1000


def _now_ms() -> float:
    return time.monotonic() * 1000


class _Notifier:
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


class _Pending(msgspec.Struct):
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
        self.pending: dict[int, _Pending] = {}

    def done_through(self) -> int:
        """Every entry up to this id is delivered and acked by the group."""
        if self.pending:
            return min(self.pending) - 1
        return self.last_delivered


class _Group:
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


class _DeliveryStream:
    def __init__(self, maxlen: int) -> None:
        self.events: deque[Event] = deque(maxlen=maxlen)
        self.last = 0
        self.state: bytes | None = None
        self.expires_ms = 0.0


class MemoryState:
    """Everything a memory bus holds; shared by name between buses of one process."""

    def __init__(self, shards: int, dead_letter_maxlen: int = 10_000) -> None:
        self.shards = [_ShardLog() for _ in range(shards)]
        self.groups: dict[str, _Group] = {}
        self.users = 0
        self.next_sweep_ms = 0.0
        self.backlog = 0
        self.dead: deque[DeadLetter] = deque(maxlen=dead_letter_maxlen)
        self.streams: dict[StreamKey, _DeliveryStream] = {}
        self.controls: dict[str, _ControlChannel] = {}
        self.ingest_changed = _Notifier()
        self.ingest_drained = _Notifier()
        self.streams_changed = _Notifier()

    def group(self, name: str) -> _Group:
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = _Group(len(self.shards))
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


class _ControlChannel:
    def __init__(self) -> None:
        self.entries: deque[tuple[int, ControlCommand]] = deque(maxlen=_CONTROL_MAXLEN)
        self.next_id = 1
        self.expires_ms = 0.0
        self.changed = _Notifier()


_NAMED: dict[str, MemoryState] = {}


class MemoryBus(Bus):
    """The in-process bus (see the module docstring)."""

    def __init__(self, url: str = "memory://", **_: Any) -> None:
        options, _bare, _kept = split_url(url, ACCEPTED_OPTIONS)
        self.url = url
        self.options = options
        self.shards = options.shards
        self.max_deliveries = options.max_deliveries
        self.claim_idle_ms = options.claim_idle_ms
        self.name = url.split("://", 1)[1].split("?", 1)[0].strip("/")
        self.state = MemoryState(self.shards, options.dead_letter_maxlen)
        self._open = False

    async def connect(self) -> None:
        if self._open:
            return
        self._open = True
        if self.name:
            state = _NAMED.get(self.name)
            if state is None or len(state.shards) != self.shards:
                state = _NAMED[self.name] = MemoryState(
                    self.shards, self.options.dead_letter_maxlen)
            state.users += 1
            self.state = state

    async def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self.name:
            self.state.users -= 1
            if self.state.users <= 0 and _NAMED.get(self.name) is self.state:
                del _NAMED[self.name]

    async def ping(self) -> None:
        return None

    # ---- ingest -------------------------------------------------------
    async def publish(self, events: Sequence[Event]) -> None:
        """Append to the shard logs; waits while more than ``max_backlog`` entries are kept."""
        if not events:
            return
        state = self.state
        limit = self.options.max_backlog
        while state.backlog > 0 and state.backlog + len(events) > limit:
            await state.ingest_drained.wait(1.0)
        for event in events:
            state.shards[self.shard_of(event)].append(encode(event))
        state.backlog += len(events)
        state.ingest_changed.notify()

    def consumer(
        self, group: str, name: str, *, claim_idle_ms: int | None = None
    ) -> Consumer:
        idle = self.claim_idle_ms if claim_idle_ms is None else claim_idle_ms
        return MemoryConsumer(self, group, name, claim_idle_ms=idle)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return list(self.state.dead)[-limit:][::-1]

    # ---- delivery ----------------------------------------------------
    def _stream(self, key: StreamKey, create: bool = False) -> _DeliveryStream | None:
        stream = self.state.streams.get(key)
        if stream is not None and stream.expires_ms <= _now_ms():
            del self.state.streams[key]
            stream = None
        if stream is None and create:
            stream = self.state.streams[key] = _DeliveryStream(self.options.maxlen)
        return stream

    def _sweep_expired(self) -> None:
        """Drop expired streams and channels (at most every few seconds)."""
        now = _now_ms()
        self.state.next_sweep_ms = now + min(10_000, self.options.ttl * 100)
        for key in [k for k, s in self.state.streams.items() if s.expires_ms <= now]:
            del self.state.streams[key]
        for run in [r for r, c in self.state.controls.items() if c.expires_ms <= now]:
            del self.state.controls[run]

    async def append(
        self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None
    ) -> int:
        stream = self._stream(key, create=True)
        assert stream is not None
        appended = 0
        for event in events:
            if event.seq > stream.last:
                stream.events.append(event)
                stream.last = event.seq
                appended += 1
        if state is not None:
            stream.state = state
        stream.expires_ms = _now_ms() + self.options.ttl * 1000
        if appended:
            self.state.streams_changed.notify()
        if stream.expires_ms - self.options.ttl * 1000 >= self.state.next_sweep_ms:
            self._sweep_expired()
        return appended

    async def load_state(self, key: StreamKey) -> bytes | None:
        stream = self._stream(key)
        return None if stream is None else stream.state

    def _after(self, key: StreamKey, after: int, limit: int) -> list[Event]:
        stream = self._stream(key)
        if stream is None or stream.last <= after:
            return []
        newer: list[Event] = []
        for event in reversed(stream.events):  # O(new events), not O(stream length)
            if event.seq <= after:
                break
            newer.append(event)
        newer.reverse()
        return newer[:limit]

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        return self._after(key, after, limit)

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        stream = self._stream(key)
        if stream is None or not stream.events:
            return None
        return stream.events[0].seq, stream.events[-1].seq

    async def tail(
        self, cursors: Mapping[StreamKey, int], block_ms: int = 1000
    ) -> list[tuple[StreamKey, Event]]:
        deadline = _now_ms() + block_ms
        while True:
            found = [
                (key, event)
                for key, cursor in cursors.items()
                for event in self._after(key, cursor, 1000)
            ]
            remaining = deadline - _now_ms()
            if found or remaining <= 0:
                return found
            await self.state.streams_changed.wait(remaining / 1000)

    # ---- control -----------------------------------------------------
    def _channel(self, run_id: str) -> _ControlChannel:
        channel = self.state.controls.get(run_id)
        if channel is None or channel.expires_ms <= _now_ms():
            channel = self.state.controls[run_id] = _ControlChannel()
        return channel

    async def send_control(self, command: ControlCommand) -> None:
        channel = self._channel(command.run_id)
        channel.entries.append((channel.next_id, command))
        channel.next_id += 1
        channel.expires_ms = _now_ms() + self.options.ttl * 1000
        channel.changed.notify()

    async def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        channel = self._channel(run_id)
        position = channel.next_id - 1 if after == "$" else int(after.split("-", 1)[0])
        while True:
            channel = self._channel(run_id)
            fresh = [(i, c) for i, c in channel.entries if i > position]
            for entry_id, command in fresh:
                position = entry_id
                yield command
            if not fresh:
                await channel.changed.wait(1.0)


class MemoryConsumer(Consumer):
    """A member of a consumer group of a :class:`MemoryBus` (see the module docstring)."""

    def __init__(self, bus: MemoryBus, group: str, name: str, *, claim_idle_ms: int) -> None:
        self.bus = bus
        self.group = group
        self.name = name
        self.claim_idle_ms = claim_idle_ms
        self._group = bus.state.group(group)
        self._owned: set[int] = set()
        self._joined = False
        self._closed = False
        self._own_pending_read = False

    def owned_shards(self) -> frozenset[int]:
        return frozenset(self._owned)

    def _join(self) -> None:
        if not self._joined:
            self._group.members[self.name] = self._group.members.get(self.name, 0) + 1
            self._joined = True
            self.bus.state.ingest_changed.notify()

    def _rebalance(self) -> None:
        group, shards = self._group, self.bus.shards
        desired = group.desired(self.name, shards)
        for shard in list(self._owned - desired):
            if group.leases.get(shard) == self.name:
                del group.leases[shard]
            self._owned.discard(shard)
        for shard in desired:
            holder = group.leases.get(shard)
            if holder is None or holder not in group.members or holder == self.name:
                group.leases[shard] = self.name
                self._owned.add(shard)

    async def fetch(self, max_count: int = 512, block_ms: int = 1000) -> list[Delivery]:
        if self._closed:
            raise RuntimeError("consumer is closed")
        self._join()
        deadline = _now_ms() + block_ms
        while True:
            self._rebalance()
            out = self._collect(max_count)
            remaining = deadline - _now_ms()
            if out or remaining <= 0:
                return out
            wait = min(remaining, self._next_claim_in())
            await self.bus.state.ingest_changed.wait(max(wait, 1) / 1000)

    def _collect(self, max_count: int) -> list[Delivery]:
        out: list[Delivery] = []
        if not self._own_pending_read and self._owned:
            self._own_pending_read = True
            out += self._take_pending(max_count, mine_only=True)
        out += self._take_pending(max_count - len(out), mine_only=False)
        out += self._take_new(max_count - len(out))
        return out

    def _take_pending(self, limit: int, *, mine_only: bool) -> list[Delivery]:
        """Own pending entries (after a restart) or entries idle past ``claim_idle_ms``."""
        out: list[Delivery] = []
        now = _now_ms()
        for shard in sorted(self._owned):
            group_shard = self._group.shards[shard]
            for entry_id in sorted(group_shard.pending):
                if len(out) >= limit:
                    return out
                pending = group_shard.pending[entry_id]
                if mine_only:
                    if pending.consumer != self.name:
                        continue
                elif now - pending.delivered_ms < self.claim_idle_ms:
                    continue
                delivery = self._redeliver(shard, entry_id, pending, now)
                if delivery is not None:
                    out.append(delivery)
        return out

    def _redeliver(self, shard: int, entry_id: int, pending: _Pending, now: float) -> Delivery | None:
        pending.consumer, pending.delivered_ms = self.name, now
        pending.count += 1
        data = self.bus.state.shards[shard].get(entry_id)
        if data is None:  # cannot happen while unacked; drop the stale reference
            del self._group.shards[shard].pending[entry_id]
            return None
        delivery = Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data,
                            deliveries=pending.count)
        if pending.count > self.bus.max_deliveries:
            self._dead_letter_now(delivery, f"delivered {pending.count} times without an ack "
                                  f"(max_deliveries={self.bus.max_deliveries})")
            return None
        return delivery

    def _take_new(self, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        if limit <= 0 or not self._owned:
            return out
        now = _now_ms()
        per_shard = -(-limit // len(self._owned))  # fair: a busy shard can't starve the rest
        for shard in sorted(self._owned):
            group_shard = self._group.shards[shard]
            if limit - len(out) <= 0:
                break
            if any(p.consumer != self.name for p in group_shard.pending.values()):
                continue  # a previous owner's entries come first (per-run order)
            for entry_id, data in self.bus.state.shards[shard].after(
                group_shard.last_delivered, min(per_shard, limit - len(out))
            ):
                group_shard.pending[entry_id] = _Pending(self.name, now, 1)
                group_shard.last_delivered = entry_id
                out.append(Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data))
        return out

    def _next_claim_in(self) -> float:
        """Milliseconds until some pending entry on an owned shard becomes claimable."""
        now, soonest = _now_ms(), float("inf")
        for shard in self._owned:
            for pending in self._group.shards[shard].pending.values():
                soonest = min(soonest, pending.delivered_ms + self.claim_idle_ms - now)
        return soonest

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        touched: set[int] = set()
        for delivery in deliveries:
            entry_id = int(delivery.entry_id.split("-", 1)[0])
            if self._group.shards[delivery.shard].pending.pop(entry_id, None) is not None:
                touched.add(delivery.shard)
        for shard in touched:
            self.bus.state.trim(shard)
        if touched:
            self.bus.state.ingest_changed.notify()

    def _dead_letter_now(self, delivery: Delivery, reason: str) -> None:
        self.bus.state.dead.append(DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.group,
        ))
        log.warning("dead-lettered entry %s of shard %d in group %s: %s",
                    delivery.entry_id, delivery.shard, self.group, reason)
        entry_id = int(delivery.entry_id.split("-", 1)[0])
        self._group.shards[delivery.shard].pending.pop(entry_id, None)
        self.bus.state.trim(delivery.shard)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._dead_letter_now(delivery, reason)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        group = self._group
        if self._joined:
            left = group.members.get(self.name, 1) - 1
            if left <= 0:
                group.members.pop(self.name, None)
                for shard in self._owned:
                    if group.leases.get(shard) == self.name:
                        del group.leases[shard]
            else:
                group.members[self.name] = left
        self._owned.clear()
        self.bus.state.ingest_changed.notify()
