"""The Kafka bus's hot tier: delivery streams held in process memory, bounded.

Kafka can't read one run's records out of a shared partition without
scanning it, and a resume must not cost a scan of a shared stream, so every :class:`~runwire.bus.kafka.bus.KafkaBus`
that reads delivery streams keeps this cache, fed by one multiplexed tail of
the delivery topic (and by its own appends, written through). The edge
resumes from here and falls back to the replay log for anything older
than :meth:`HotStreams.bounds` reports.

Bounds: each stream keeps its last ``maxlen`` events; all streams together
keep at most ``max_events`` (the least recently appended streams lose their
events first, keeping only their last seq and writer state, which are
small); a finished run's stream (its own terminal event added) loses its
events ``grace_s`` seconds after that event, as on Redis; a stream not
appended to for ``ttl_s`` seconds is forgotten.

Records may arrive twice (producer retries without idempotence, a writer
that took over a run re-appending what its predecessor already wrote):
events whose seq is not above the stream's last seq are dropped here, so
readers see every seq once, in order.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping

from ...core.envelope import Event, is_terminal
from ..base import StreamKey, ascending_past, ends_run


class _Stream:
    __slots__ = ("ended", "events", "last", "state", "touched")

    def __init__(self, maxlen: int) -> None:
        self.events: deque[Event] = deque(maxlen=maxlen)
        self.last = 0
        self.state: bytes | None = None
        self.touched = time.time()
        self.ended: float | None = None
        """When the run's own terminal event was appended (epoch seconds)."""


class HotStreams:
    """Delivery streams in memory, deduplicated by seq and bounded (see module docs)."""

    def __init__(self, *, maxlen: int, max_events: int, ttl_s: float,
                 grace_s: float | None = None) -> None:
        self.maxlen = maxlen
        self.max_events = max_events
        self.ttl_s = ttl_s
        self.grace_s = ttl_s if grace_s is None else grace_s
        self._ended: dict[StreamKey, float] = {}
        """Finished streams still holding events → when they ended."""
        self._streams: OrderedDict[StreamKey, _Stream] = OrderedDict()
        self._held = 0
        self._waiters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def held_events(self) -> int:
        return self._held

    def _live(self, key: StreamKey) -> _Stream | None:
        """The stream, unless it is unknown or expired (then it is forgotten)."""
        stream = self._streams.get(key)
        if stream is None:
            return None
        now = time.time()
        if stream.touched < now - self.ttl_s:
            self._held -= len(stream.events)
            del self._streams[key]
            self._ended.pop(key, None)
            return None
        if stream.ended is not None and stream.ended < now - self.grace_s and stream.events:
            self._held -= len(stream.events)  # finished: history is the replay log's now
            stream.events.clear()
            self._ended.pop(key, None)
        return stream

    def _stream(self, key: StreamKey, at: float | None) -> _Stream:
        """The stream to write to, touched at ``at`` (the record's time; default now)."""
        stream = self._live(key)
        if stream is None:
            stream = self._streams[key] = _Stream(self.maxlen)
        when = time.time() if at is None else at
        if when >= stream.touched:
            stream.touched = when
            self._streams.move_to_end(key)
        return stream

    def last_seq(self, key: StreamKey) -> int:
        stream = self._live(key)
        return 0 if stream is None else stream.last

    def state(self, key: StreamKey) -> bytes | None:
        stream = self._live(key)
        return None if stream is None else stream.state

    def add(self, key: StreamKey, events: Iterable[Event], at: float | None = None, *,
            ascending: bool = False) -> int:
        """Add events above the stream's last seq; returns how many were new.

        ``at``: when they were appended (epoch seconds; default now), for the age bound;
        ``ascending``: the caller's word that ``events`` is a list in ascending seq order (an
        append's events past the last seq it knew of), so that only the first is compared.
        """
        stream = self._stream(key, at)
        if type(events) is list and (events[0].seq > stream.last if ascending and events
                                     else ascending_past(events, stream.last)):  # a writer's usual append
            return self._add_all(key, stream, events, at)
        added = 0
        for event in events:
            if event.seq <= stream.last:
                continue
            if len(stream.events) == stream.events.maxlen:
                self._held -= 1
            stream.events.append(event)
            stream.last = event.seq
            added += 1
            if event.child_id is None and is_terminal(event):
                stream.ended = self._ended[key] = time.time() if at is None else at
        if added:
            self._held += added
            self._evict()
            self._notify()
        return added

    def _add_all(self, key: StreamKey, stream: _Stream, events: list[Event], at: float | None) -> int:
        """:meth:`add` of events all new and in order: no step per event."""
        count, room = len(events), stream.events.maxlen
        dropped = 0 if room is None else max(0, len(stream.events) + count - room)  # pushed out
        stream.events.extend(events)
        stream.last = events[-1].seq
        if ends_run(events):
            stream.ended = self._ended[key] = time.time() if at is None else at
        self._held += count - dropped
        self._evict()
        self._notify()
        return count

    def set_state(self, key: StreamKey, state: bytes, at: float | None = None) -> None:
        self._stream(key, at).state = state

    def read(self, key: StreamKey, after: int, limit: int) -> list[Event]:
        stream = self._live(key)
        if stream is None or stream.last <= after:
            return []
        out: list[Event] = []
        for event in reversed(stream.events):  # newest first: short for live readers
            if event.seq <= after:
                break
            out.append(event)
        out.reverse()
        return out[:limit]

    def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        stream = self._live(key)
        if stream is None or not stream.events:
            return None
        return stream.events[0].seq, stream.events[-1].seq

    def collect(self, cursors: Mapping[StreamKey, int], limit: int = 1000) -> list[tuple[StreamKey, Event]]:
        return [(key, e) for key, cursor in cursors.items() for e in self.read(key, cursor, limit)]

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def changed(self, timeout_s: float) -> None:
        """Return when events are added (or after ``timeout_s``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _evict(self) -> None:
        while self._held > self.max_events:
            for stream in self._streams.values():  # least recently appended first
                if stream.events:
                    self._held -= len(stream.events)
                    stream.events.clear()
                    break
            else:
                return

    def sweep(self) -> int:
        """Drop the events of streams finished longer than ``grace_s`` ago and forget streams
        idle longer than ``ttl_s``; returns how many streams were forgotten."""
        over = time.time() - self.grace_s
        for key in [k for k, ended in self._ended.items() if ended < over]:
            self._live(key)
        cutoff = time.time() - self.ttl_s
        dropped = 0
        while self._streams:
            key, stream = next(iter(self._streams.items()))
            if stream.touched >= cutoff:
                break
            self._held -= len(stream.events)
            del self._streams[key]
            self._ended.pop(key, None)
            dropped += 1
        return dropped
