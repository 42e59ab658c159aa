"""One ingest batch → what each delivery stream receives (pure: no I/O).

For every decoded event, in shard order, the :class:`Processor`:

1. learns parent links and finds the event's destinations (:mod:`.fanin`):
   its own run's stream and each ancestor's, with ``child_id`` set;
2. sequences it per destination (:mod:`.sequencing`): delivery seq, dedupe,
   ``x.gap`` on a publisher gap;
3. shapes it per destination (:mod:`.shaping`).

The result per touched stream is a :class:`StreamOutput`: the raw events, the
shaped events and the stream's checkpoint (sequencer + open shaping windows,
:mod:`.checkpoint`).
A runtime writes them in this order — replay log, shaped stream, raw stream
with the checkpoint — and only then acks the ingest entries; each write is
idempotent on seq and the checkpoint only moves with the raw append, so a
crash at any point replays the batch to the identical result.

Before processing, a runtime restores the checkpoint of every stream it has
not seen (:meth:`Processor.missing` → :meth:`Processor.restore`), since a
stream's previous writer may have been another process.

**Silence rule.** A run that has had no event for ``silence_s`` seconds and
no terminal ``run.lifecycle`` gets one, ``state=error`` with the reason
"no events for Ns (agent presumed dead)", so every stream ends
(:meth:`Processor.tick`). Streams that ended are dropped from memory.

Longer than ~400 lines: this is the worker's per-event path — fan-in,
ownership, sequencing and shaping of each event into each destination —
kept in one class on purpose, since every hand-off between objects here is
paid once per event and destination (docs/workers.md, CPU per event).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec import UNSET
from msgspec.structs import replace as replace_struct

from ..core import native
from ..core.envelope import (
    ChildSpawn,
    Envelope,
    Event,
    ReasoningDelta,
    RunLifecycle,
    RunLifecyclePayload,
    TextDelta,
    TextPayload,
    format_ts,
    is_terminal,
    ts_ms,
)
from ..core.errors import WriteRefused
from ..core.events import _TS_CACHE
from ..core.ulid import MonotonicULID
from ..store.runmeta import METERED
from .checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from .fanin import ANY_TENANT, Misrooted, ParentMap
from .sequencing import Sequencer, SequencerState, owns
from .shaping import (
    _KEY_SUFFIX,
    _NO_END,
    WINDOW_MS,
    DeltaCoalescer,
    ShaperState,
    Window,
    _last_seq,
    format_millis,
)

DEFAULT_SILENCE_S = 300.0
_NONE: list[str] = []
"""No ancestors (shared; never mutated)."""
DEFAULT_GRACE_MS = 50
"""Extra wait past a window's end before a live tick closes it (transport latency)."""
DEFAULT_QUIET_S = 0.25
"""A live tick closes a stream's windows only after no event reached the stream for this long.

While a worker works through a backlog (after a takeover, or behind a burst)
a stream's events keep arriving, so its windows close by event time exactly
as :func:`~runwire.processing.shaping.shape` closes them; the tick only speaks for
streams that went quiet, where waiting longer could not change the result."""


def validate(event: Event) -> None:
    """Reject an event the pipeline cannot order or shape (raises MalformedFrame).

    The envelope's pattern admits timestamps such as month 13; shaping needs
    a real instant, so such an event is poison rather than a crash later.
    """
    ts_ms(event.ts)


class StreamOutput(msgspec.Struct, kw_only=True):
    """What one delivery stream receives from a batch."""

    run_id: str
    raw: list[Event] = []  # msgspec gives each instance an empty list of its own
    shaped: list[Event] = []
    state: bytes = b""
    """The stream's checkpoint after this batch (store it with the raw append)."""
    stream: Any = None
    """The in-memory stream, while ``state`` is not taken yet (see :meth:`Processor.seal`)."""
    summary: Any = None
    """What the replay log's run summary reads of ``raw`` (``runwire.core._native.RunSummary``),
    summed by the compiled path as each event is admitted, while in the CPU's caches; None on
    the Python path (:func:`runwire.store.runmeta.summarize_run` reads the events then)."""

    def raw_summary(self) -> Any:
        """:attr:`summary` when it sums all of ``raw``, else None."""
        summary = self.summary
        return summary if summary is not None and summary.count == len(self.raw) else None


def _load_core() -> Any:
    """The compiled per-event path (``runwire.core._native``), told once of the types and
    functions it calls; None where it was not built (or ``RUNWIRE_PURE=1``): this module's
    Python, its twin, runs (docs/workers.md § The compiled core)."""
    core = native.load("core._native", "worker's per-event path")
    if core is not None:
        core.setup(output=StreamOutput, window=Window, text_delta=TextDelta, reasoning_delta=ReasoningDelta,
                   child_spawn=ChildSpawn, run_lifecycle=RunLifecycle, unset=UNSET, replace=replace_struct,
                   is_terminal=is_terminal, format_millis=format_millis, ts_cache=_TS_CACHE,
                   text_suffix=_KEY_SUFFIX[TextDelta], reasoning_suffix=_KEY_SUFFIX[ReasoningDelta],
                   text_payload=TextPayload, no_end=_NO_END, last_seq=_last_seq, metered=METERED,
                   types={"envelope": Envelope, "stream": _Stream, "sequencer_state": SequencerState,
                          "coalescer": DeltaCoalescer, "shaper_state": ShaperState, "output": StreamOutput,
                          "window": Window, "text_delta": TextDelta, "reasoning_delta": ReasoningDelta,
                          "text_payload": TextPayload})
    return core


class ProcessorStats(msgspec.Struct, kw_only=True):
    events: int = 0
    duplicates: int = 0
    gaps: int = 0
    silenced: int = 0
    foreign: int = 0
    """Events refused, or not fanned in, because a run they name belongs to another tenant."""
    retired: int = 0
    """Events (or fan-in copies) dropped because their stream's run ended longer ago than its
    checkpoint is kept (see ``SequencerState.retired``)."""


class _Stream:
    __slots__ = ("coalescer", "last_activity", "output", "route", "run_id", "sequencer", "state")

    def __init__(self, run_id: str, checkpoint: Checkpoint, now: float, window_ms: int,
                 raw: Sequence[Event]) -> None:
        self.run_id = run_id
        self.sequencer = Sequencer(run_id, checkpoint.sequencer)
        self.state = self.sequencer.state
        """The sequencer's state (read on every event)."""
        self.coalescer = DeltaCoalescer(
            checkpoint.shaper, window_ms=window_ms, floor=checkpoint.shaped_seq, raw=raw
        )
        self.last_activity = now
        self.output: StreamOutput | None = None
        """This stream's output in the batch being processed (None between batches)."""
        self.route: tuple[str | None, str | None, str | None, int, list[str]] | None = None
        """The links its run's last event stated (parent, root, tenant), the parent map's
        version then and the chain they gave: a child's events all state the same links,
        so while the map is unchanged its chain is not worked out again."""

    def checkpoint(self, output: StreamOutput) -> bytes:
        """The checkpoint after ``output`` (everything this stream emitted since the last one)."""
        return encode_checkpoint(Checkpoint(
            sequencer=self.sequencer.state, shaper=self.coalescer.state,
            shaped_seq=self.coalescer.floor,
        ))


CORE = _load_core()


class Processor:
    """The worker logic both runtimes share: fan-in, sequencing, shaping, silence."""

    def __init__(
        self,
        *,
        silence_s: float = DEFAULT_SILENCE_S,
        window_ms: int = WINDOW_MS,
        grace_ms: int = DEFAULT_GRACE_MS,
        quiet_s: float = DEFAULT_QUIET_S,
        clock: Callable[[], float] = time.time,
        core: Any = CORE,
    ) -> None:
        self.core = core
        """The compiled per-event path :meth:`process_each` runs, or None: this class's Python
        (its twin: ``tests/workers/test_core.py``)."""
        self.silence_s = silence_s
        self.window_ms = window_ms
        self.grace_ms = grace_ms
        self.quiet_s = quiet_s
        self.clock = clock
        self.parents = ParentMap()
        self.stats = ProcessorStats()
        self._streams: dict[str, _Stream] = {}
        self._restored: set[str] = set()
        """Streams loaded since the last :meth:`process_each` (dropped again if only a misrooted event wanted them)."""
        self._ids = MonotonicULID("evt_")
        self._ended: list[_Stream] = []
        """Streams of ended runs touched by the batch being processed (see :meth:`_finish`)."""
        self._in_place = False
        """Whether the events being processed may be stamped in place (see :meth:`process_each`)."""

    # ---- checkpoints ----------------------------------------------------
    def missing(self, events: Iterable[Event]) -> set[str]:
        """Destination streams of ``events`` whose checkpoint is not loaded yet."""
        wanted: set[str] = set()
        if self.core is not None:  # (the same loop, compiled)
            self.core.missing(self, events, wanted)
            return wanted
        streams = self._streams
        for event in events:
            parent = event.parent_id
            if type(event) is not ChildSpawn:
                if parent is None:  # a root's own event: no ancestors
                    if event.run_id not in streams:
                        wanted.add(event.run_id)
                    continue
                if parent == event.root_id and parent in streams and event.run_id in streams:
                    # a child of a loaded root (most children's events): both its destinations
                    # are loaded, and its link, to a loaded root, adds none (processing learns it)
                    continue
            self._wanted(event, wanted)
        return wanted

    def _wanted(self, event: Event, wanted: set[str]) -> None:
        """:meth:`missing` of an event that states a link to learn, or a child's that is not loaded."""
        streams, parents = self._streams, self.parents
        parents.learn(event)
        if event.parent_id is None:  # (a root's child.spawn)
            if event.run_id not in streams:
                wanted.add(event.run_id)
            return
        for run_id in (event.run_id, *parents.ancestors(event)):
            if run_id not in streams:
                wanted.add(run_id)

    def restore(self, run_id: str, data: bytes | None, *, raw: Sequence[Event] = (),
                last_activity: float | None = None) -> None:
        """Load a stream's stored checkpoint (None: a new stream), with ``raw``, the stream's raw
        events its shaping windows span (:func:`~.checkpoint.window_span`): the deltas they hold.

        ``last_activity`` (epoch seconds) starts the stream's silence clock in
        the past, for a run adopted from the replay log after its owner died.
        """
        checkpoint = decode_checkpoint(data) if data else Checkpoint()
        state = checkpoint.sequencer
        self.parents.learn_chain(run_id, state.ancestors, state.tenant if state.owned else ANY_TENANT)
        now = self.clock() if last_activity is None else last_activity
        self._streams[run_id] = _Stream(run_id, checkpoint, now, self.window_ms, raw)
        self._restored.add(run_id)

    def holds(self, run_id: str) -> bool:
        """Whether the stream's state is in memory."""
        return run_id in self._streams

    def forget_all(self) -> None:
        """Drop every in-memory stream (after losing shards: another writer may own them now)."""
        self._streams.clear()
        self.parents = ParentMap()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def stream_ids(self) -> list[str]:
        """The streams held in memory."""
        return list(self._streams)

    # ---- processing -----------------------------------------------------
    def process(self, events: Sequence[Event]) -> dict[str, StreamOutput]:
        """Fan in, sequence and shape a batch. Every destination must be restored first."""
        outputs: dict[str, StreamOutput] = {}
        now = self.clock()
        self._restored.clear()
        self.stats.events += len(events)
        for event in events:
            self._one(event, outputs, now)
        return self._finish(outputs, True)

    def process_each(
        self,
        events: Sequence[Event],
        *,
        owned: bool = False,
        into: dict[str, StreamOutput] | None = None,
    ) -> tuple[dict[str, StreamOutput], list[tuple[int, Exception]]]:
        """Like :meth:`process`, but an event whose processing raises is reported, not fatal.

        Returns the outputs and ``(index, error)`` of each failed event, so a
        runtime can dead-letter it while the events around it go on.
        ``owned``: the events were decoded for this call alone, so each is
        stamped with its delivery seq in place rather than copied (the
        outputs hold them; the caller must not reuse them).
        ``into``: the unsealed outputs of earlier batches, which these events
        extend stream by stream (and which are returned, unsealed) until
        :meth:`seal` takes them all: a runtime merging batches into one write
        pays for each stream's output and checkpoint once per write, not once
        per batch. Without it the outputs are this batch's, sealed.
        """
        outputs: dict[str, StreamOutput] = {} if into is None else into
        failures: list[tuple[int, Exception]] = []
        now = self.clock()
        one = self._one
        self.stats.events += len(events)
        self._in_place = owned
        try:
            if self.core is not None:  # (the same steps: the usual case of each compiled)
                failures = self.core.process(self, events, outputs, now, owned)
            else:
                for index, event in enumerate(events):
                    try:
                        one(event, outputs, now)
                    except Exception as error:  # isolate one poison event
                        failures.append((index, error))
        finally:
            self._in_place = False
        for _, failure in failures:
            if isinstance(failure, Misrooted):  # streams loaded only for it belong to another writer
                for run_id in (failure.event.run_id, failure.claimed):
                    if run_id in self._restored and run_id not in outputs:
                        self._streams.pop(run_id, None)
        self._restored.clear()
        return self._finish(outputs, into is None), failures

    @staticmethod
    def seal(outputs: dict[str, StreamOutput]) -> dict[str, StreamOutput]:
        """Take the checkpoint of every output whose stream's state is not taken yet.

        Call it before anything else is processed: the checkpoint is the
        stream's state now, which must be the state after exactly these outputs.
        The streams' next events start new outputs.
        """
        for output in outputs.values():
            stream = output.stream
            if stream is not None:
                output.state = stream.checkpoint(output)
                output.stream = stream.output = None
        return outputs

    def tick(
        self, now: float | None = None, *, caught_up: Callable[[str], bool] | None = None
    ) -> dict[str, StreamOutput]:
        """Close shaping windows whose end has passed and end silent runs.

        ``caught_up(run_id)``, when given, says whether the runtime has read
        everything available for that stream's shard; windows of streams
        still behind are left to close by event time.
        """
        now = self.clock() if now is None else now
        outputs: dict[str, StreamOutput] = {}
        now_ms = int(now * 1000)
        quiet_since = now - self.quiet_s
        for run_id, stream in self._streams.items():
            if (
                stream.coalescer.pending
                and stream.last_activity <= quiet_since
                and (caught_up is None or caught_up(run_id))
            ):
                shaped = stream.coalescer.tick(_event_now(stream, now, now_ms), self.grace_ms)
                if shaped:
                    self._output(outputs, run_id, stream).shaped.extend(shaped)
        for run_id in self._silent(now):
            self.stats.silenced += 1
            self.stats.events += 1
            self._one(self._silence_event(run_id, now), outputs, now, made=True)
        return self._finish(outputs, True)

    def _one(
        self, event: Event, outputs: dict[str, StreamOutput], now: float, *, made: bool = False
    ) -> None:
        streams = self._streams
        own = streams[event.run_id]
        tenant = event.tenant
        state = own.state
        if not made and (not state.owned or state.tenant != tenant):
            self._check_owner(state, event)
        ref = event.child_ref
        source = event.run_id if ref is UNSET or ref is None else ref
        parent = event.parent_id
        if parent is None:
            if type(event) is ChildSpawn:
                self.parents.learn(event)
            ancestors: list[str] = _NONE
        else:
            parents = self.parents
            route = own.route
            if (
                route is not None and route[3] == parents.version and route[0] == parent
                and route[1] == event.root_id and route[2] == tenant and not made
                and source is event.run_id and type(event) is not ChildSpawn
            ):  # the run's events state the same links as its last one: the same chain
                ancestors = route[4]
            else:
                ancestors = self._chain(own, event, source, made)
            if made:  # an event runwire made fans in only where this process holds the streams
                ancestors = self._loaded_prefix(ancestors)
            else:
                for ancestor in ancestors:  # (all of this tenant's already: the rule)
                    above = streams[ancestor].state
                    if not above.owned or above.tenant != tenant:
                        ancestors = self._same_tenant(ancestors, tenant)
                        break
            if ancestors and state.ancestors != ancestors:
                state.ancestors = ancestors
        admit = self._admit
        published = event.seq
        if ancestors:
            # each copy: the ancestor's run, the originating child, and the ancestor's
            # own parent/root links; the root's copy has none. Copies first: the
            # stream's own event is the decoded one, stamped in place.
            root = ancestors[-1]
            for index in range(len(ancestors) - 1):
                admit(streams[ancestors[index]], event, published, source, outputs, now,
                      ancestors[index + 1], root, True)
            admit(streams[root], event, published, source, outputs, now, None, None, True)
        admit(own, event, published, source, outputs, now, None, None, False)
        if type(event) is RunLifecycle and source is event.run_id and is_terminal(event):
            state.terminal = True
            self._ended.append(own)

    def _chain(self, own: _Stream, event: Event, source: str, made: bool) -> list[str]:
        """Learn the links ``event`` states and give its ancestors (raises :class:`Misrooted`);
        kept as ``own.route`` when the run's next events may reuse it."""
        parents, tenant = self.parents, event.tenant
        parents.learn(event)
        own_event = not made and source is event.run_id
        if own_event and event.root_id is not None:
            root = parents.root_of(event.root_id, tenant)
            if root != event.root_id:
                raise Misrooted(event, root)
        ancestors = parents.ancestors(event)
        if own_event and type(event) is not ChildSpawn:
            own.route = (event.parent_id, event.root_id, tenant, parents.version, ancestors)
        return ancestors

    def _admit(
        self,
        stream: _Stream,
        event: Event,
        published: int,
        source: str,
        outputs: dict[str, StreamOutput],
        now: float,
        parent_id: str | None,
        root_id: str | None,
        copy: bool,
    ) -> None:
        """Sequence ``event`` (publisher seq ``published``) and shape it into ``stream``.

        For an ancestor's stream (``copy``) the event is rewritten as that
        stream's copy: ``run_id`` the ancestor, ``child_id`` the originating
        run, ``parent_id``/``root_id`` the ancestor's own links. Into its own
        stream the event itself is stamped with the delivery seq (the last
        use of the decoded event: copies are made before).
        """
        state = stream.state
        if state.terminal:  # (ended: dropped from memory after the batch once its windows are closed)
            self._ended.append(stream)
            if state.retired:
                self.stats.retired += 1
                return
        run_id = stream.run_id
        output = stream.output
        if output is None:
            output = stream.output = outputs[run_id] = StreamOutput(run_id=run_id, stream=stream)
        if published:
            sources = state.sources
            last = sources.get(source, 0)
            if published != last + 1:  # a duplicate, or a gap: the sequencer's general path
                if copy:  # (the event itself still has its publisher seq: it is admitted last)
                    event = replace_struct(event, run_id=run_id, child_ref=source,
                                           parent_id=parent_id, root_id=root_id)
                admitted = stream.sequencer.admit(event, source)
                if not admitted:
                    self.stats.duplicates += 1
                    return
                self.stats.gaps += 1
                stream.last_activity = now
                output.raw.extend(admitted)
                for raw in admitted:
                    stream.coalescer.feed_into(raw, output.shaped)
                return
            sources[source] = published
        stream.last_activity = now
        seq = state.last_seq = state.last_seq + 1
        if copy:
            event = replace_struct(event, seq=seq, run_id=run_id, child_ref=source,
                                   parent_id=parent_id, root_id=root_id)
        elif self._in_place:
            event.seq = seq
        else:
            event = replace_struct(event, seq=seq)
        output.raw.append(event)
        stream.coalescer.feed_into(event, output.shaped)

    def _output(self, outputs: dict[str, StreamOutput], run_id: str, stream: _Stream) -> StreamOutput:
        output = stream.output
        if output is None:
            output = stream.output = outputs[run_id] = StreamOutput(run_id=run_id, stream=stream)
        return output

    def _finish(self, outputs: dict[str, StreamOutput], seal: bool) -> dict[str, StreamOutput]:
        """Seal (when asked), then drop the ended streams this batch touched from memory."""
        if seal:
            self.seal(outputs)
        streams, ended = self._streams, self._ended
        if ended:
            for stream in ended:
                run_id = stream.run_id
                if not stream.coalescer.pending and streams.get(run_id) is stream:
                    del streams[run_id]
                    self.parents.forget(run_id)
            ended.clear()
        return outputs

    def _check_owner(self, state: SequencerState, event: Event) -> None:
        """The run's first writer's tenant owns it: another tenant's event is refused (dead-lettered)."""
        if not owns(state, event.tenant):
            self.stats.foreign += 1
            raise WriteRefused(f"{event.type} of tenant {event.tenant!r} written to run {event.run_id!r}, "
                               f"which belongs to tenant {state.tenant!r}")

    def _same_tenant(self, ancestors: list[str], tenant: str | None) -> list[str]:
        """The ancestors up to the first run of another tenant (fan-in never crosses tenants)."""
        streams = self._streams
        for index, ancestor in enumerate(ancestors):
            state = streams[ancestor].state
            if state.owned and state.tenant == tenant:
                continue
            if not owns(state, tenant):
                self.stats.foreign += 1
                return ancestors[:index]
        return ancestors

    def _loaded_prefix(self, ancestors: list[str]) -> list[str]:
        loaded: list[str] = []
        for ancestor in ancestors:
            if ancestor not in self._streams:
                break
            loaded.append(ancestor)
        return loaded

    # ---- silence ---------------------------------------------------------
    def _silent(self, now: float) -> list[str]:
        deadline = now - self.silence_s
        return [
            run_id
            for run_id, stream in self._streams.items()
            if stream.last_activity <= deadline and not stream.sequencer.state.terminal
        ]

    def _silence_event(self, run_id: str, now: float) -> Event:
        ancestors = self._loaded_prefix(self._streams[run_id].sequencer.state.ancestors)
        return RunLifecycle(
            id=self._ids.new(int(now * 1000)),
            ts=format_ts(datetime.fromtimestamp(now, UTC)),
            run_id=run_id,
            seq=0,
            parent_id=ancestors[0] if ancestors else None,
            root_id=ancestors[-1] if ancestors else None,
            payload=RunLifecyclePayload(
                state="error",
                reason=f"no events for {self.silence_s:g}s (agent presumed dead)",
            ),
        )


def _event_now(stream: _Stream, now: float, now_ms: int) -> int:
    """``now`` on the clock of the stream's events: its last delta's ``ts`` plus the time since
    the worker saw it. Window ends are event time; a publisher whose clock is minutes ahead of
    the worker's would otherwise keep a quiet stream's last window open that long, and one
    behind would close windows as if they were late (``docs/workers.md`` § Clocks)."""
    clock = stream.coalescer.state.clock
    return clock + int((now - stream.last_activity) * 1000) if clock else now_ms
