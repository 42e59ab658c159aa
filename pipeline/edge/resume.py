"""History for a resuming client: the hot delivery stream, else the replay log.

A client resuming after seq ``c`` while the live position is ``P`` needs
exactly the events in ``(c, P]``. The hub captured ``P`` *before* any history
is read and buffers live events after ``P`` in the client's queue; the
session writes history up to ``P`` and then the buffer, skipping any seq it
already sent (capture the position, buffer live events, dedupe on seq). This module only reads
``(c, P]``:

* from the hot delivery stream while it still covers ``c + 1``;
* else from the replay log (raw view as stored; the shaped view recomputed
  with :func:`pipeline.shaping.shape`, a pure function of the raw events);
* else it raises :class:`~pipeline.errors.ReplayExpired`
  (``KAI-STREAM-CONN-0002``): recovery is all or nothing, never a partial
  replay presented as complete.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec

from .. import envelope
from ..bus.base import Bus, StreamKey
from ..envelope import Event, RunLifecycle
from ..errors import ReplayExpired
from ..store.base import ReplayLog

FIRST_BATCH = 32
HOT = "hot"
LOG = "log"


class Probe(msgspec.Struct, kw_only=True):
    """Where a delivery stream is, from the hot tier and the replay log (one look, no subscription)."""

    tail: int
    """The last seq there is (0 for none)."""
    end_seq: int | None = None
    """The seq of the run's own terminal ``run.lifecycle`` when the run has ended."""
    end_state: str | None = None
    published: bool = False
    """The run has events somewhere (either view, hot tier or replay log)."""
    idle_s: float = 0.0
    """Seconds since the replay log last saw the run (0 when it has not)."""


async def probe(bus: Bus, store: ReplayLog, key: StreamKey) -> Probe:
    """The state of a delivery stream: its tail, whether and where the run ended, whether it exists."""
    bounds = await bus.bounds(key)
    info = await store.run(key[0])
    # With no delivery stream yet, the replay log's last seq is where the stream starts. It is a raw
    # seq: for the shaped view it is a window boundary only once the run has ended (its terminal
    # event flushed every window, Koder agent stream §4 R3). A worker may log a write before it
    # appends the shaped view, so a live run's shaped stream starts at 0 and takes the worker's own
    # windows as they come.
    logged = info.last_seq if info and not bounds and (key[1] == "raw" or info.terminal) else 0
    tail = max(bounds[1] if bounds else 0, logged)
    found = Probe(tail=tail, published=bounds is not None or info is not None)
    if info is not None and info.updated_at is not None:
        found.idle_s = max(0.0, time.time() - info.updated_at.timestamp())
    if info is not None and info.terminal:
        found.end_seq, found.end_state = info.last_seq, info.state
    elif bounds is not None:
        last = await bus.read(key, bounds[1] - 1, limit=1)
        if last and last[0].child_id is None and envelope.is_terminal(last[0]):
            assert isinstance(last[0], RunLifecycle)
            found.end_seq, found.end_state = last[0].seq, last[0].payload.state
    if not found.published and key[1] != "raw":
        found.published = await bus.bounds((key[0], "raw")) is not None
    return found


def first_covered(event: Event) -> int:
    """The first raw seq an event covers (a shaped event's span start)."""
    return event.span[0] if event.span else event.seq


async def history(
    bus: Bus, store: ReplayLog, key: StreamKey, after: int, upto: int, batch: int = 1000
) -> AsyncIterator[tuple[str, list[Event]]]:
    """Batches ``(source, events)`` of a delivery stream with ``after < seq <= upto``.

    The first batch is small and batches then double up to ``batch``, so a
    resuming client gets its first event after one short read.
    """
    position = after
    size = min(FIRST_BATCH, batch)
    while position < upto:
        events = [e for e in await bus.read(key, position, limit=size) if e.seq <= upto]
        size = min(size * 2, batch)
        if not events or first_covered(events[0]) > position + 1:
            async for chunk in _from_log(store, key, position, upto, batch):
                yield LOG, chunk
            return
        yield HOT, events
        position = events[-1].seq


async def _from_log(
    store: ReplayLog, key: StreamKey, after: int, upto: int, batch: int
) -> AsyncIterator[list[Event]]:
    run_id, view = key
    if view == "shaped":
        yield await _shaped_from_log(store, run_id, after, upto)
        return
    position = after
    chunk: list[Event] = []
    async for event in store.iter_events(run_id, after=after, batch=batch):
        if event.seq > upto:
            break
        if not chunk and position == after and event.seq > after + 1:
            raise _expired(run_id, after)
        chunk.append(event)
        position = event.seq
        if len(chunk) >= batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
    if position < upto:
        raise _expired(run_id, after)


async def _shaped_from_log(store: ReplayLog, run_id: str, after: int, upto: int) -> list[Event]:
    from ..shaping import shape

    raw = [e async for e in store.iter_events(run_id) if e.seq <= upto]
    if not raw or raw[0].seq > 1:
        raise _expired(run_id, after)
    return [e for e in shape(raw) if after < e.seq <= upto]


def _expired(run_id: str, after: int) -> ReplayExpired:
    return ReplayExpired(
        f"cannot resume run {run_id!r} after seq {after}: the replay window has expired"
    )
