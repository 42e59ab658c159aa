"""Offline replay jobs on a stored run: export in any format, re-publish with timing.

Both stream a run batch by batch from the replay log, so memory stays bounded
however long the run is. :func:`export_chunks` is the one export: ``runwire replay
export`` writes it (:func:`export_run`) and the edge's ``GET /v1/runs/{id}/events.jsonl``
streams it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal

import msgspec

from ..bus.ports import IngestLog
from ..core import envelope
from ..core.envelope import ChildSpawn, Event, Gap
from ..core.ulid import MonotonicULID
from ..processing.shaping import DeltaCoalescer
from ..protocols import egress
from ..store.ports import RunHistory

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


async def export_chunks(
    log: RunHistory, run_id: str, *, format: str = "koder", detail: Detail = "full"
) -> AsyncIterator[tuple[bytes, int]]:
    """One run as JSON lines of ``format`` (one frame a line), in chunks: ``(bytes, raw events
    read for them)``.

    ``koder`` at ``detail=full`` streams the stored canonical bytes as they
    are; any other format or ``detail=shaped`` decodes, shapes (the same
    pure function the workers use) and encodes with a fresh egress codec,
    whose closing frames end a run stored without its terminal event.
    """
    if format == "koder" and detail == "full":
        async for chunk, lines in log.iter_jsonl(run_id):
            yield chunk, lines
        return
    codec = egress(format)
    read = 0

    async def counted() -> AsyncIterator[Event]:
        nonlocal read
        async for event in log.iter_events(run_id):
            read += 1
            yield event

    source = _shaped(counted()) if detail == "shaped" else counted()
    pending: list[bytes] = []
    reported = 0
    terminal = False
    async for event in source:
        pending += [frame + b"\n" for frame in codec.encode(event)]
        terminal = envelope.is_terminal(event) and event.child_id is None
        if read - reported >= CHUNK_EVENTS:
            yield b"".join(pending), read - reported
            pending, reported = [], read
    if not terminal:
        pending += [msgspec.json.encode(frame) + b"\n" for frame in codec.finish()]
    if pending or read > reported:
        yield b"".join(pending), read - reported


CHUNK_EVENTS = 2000
"""Raw events read for one chunk of a re-encoded export (progress is reported a chunk at a time)."""


async def export_run(
    log: RunHistory,
    run_id: str,
    out: Callable[[bytes], object],
    *,
    format: str = "koder",
    detail: Detail = "full",
    progress: Progress = lambda _: None,
) -> int:
    """Write :func:`export_chunks` of one run to ``out``; returns the raw events read."""
    count = 0
    async for chunk, events in export_chunks(log, run_id, format=format, detail=detail):
        out(chunk)
        count += events
        progress(events)
    return count


def republished(event: Event, run_id: str, seq: int, ids: MonotonicULID) -> Event:
    """A stored event as a fresh publisher event of ``run_id``: new id, seq and time."""
    return envelope.replace(
        event, run_id=run_id, seq=seq, id=ids.new(), ts=envelope.now_ts(),
        parent_id=None, root_id=None, span=None,
    )


class _Tree:
    """The played tree: each original run's new id, its parent, and its next publisher seq."""

    def __init__(self, log: RunHistory, run_id: str, target: str) -> None:
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
    log: RunHistory,
    bus: IngestLog,
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


async def _publish(bus: IngestLog, events: Sequence[Event], progress: Progress) -> None:
    await bus.publish(events)
    progress(len(events))
