"""Offline replay jobs on a stored run: export in any format, re-publish with timing.

Both stream a run batch by batch from the replay log, so memory stays bounded
however long the run is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal

import msgspec

from ..bus.base import Bus
from ..core import envelope
from ..core.envelope import ChildSpawn, Event, Gap
from ..core.ulid import MonotonicULID
from ..processing.shaping import DeltaCoalescer
from ..protocols import egress
from ..store.base import ReplayLog

Detail = Literal["full", "shaped"]
Progress = Callable[[int], object]
"""Called with how many more events were handled."""


async def _shaped(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    coalescer = DeltaCoalescer(fed=0)  # what shaping.shape does, a batch at a time
    async for event in events:
        for shaped in coalescer.feed(event):
            yield shaped
    for shaped in coalescer.flush():
        yield shaped


async def export_run(
    log: ReplayLog,
    run_id: str,
    out: Callable[[bytes], object],
    *,
    format: str = "koder",
    detail: Detail = "full",
    progress: Progress = lambda _: None,
) -> int:
    """Write one run as JSON lines of ``format`` (one frame a line); returns raw events read.

    ``koder`` at ``detail=full`` streams the stored canonical bytes as they
    are; any other format or ``detail=shaped`` decodes, shapes (the same
    pure function the workers use) and encodes with a fresh egress codec.
    """
    if format == "koder" and detail == "full":
        count = 0
        async for chunk, lines in log.iter_jsonl(run_id):
            out(chunk)
            count += lines
            progress(lines)
        return count
    codec = egress(format)
    counter = _Counter(progress)
    events = counter.wrap(log.iter_events(run_id))
    source = _shaped(events) if detail == "shaped" else events
    terminal = False
    async for event in source:
        for frame in codec.encode(event):
            out(frame + b"\n")
        terminal = envelope.is_terminal(event) and event.child_id is None
    if not terminal:
        for frame in codec.finish():
            out(msgspec.json.encode(frame) + b"\n")
    counter.done()
    return counter.total


class _Counter:
    """Counts events passing through and reports progress every few thousand."""

    def __init__(self, progress: Progress, every: int = 2000) -> None:
        self.progress, self.every = progress, every
        self.total = self._reported = 0

    async def wrap(self, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        async for event in events:
            self.total += 1
            if self.total - self._reported >= self.every:
                self.done()
            yield event

    def done(self) -> None:
        self.progress(self.total - self._reported)
        self._reported = self.total


def republished(event: Event, run_id: str, seq: int, ids: MonotonicULID) -> Event:
    """A stored event as a fresh publisher event of ``run_id``: new id, seq and time."""
    return envelope.replace(
        event, run_id=run_id, seq=seq, id=ids.new(), ts=envelope.now_ts(),
        parent_id=None, root_id=None, span=None,
    )


class _Tree:
    """The played tree: each original run's new id, its parent, and its next publisher seq."""

    def __init__(self, log: ReplayLog, run_id: str, target: str) -> None:
        self.log = log
        self.root, self.target = run_id, target
        self.parents: dict[str, str] = {}
        self.seqs: dict[str, int] = {}

    def new_id(self, original: str) -> str:
        """``--as`` renames the tree: ``root-child`` of ``root`` played as ``copy`` is ``copy-child``."""
        if original == self.root:
            return self.target
        if self.target == self.root:
            return original
        if original.startswith(self.root):
            return self.target + original[len(self.root):]
        return f"{self.target}.{original}"

    async def parent_of(self, origin: str) -> str:
        parent = self.parents.get(origin)
        if parent is None:  # no child.spawn seen: the child's own metadata, else the root
            info = await self.log.run(origin)
            parent = info.parent_id if info is not None and info.parent_id else self.root
            self.parents[origin] = parent
        return parent

    async def play(self, event: Event, ids: MonotonicULID) -> Event:
        origin = event.child_id or self.root
        seq = self.seqs[origin] = self.seqs.get(origin, 0) + 1
        if isinstance(event, ChildSpawn):
            self.parents.setdefault(event.payload.child_id, origin)
            event = envelope.replace(event, payload=msgspec.structs.replace(
                event.payload, child_id=self.new_id(event.payload.child_id)))
        played = republished(envelope.replace(event, child_id=None), self.new_id(origin), seq, ids)
        if origin == self.root:
            return played
        parent = self.new_id(await self.parent_of(origin))
        return envelope.replace(played, parent_id=parent, root_id=self.target)


async def play_run(
    log: ReplayLog,
    bus: Bus,
    run_id: str,
    *,
    as_run: str | None = None,
    speed: float = 1.0,
    batch: int = 500,
    progress: Progress = lambda _: None,
) -> int:
    """Re-publish a stored run — its whole tree — onto ``bus`` with its original relative timing.

    The run's own events go out under ``as_run`` (default: the same run id),
    re-sequenced from 1 as a publisher would. Its children's and
    grandchildren's events (fanned into its stream with ``child_id``) go out
    as events of those runs again — ids derived from ``as_run``, parents and
    root set, ``child.spawn`` naming the new ids — so the workers fan them
    into the played run exactly as into the original, and the played run
    matches it event for event. The workers' ``x.gap`` markers are left out
    (the workers re-create them). ``speed`` scales time (2 = twice as fast,
    0 = no waiting). Returns the number of events published.
    """
    tree = _Tree(log, run_id, as_run or run_id)
    ids = MonotonicULID("evt_")
    start = time.monotonic()
    first_ms: int | None = None
    pending: list[Event] = []
    sent = 0
    async for event in log.iter_events(run_id):
        if isinstance(event, Gap):
            continue
        moment = envelope.ts_ms(event.ts)
        if first_ms is None:  # the clock starts at the first event, not at the first read
            first_ms, start = moment, time.monotonic()
        wait = (moment - first_ms) / 1000 / speed if speed > 0 else 0.0
        delay = wait - (time.monotonic() - start)
        if pending and (delay > 0.005 or len(pending) >= batch):
            await _publish(bus, pending, progress)
            pending = []
            delay = wait - (time.monotonic() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(await tree.play(event, ids))
        sent += 1
    if pending:
        await _publish(bus, pending, progress)
    return sent


async def _publish(bus: Bus, events: Sequence[Event], progress: Progress) -> None:
    await bus.publish(events)
    progress(len(events))
