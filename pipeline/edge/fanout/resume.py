"""History for a resuming client: the hot delivery stream, else the replay log.

A client resuming after seq ``c`` while the live position is ``P`` needs
exactly the events in ``(c, P]``. The hub captured ``P`` *before* any history
is read and buffers live events after ``P`` in the client's queue; the
session writes history up to ``P`` and then the buffer, skipping any seq it
already sent (capture the position, buffer live events, dedupe on seq). This module only reads
``(c, P]``:

* from the hot delivery stream while it still covers ``c + 1``;
* else from the replay log: the raw view as stored; the shaped view
  recomputed (:func:`runwire.processing.shaping.shape`, a pure function of the raw
  events) for just the stretch the hot tier no longer has, then the hot
  tier again;
* else it raises :class:`~runwire.core.errors.ReplayExpired`
  (``KAI-STREAM-CONN-0002``): recovery is all or nothing, never a partial
  replay presented as complete.

"Covers" is by the events' spans: the shaped view's spans tile the seq space
(:mod:`runwire.processing.shaping`), so its first event after ``c`` has ``span[0] <= c + 1``
unless events after ``c`` were trimmed — windows of children streaming at once
are never taken for a hole.

Recomputing a stretch ``(c, u]`` of the shaped view costs the stretch, not the
run: every shaping window is closed after a non-delta event (Koder agent stream
§4 R3), so shaping starts at the last non-delta event at or before ``c`` and
reads the raw events until the shaped event at ``u`` is settled — sent by the
same rule that sent it live, not cut short by the end of what was read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec

from ...bus.base import StreamKey
from ...bus.ports import DeliveryStreams
from ...core import envelope
from ...core.envelope import Event, RunLifecycle
from ...core.errors import ReplayExpired, StoreUnavailable
from ...processing.shaping import DeltaCoalescer, is_delta
from ...store.ports import RunHistory

log = logging.getLogger(__name__)

FIRST_BATCH = 32
HOT = "hot"
LOG = "log"
RESHAPE_BATCH = 256
"""Raw events read at a time when recomputing a stretch of the shaped view."""
SETTLE_ATTEMPTS = 6
"""Reads of the replay log until a recomputed stretch is settled (50 ms, 100 ms … apart: about a
second): workers write the log and the views concurrently, so the log may lag the hot tier."""


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


async def probe(bus: DeliveryStreams, store: RunHistory, key: StreamKey) -> Probe:
    """The state of a delivery stream: its tail, whether and where the run ended, whether it exists.

    A stream the hot tier holds is probed from the hot tier alone while the replay log is
    unavailable (its tail, and its end from its last event): resumes it covers go on. Without
    one, the log's :class:`~runwire.core.errors.StoreUnavailable` is raised (retriable: 503 with
    ``Retry-After`` before a response starts)."""
    bounds = await bus.bounds(key)
    try:
        info = await store.run(key[0])
    except StoreUnavailable:
        if bounds is None:
            raise
        info = None
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


async def needs_log(bus: DeliveryStreams, key: StreamKey, after: int) -> bool:
    """Whether :func:`history` after ``after`` starts in the replay log (the hot tier does not
    cover ``after + 1``)."""
    found = await bus.read(key, after, limit=1)
    return not (found and first_covered(found[0]) <= after + 1)


def first_covered(event: Event) -> int:
    """The first seq an event accounts for (a shaped event's span start; else its seq)."""
    return event.span[0] if event.span else event.seq


async def history(
    bus: DeliveryStreams, store: RunHistory, key: StreamKey, after: int, upto: int, batch: int = 1000
) -> AsyncIterator[tuple[str, list[Event]]]:
    """Batches ``(source, events)`` of a delivery stream with ``after < seq <= upto``.

    The first batch is small and batches then double up to ``batch``, so a
    resuming client gets its first event after one short read.
    """
    position = after
    size = min(FIRST_BATCH, batch)
    while position < upto:
        found = await bus.read(key, position, limit=size)
        size = min(size * 2, batch)
        if found and first_covered(found[0]) <= position + 1:
            events = [e for e in found if e.seq <= upto]
            if not events:  # the next event is past upto: nothing is in between
                return
            yield HOT, events
            position = events[-1].seq
            continue
        if key[1] == "raw":
            async for chunk in _from_log(store, key[0], position, upto, batch):
                yield LOG, chunk
            return
        # the shaped view: recompute what the hot tier lacks, then back to the hot tier
        end = min(upto, first_covered(found[0]) - 1) if found else upto
        async for chunk in shaped_from_log(store, key[0], position, end):
            yield LOG, chunk
        position = end


async def _from_log(
    store: RunHistory, run_id: str, after: int, upto: int, batch: int
) -> AsyncIterator[list[Event]]:
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


async def shaped_from_log(store: RunHistory, run_id: str, after: int, upto: int) -> AsyncIterator[list[Event]]:
    """The shaped view's events with ``after < seq <= upto``, recomputed from the replay log, in
    pieces as they are settled (``RESHAPE_BATCH`` raw events at a time: a reader that has what it
    needs stops the reading).

    ``upto`` is a seq the shaped view has (or the run's last): the result is
    what the live path sent there. Shaping starts at the last non-delta event
    at or before ``after`` and reads on until the event at ``upto`` is
    settled; a log that lags the live position is read on for about a
    second, and then what it has is shaped to its end.
    """
    start = await _reset_point(store, run_id, after)
    coalescer = DeltaCoalescer(floor=start, fed=start)
    position, attempt = start, 0
    while True:
        raw = await store.read(run_id, after=position, limit=RESHAPE_BATCH)
        if position == start and (not raw or raw[0].seq != start + 1):
            if attempt == SETTLE_ATTEMPTS - 1:
                raise _expired(run_id, after)
            attempt += 1
            await asyncio.sleep(0.05 * attempt)
            continue
        shaped: list[Event] = []
        settled = False
        for event in raw:
            coalescer.feed_into(event, shaped)
            if coalescer.floor >= upto:
                settled = True
                break
        piece = [e for e in shaped if after < e.seq <= upto]
        if piece:
            yield piece
        if settled:
            return
        if raw:
            position = raw[-1].seq
        if len(raw) == RESHAPE_BATCH:
            continue
        # The log ends before the event at upto is settled: it may lag the live position.
        if attempt == SETTLE_ATTEMPTS - 1:
            log.warning("run %s: the replay log ends before the shaped event at seq %d is settled; "
                        "shaping what it has", run_id, upto)
            piece = [e for e in coalescer.flush() if after < e.seq <= upto]
            if piece:
                yield piece
            return
        attempt += 1
        await asyncio.sleep(0.05 * attempt)


async def _reset_point(store: RunHistory, run_id: str, after: int) -> int:
    """The seq of the last non-delta raw event at or before ``after`` (0: none; shape from the start)."""
    high, width = after, 64
    while high > 0:
        low = max(0, high - width)
        for event in reversed(await store.read(run_id, after=low, limit=high - low)):
            if event.seq <= high and not is_delta(event):
                return event.seq
        high, width = low, width * 4
    return 0


def _expired(run_id: str, after: int) -> ReplayExpired:
    return ReplayExpired(
        f"cannot resume run {run_id!r} after seq {after}: the replay window has expired"
    )
