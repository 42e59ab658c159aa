"""One batch of a worker: decode → restore checkpoints → process → write.

:class:`Stages` is shared by both worker runtimes — the consumer-group loop
(:mod:`runwire.processing.worker_loop`) and the faust app — so a batch means the same
on every bus. Writes go replay log first, then each stream's shaped events,
then its raw events with its checkpoint; the caller acks only after all of
them are durable, so a crash anywhere replays the batch to the same result
and idempotent appends drop what was already written.

Just over ~400 lines: restoring a stream (the bus's checkpoint, else the replay
log's, with its views rebuilt) shares the batch's retry and write paths.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import msgspec
from redis.backoff import ExponentialWithJitterBackoff

from ..bus import Append, StreamKey
from ..bus.base import Fetched, each_event
from ..bus.keys import shard_for
from ..bus.ports import DeliveryStreams, IngestLog
from ..core.envelope import Event
from ..core.events import is_sub_runs_own
from ..core.lines import encode_lines
from ..core.retry import Outage, Retry
from ..store.base import LogStream
from ..store.ports import RunHistory
from .checkpoint import decode_checkpoint, settle_windows, unsent_windows, window_span
from .fanin import Misrooted
from .intake import decode_batch
from .logged import continued_checkpoint, hot_length, rebuilt_views, retired_checkpoint
from .processor import Processor, StreamOutput

log = logging.getLogger("runwire.worker")

BATCH = 512
"""The faust app's unit of work (its take and merge sizes are multiples of it)."""
FETCH = 2048
"""Entries a consumer-group worker fetches at once. A fetch returns what is there,
up to this, without waiting for more, so a larger batch costs no latency; with a
backlog it is ~30 % more events/s than 512 (fewer round trips and writes)."""
TICK_S = 0.05
RETRY_MAX_S = 2.0
LOAD_CHUNK = 1000
"""Streams whose checkpoints one ``Bus.load_states`` call asks for."""
PENDING_BATCHES = 16
"""At most this many fetched batches are merged into one write while the previous one is in flight
(32,768 entries, as the faust app's ``PENDING_ENTRIES``): under a backlog a write's fixed costs and
the replay log's hand-offs of the GIL are paid once per 32,768 entries (docs/workers.md § Throughput)."""
APPEND_CHUNK = 256
"""Delivery appends sent together (one pipeline on Redis)."""
SETTLE_READ = 100_000
"""Shaped events read past a restored checkpoint (at most one write's: its writer died mid-write)."""
T = TypeVar("T")
RETRY = Retry(ExponentialWithJitterBackoff(cap=RETRY_MAX_S, base=0.025))
"""A worker's writes, loads, fetches and acks: retriable errors (bus or store
unavailable, bus full) are retried without a deadline until the worker stops:
a pause, logged once when it starts and once when it ends (:class:`Outage`)."""


class StageBus(IngestLog, DeliveryStreams, Protocol):
    """What a worker's stages use of the bus: the delivery streams they write, and the ingest
    log a misrouted event is published onto again."""


class EncodedWrite:
    """One write, encoded (see :meth:`Stages.encode`)."""

    __slots__ = ("handed", "log", "raw", "shaped", "taken")

    def __init__(self) -> None:
        self.log: list[LogStream] = []
        self.raw: list[Append] = []
        self.shaped: list[Append] = []
        self.handed: list[tuple[str, Sequence[Event]]] = []
        """The streams :attr:`Stages.on_logged` is told of (none when it is not set)."""
        self.taken: list[Any] = []
        """What :attr:`Stages.on_encoded` returned for the streams it took."""


class WorkerStats(msgspec.Struct, kw_only=True):
    """What one worker did (returned by :func:`run_worker`)."""

    batches: int = 0
    entries: int = 0
    acked: int = 0
    raw: int = 0
    shaped: int = 0
    duplicates: int = 0
    gaps: int = 0
    dead_lettered: int = 0
    rerouted: int = 0
    """Events re-published to their tree's root shard (they named a child run as root)."""
    silenced: int = 0
    foreign: int = 0
    """Events refused, or kept out of an ancestor's stream, because that run is another tenant's."""
    retired: int = 0
    """Events (or fan-in copies) of runs that ended longer ago than the bus keeps checkpoints:
    dropped (``Stages._from_log``)."""
    seconds: float = 0.0
    busy_seconds: float = 0.0
    """From the first fetched batch to the end of the last batch's writes."""
    log_seconds: float = 0.0
    """Time spent waiting for replay log appends (part of ``busy_seconds``)."""
    retried: dict[str, int] = {}
    """Errors retried by state (``{"bus full": 40}``: writes Redis refused at ``maxmemory``)."""
    paused_seconds: float = 0.0
    """Time spent paused on an unavailable or full bus or store."""
    broker_holes: int = 0
    """Holes in an ingest partition's offsets the broker has no record at, passed with an error
    log (the Kafka worker: a broker that lost records)."""
    former_life: int = 0
    """Ingest records stamped in a former life of the broker, dropped (the Kafka worker: copies
    aiokafka sent again into a broker restarted empty; their publishers send them again)."""


_FROM_PROCESSOR = ("duplicates", "gaps", "silenced", "foreign", "retired")
"""The :class:`ProcessorStats` counters a :class:`WorkerStats` reports as they are."""


class Stages:
    """Decode → restore → process → write for one batch; shared by both runtimes.

    ``dead_letter`` moves a poison entry aside (the consumer's, or the faust
    app's dead-letter topic). A stream's checkpoint comes from the bus, else from the
    replay log (the checkpoint of record), for either runtime alike.
    """

    def __init__(
        self,
        bus: StageBus,
        store: RunHistory,
        processor: Processor,
        stop: asyncio.Event,
        *,
        dead_letter: Callable[[Fetched, str], Awaitable[None]],
        on_logged: Callable[[list[tuple[str, Sequence[Event]]], list[Any]], None] | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.processor = processor
        self.stop = stop
        self.stats = WorkerStats()
        self._dead_letter_to = dead_letter
        self.on_logged = on_logged
        """Told once each write is in the replay log: of its streams (``(run_id, events)``) but
        not of a sub-run's own, nor of one :attr:`on_encoded` took, and of what it returned for
        those (``taken``): the span exporter; must not block."""
        self.on_encoded: Callable[[str, Sequence[Event]], Any] | None = None
        """Told of each stream's events as they are encoded, before the log write (the span
        exporter folds them while they are in the CPU's cache, and sends nothing of them before
        :attr:`on_logged`); returns a token if it took them, else None; must not block. Neither
        is told of a sub-run's own stream (its first event the sub-run's own, with a parent):
        only a root run's stream holds a whole span tree, and at a few events a stream the calls
        cost more than the fold."""
        self._first_batch_at: float | None = None
        self.outage = Outage(log)
        self.rebuild: set[str] = set()
        """Streams held when the bus lost its state: their views are dropped and rebuilt from
        the replay log when next loaded (appends made since start past a hole)."""
        self.fence: Callable[[], Awaitable[None]] | None = None
        """Asked before a log or view write is tried again after a failure (the consumer-group runtime:
        :meth:`~runwire.processing.worker_loop.ConsumerLoop._fence`): raises when the shards left."""

    async def prepare(
        self,
        deliveries: Sequence[Fetched],
        before_restore: Callable[[set[str]], Awaitable[None]] | None = None,
        *,
        into: Callable[[], dict[str, StreamOutput]] | None = None,
    ) -> tuple[list[Fetched], dict[str, StreamOutput]]:
        """Decode (dead-lettering poison), restore checkpoints and process; no delivery writes.

        ``before_restore(run_ids)`` runs before the checkpoints of ``run_ids``
        are loaded from the bus (a runtime whose writes to some of those
        streams are still in flight waits for them there). ``into()``, when
        given, is the runtime's unsealed outputs of earlier batches, read after
        ``before_restore``: this batch extends them and they are returned
        unsealed, their checkpoints left to :meth:`write` (see
        :meth:`Processor.process_each`).
        """
        if self._first_batch_at is None:
            self._first_batch_at = time.monotonic()
        self.stats.batches += 1
        good, events, poison, whole = decode_batch(deliveries)
        self.stats.entries += len(events) + len(poison)
        for delivery, bad in poison:
            await self._dead_letter(delivery, f"undecodable: {bad}")
        await self._restore(events, before_restore)
        outputs, failures = self.processor.process_each(
            events, owned=True, into=None if into is None else into())
        rerouted = [error for _, error in failures if isinstance(error, Misrooted)]
        if rerouted:
            await self._reroute(rerouted)
        if whole and failures:  # (their indexes count events)
            good = list[Fetched](each_event(good))
        for index, error in failures:
            if not isinstance(error, Misrooted):
                await self._dead_letter(good[index], f"processing failed: {error!r}")
        failed = {index for index, error in failures if not isinstance(error, Misrooted)}
        if not failed:
            return good, outputs
        return [d for i, d in enumerate(good) if i not in failed], outputs

    async def adopt_silent(self, owned: frozenset[int], shards: int, *, quiet_too: bool = False) -> None:
        """Load unfinished runs of owned shards that went silent, so the silence rule ends them.

        A worker only knows the runs whose events it has seen; a run that was
        already silent when its previous owner died is found in the replay log.
        ``quiet_too`` (after this worker dropped what it held, or took shards
        over): every unfinished run, silent or not — one that went quiet with
        deltas in an open shaping window would otherwise keep them off its
        shaped view until its next event, or its end by the silence rule.
        """
        cutoff = None if quiet_too else datetime.now(UTC) - timedelta(seconds=self.processor.silence_s)
        silent = [info for info in await self.retry(lambda: self.store.runs(until=cutoff, limit=1000))
                  if not info.terminal and not self.processor.holds(info.run_id)
                  and shard_for(info.root_id or info.run_id, shards) in owned]
        states = await self._load_states([info.run_id for info in silent])
        for info, state in zip(silent, states, strict=True):
            seen = info.updated_at.timestamp() if info.updated_at else None
            self.processor.restore(info.run_id, state, raw=await self._spanned(info.run_id, state),
                                   last_activity=seen)

    def busy_until_now(self) -> None:
        if self._first_batch_at is not None:
            self.stats.busy_seconds = time.monotonic() - self._first_batch_at

    async def tick(
        self, caught_up: Callable[[str], bool] | None = None, *, now: float | None = None
    ) -> dict[str, StreamOutput]:
        """Close due shaping windows and end silent runs (as of ``now``, the processor's clock:
        when what was read is known to be all there was); write what that produced."""
        outputs = self.processor.tick(now, caught_up=caught_up)
        if outputs:
            await self.write(outputs)
        return outputs

    async def write(self, outputs: dict[str, StreamOutput]) -> None:
        """Replay log, then shaped views, then raw views with checkpoints; retried until durable.

        The log goes first, so anything a client can see on either view (the
        terminal event included) is already in the replay log — an export or a
        resume from the log right after the end is complete — and a stream's
        checkpoint (stored with its raw append) never runs ahead of the log: a
        batch redone after a crash would otherwise drop the events as
        duplicates before they reached the log. Shaped appends go before the
        raw checkpoints, which record the shaping windows as closed.
        """
        if outputs:
            encoded = self.encode(outputs)
            await self.write_log(encoded)
            await self.write_views(encoded)

    def encode(self, outputs: dict[str, StreamOutput]) -> EncodedWrite:
        """Take the checkpoints and encode every event once, for the log and the views alike."""
        Processor.seal(outputs)
        write = EncodedWrite()
        encoded_now, handed = self.on_encoded, write.handed if self.on_logged is not None else None
        for output in outputs.values():
            encoded = encode_lines(output.raw)
            if handed is not None and not is_sub_runs_own(output.raw):
                token = None if encoded_now is None else encoded_now(output.run_id, output.raw)
                if token is None:
                    handed.append((output.run_id, output.raw))
                else:
                    write.taken.append(token)
            write.log.append((output.run_id, output.raw, encoded, output.state, output.raw_summary()))
            write.raw.append(((output.run_id, "raw"), output.raw, encoded, output.state))
            if output.shaped:
                write.shaped.append(((output.run_id, "shaped"), output.shaped,
                                     encode_lines(output.shaped), None))
        return write

    async def write_log(self, write: EncodedWrite) -> None:
        """The replay-log part of :meth:`write` (first)."""
        await self._append_log(write.log)
        if self.on_logged is not None:
            self.on_logged(write.handed, write.taken)

    async def write_views(self, write: EncodedWrite) -> None:
        """The delivery-stream part of :meth:`write`: shaped views, then raw views with checkpoints."""
        await self._append_many(write.shaped)
        await self._append_many(write.raw)
        self.stats.raw += sum(len(row[1]) for row in write.log)
        self.stats.shaped += sum(len(events) for _, events, _, _ in write.shaped)

    async def _append_log(self, rows: list[LogStream]) -> None:
        """Each run's part carries its raw stream's checkpoint: the log keeps it as the run's
        checkpoint of record (see :meth:`_from_log`)."""
        if any(row[1] for row in rows):
            started = time.monotonic()
            await self.retry(self._fenced(lambda: self.store.append_streams(rows)))
            self.stats.log_seconds += time.monotonic() - started

    async def _append_many(self, appends: list[Append]) -> None:
        """Each key appears once here, so the appends may be sent together.

        Chunks go through ``bus.append_many``: one pipeline on Redis,
        one produce per partition on Kafka, plain calls in memory.
        """
        for start in range(0, len(appends), APPEND_CHUNK):
            chunk = appends[start : start + APPEND_CHUNK]
            await self.retry(self._fenced(functools.partial(self.bus.append_many, chunk)))

    def _fenced(self, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """``call``, each attempt after a failed one preceded by :attr:`fence`: a write held
        through a pause longer than the leases is not made beside the shards' new owner."""
        fence = self.fence
        if fence is None:
            return call
        tried = False

        async def attempt() -> T:
            nonlocal tried
            if tried:
                await fence()
            tried = True
            return await call()
        return attempt

    async def _reroute(self, misrooted: list[Misrooted]) -> None:
        """Re-publish events that claimed a child run as their root, with the true root.

        Their entries are then acked like processed ones: the true root's shard
        has the events (a redelivery re-publishes them, and the sequencer drops
        the copy as a duplicate of its publisher seq).
        """
        for error in misrooted[:1]:
            log.warning("re-publishing %d event(s) to their tree's root shard: %s", len(misrooted), error)
        events = [error.rerouted for error in misrooted]
        await self.retry(lambda: self.bus.publish(events))
        self.stats.rerouted += len(events)

    async def _dead_letter(self, delivery: Fetched, reason: str) -> None:
        log.warning("dead-lettering %s (shard %d): %s", delivery.entry_id, delivery.shard, reason)
        await self.retry(lambda: self._dead_letter_to(delivery, reason))
        self.stats.dead_lettered += 1

    async def _restore(
        self,
        events: Sequence[Event],
        before_restore: Callable[[set[str]], Awaitable[None]] | None = None,
    ) -> None:
        missing = self.processor.missing(events)
        while missing:
            if before_restore is not None:
                await before_restore(missing)
            ordered = sorted(missing)
            for run_id, state in zip(ordered, await self._load_states(ordered), strict=True):
                self.processor.restore(run_id, state, raw=await self._spanned(run_id, state))
            missing = self.processor.missing(events)

    async def _spanned(self, run_id: str, state: bytes | None) -> list[Event]:
        """The raw events a stored checkpoint's shaping windows span (the deltas they hold, which
        a checkpoint does not keep), from the replay log: written first, it holds them."""
        span = window_span(state)
        if span is None:
            return []
        first, last = span
        return await self.retry(functools.partial(self.store.read, run_id, first - 1, last - first + 1))

    async def _load_states(self, run_ids: Sequence[str]) -> list[bytes | None]:
        """The stored checkpoints of streams, in order (None: a new stream).

        The bus's are asked for together (:meth:`Bus.load_states`, one round trip
        per :data:`LOAD_CHUNK` streams). Runs without one are looked up in the replay log
        together (:meth:`_from_log`).
        The bus's checkpoint wins when there is one: the log may run one write
        ahead of the views, and that write, redone from the bus's checkpoint,
        must reach the views.
        """
        states: list[bytes | None] = []
        rebuild = self.rebuild.intersection(run_ids)
        for run_id in rebuild:  # appended to since the bus lost them: rebuilt whole below
            await self.retry(functools.partial(self.bus.drop_views, run_id))
        self.rebuild -= rebuild
        for start in range(0, len(run_ids), LOAD_CHUNK):
            chunk: list[StreamKey] = [(run_id, "raw") for run_id in run_ids[start:start + LOAD_CHUNK]]
            states += await self.retry(functools.partial(self.bus.load_states, chunk))
        new = [run_id for run_id, state in zip(run_ids, states, strict=True) if state is None]
        logged = await self._from_log(new) if new else {}
        for index, (run_id, data) in enumerate(zip(run_ids, states, strict=True)):
            if data is None:
                states[index] = logged.get(run_id)
                continue
            after = unsent_windows(data)
            if after is not None:
                sent = await self.retry(functools.partial(
                    self.bus.read, (run_id, "shaped"), after, limit=SETTLE_READ))
                if sent:
                    states[index] = settle_windows(data, sent)
        return states

    async def _from_log(self, run_ids: Sequence[str]) -> dict[str, bytes]:
        """The replay log's checkpoints of streams the bus has none for (the log is the
        checkpoint of record; :mod:`.logged`).

        A run's checkpoints on the bus expire ``checkpoint_grace_s`` after its
        end (Redis: with its hot streams), and the bus may lose them all (Redis
        restarted empty, flushed, failed over). The replay log, written before
        every checkpoint, keeps each run's latest with its events and tells the
        cases apart. A run it holds as ended since longer than the grace is
        retired — what still comes for it is dropped and counted
        (``retired``), and its streams stay closed (a resume reads the log).
        Any other run it holds a checkpoint for continues from it — same next
        seq, same dedupe, same open windows — and its hot streams are first
        rebuilt from the log (:meth:`_rebuild_views`). A run without one there
        is new (or was logged before the log kept checkpoints) and starts at
        seq 1.
        """
        infos = await self.retry(functools.partial(self.store.logged_runs, run_ids))
        grace = self.bus.checkpoint_grace_s
        ended_before = None if grace is None else datetime.now(UTC) - timedelta(seconds=grace)
        found: dict[str, bytes] = {}
        continued: list[str] = []
        for run_id, info in infos.items():
            if (ended_before is not None and info.terminal and info.updated_at is not None
                    and info.updated_at <= ended_before):
                log.info("run %s ended before %s; what still arrives for it is dropped", run_id,
                         info.updated_at.isoformat(timespec="seconds"))
                found[run_id] = retired_checkpoint(info)
                continue
            data = continued_checkpoint(info)
            if data is not None:
                found[run_id] = data
                continued.append(run_id)
        if continued:
            log.warning("%d stream(s) without a checkpoint on the bus continue from the replay log's"
                        " (e.g. %s); their hot streams are rebuilt from the log", len(continued), continued[0])
            rebuilt = {run_id: found[run_id] for run_id in continued}
            await self._rebuild_views(rebuilt)
            found.update(rebuilt)
        return found

    async def _rebuild_views(self, checkpoints: dict[str, bytes]) -> None:
        """Give streams continued from the log's checkpoint their hot views back, before their new
        events: the logged raw events up to each checkpoint's seq, at most what the hot tier keeps,
        and their shaped view (:func:`.logged.rebuilt_views`, which may settle the checkpoint
        against it: ``checkpoints`` is updated); appends are idempotent on seq."""
        length = hot_length(self.bus)
        appends: list[Append] = []
        for run_id, data in checkpoints.items():
            last = decode_checkpoint(data).sequencer.last_seq
            after = max(0, last - length)
            raw = await self.retry(functools.partial(self.store.read, run_id, after, last - after))
            checkpoints[run_id], views = rebuilt_views(run_id, data, raw)
            appends += views
            if len(appends) >= APPEND_CHUNK:
                await self._append_views(appends)
                appends = []
        await self._append_views(appends)

    async def _append_views(self, appends: list[Append]) -> None:
        await self._append_many([append for append in appends if append[0][1] == "shaped"])
        await self._append_many([append for append in appends if append[0][1] == "raw"])

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` under :data:`RETRY`, until it succeeds or this worker stops."""
        return await self.outage.call(RETRY, call, stop=self.stop.is_set)

    def finish_stats(self) -> WorkerStats:
        stats, counted = self.stats, self.processor.stats
        for name in _FROM_PROCESSOR:  # the processor's counters, under the same names
            setattr(stats, name, getattr(counted, name))
        stats.retried = dict(self.outage.retried)
        stats.paused_seconds = self.outage.paused_seconds
        return stats
