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

from collections.abc import AsyncIterator

from ..bus.base import Bus, StreamKey
from ..envelope import Event
from ..errors import ReplayExpired
from ..store.base import ReplayLog

FIRST_BATCH = 32
HOT = "hot"
LOG = "log"


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
