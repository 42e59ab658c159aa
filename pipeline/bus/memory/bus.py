"""``memory://`` — the bus in one process, with the same semantics as Redis.

Its state is :mod:`runwire.bus.memory.state`, its consumer
:mod:`runwire.bus.memory.consumer`.

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

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ...core.envelope import Event
from ..base import (
    Bus,
    Consumer,
    ControlCommand,
    DeadLetter,
    Routed,
    StreamKey,
    ascending_past,
    encoded,
)
from ..keys import shard_for
from ..options import split_url
from .consumer import MemoryConsumer
from .state import ControlChannel, DeliveryStream, MemoryState, now_ms

ACCEPTED_OPTIONS = (
    "shards", "maxlen", "ttl", "claim_idle_ms", "lease_ms", "max_deliveries", "max_backlog",
    "dead_letter_maxlen",
)

__all__ = ["MemoryBus", "MemoryConsumer", "MemoryState"]


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
    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None:
        """Append to the shard logs (``data``: the events' bytes, kept as they are); waits while
        more than ``max_backlog`` entries are kept."""
        if not events:
            return
        data = encoded(events, data)
        state = self.state
        limit = self.options.max_backlog
        while state.backlog > 0 and state.backlog + len(events) > limit:
            await state.ingest_drained.wait(1.0)
        shards, count = state.shards, self.shards
        of_root: dict[str, int] = {}  # a batch is mostly one run's or a few: each hashed once
        for event, line in zip(events, data, strict=True):
            root = event.root_id or event.run_id
            shard = of_root.get(root)
            if shard is None:
                shard = of_root[root] = shard_for(root, count)
            shards[shard].append(line)
        state.backlog += len(events)
        state.ingest_changed.notify()

    def consumer(
        self, group: str, name: str, *, claim_idle_ms: int | None = None
    ) -> Consumer:
        idle = self.claim_idle_ms if claim_idle_ms is None else claim_idle_ms
        return MemoryConsumer(self.state, group, name, claim_idle_ms=idle,
                              max_deliveries=self.max_deliveries)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return list(self.state.dead)[-limit:][::-1]

    # ---- delivery ----------------------------------------------------
    def _stream(self, key: StreamKey, create: bool = False) -> DeliveryStream | None:
        stream = self.state.streams.get(key)
        if stream is not None and stream.expires_ms <= now_ms():
            del self.state.streams[key]
            stream = None
        if stream is None and create:
            stream = self.state.streams[key] = DeliveryStream(self.options.maxlen)
        return stream

    def _sweep_expired(self) -> None:
        """Drop expired streams and channels (at most every few seconds)."""
        now = now_ms()
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
        if ascending_past(events, stream.last):  # a worker's write: all new, in order
            stream.events.extend(events)
            stream.last, appended = events[-1].seq, len(events)
        else:
            appended = 0
            for event in events:
                if event.seq > stream.last:
                    stream.events.append(event)
                    stream.last = event.seq
                    appended += 1
        if state is not None:
            stream.state = state
        stream.expires_ms = now_ms() + self.options.ttl * 1000
        if appended:
            self.state.streams_changed.notify()
        if stream.expires_ms - self.options.ttl * 1000 >= self.state.next_sweep_ms:
            self._sweep_expired()
        return appended

    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]:
        return [None if (stream := self._stream(key)) is None else stream.state for key in keys]

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
        deadline = now_ms() + block_ms
        while True:
            found = [
                (key, event)
                for key, cursor in cursors.items()
                for event in self._after(key, cursor, 1000)
            ]
            remaining = deadline - now_ms()
            if found or remaining <= 0:
                return found
            await self.state.streams_changed.wait(remaining / 1000)

    # ---- control -----------------------------------------------------
    def _channel(self, run_id: str) -> ControlChannel:
        channel = self.state.controls.get(run_id)
        if channel is None or channel.expires_ms <= now_ms():
            channel = self.state.controls[run_id] = ControlChannel()
        return channel

    async def send_control(self, command: ControlCommand) -> None:
        channel = self._channel(command.run_id)
        channel.entries.append((channel.next_id, command))
        channel.next_id += 1
        channel.expires_ms = now_ms() + self.options.ttl * 1000
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
