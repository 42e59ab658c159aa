"""The span exporter: a worker's runs, as OpenTelemetry GenAI spans, sent over OTLP/HTTP.

It runs beside a worker's loop, off its delivery path: as the worker encodes a write it hands
over each root run's stream (:meth:`SpanExporter.stage`: no await), which it folds into the run's
span tree (:class:`~runwire.jobs.spans.SpanTree` or its compiled twin) at once, keeping the spans
it ends back until the replay log holds those events. After the log write the worker says so
(:meth:`SpanExporter.offer`: what ``stage`` returned for each stream it took, and the streams it did
not take, such as a run it does not hold or a gap, which are folded as soon as the worker's task
next waits). A background pass claims the runs, posts the spans that ended and moves the runs'
cursors: when ``READY_SPANS`` ended spans wait for it, or an ended span has
waited ``OTEL_BSP_SCHEDULE_DELAY`` (5 s, as OpenTelemetry's SDKs), but never sooner than
``interval_s`` after the pass before (a pass's claims, commit and posts then serve that much of
the worker's writing: at a low rate they cost more than the fold). A post that fails is
retried with backoff for at most ``give_up_s``; then its spans are dropped and counted
(``runwire_otel_spans_dropped``). Nothing the worker awaits waits for the backend; what waits
for a pass is bounded (``MAX_PENDING`` ended spans, ``MAX_BUFFERED`` events of runs not
claimed yet: past either, a run is folded again from the log).

**Each span once, across a crash.** The replay log keeps, per root run, how far its spans were
exported (``export_commit``: the seq of the last event folded) and who holds the run's export
(``export_claim``, a hold of ``hold_s``, claimed again when half of it has passed). A span is sent in the pass that
folds the event ending it (its ``end_seq``) past the cursor, and the cursor moves only after the
backend said yes. An exporter that starts without a run's tree, or finds the cursor moved by
another, folds the run again from the log and sends only spans ending past the cursor: the same
spans, with the same ids (they are derived from the run and what the span is). So a worker killed
at any point neither loses a span (its events are in the log; whoever writes the run next, or
the sweep of runs left behind, picks it up) nor sends one twice — except when it dies between
the backend's yes and the cursor's move: those spans are sent again with the same trace and span
ids, which a backend that keys spans by id (Phoenix, Tempo, Jaeger's storage) keeps once.

Longer than ~400 lines: the worker's side (``stage``, ``offer``) and the pass share one state —
the trees held, the events kept, the spans pending and when a pass is due — which a split would
spread over two modules reaching into each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from ..core.envelope import Event
from ..store import ReplayLog
from .otlp_env import OtlpSettings, release
from .otlp_post import ExportMetrics, Poster
from .staging import staging

if TYPE_CHECKING:
    from .otlp import Fold

__all__ = ["ExportMetrics", "SpanExporter", "exporter_from_env", "exporting"]

log = logging.getLogger("runwire.jobs.export")

HOLD_S = 15.0
"""How long a run's export is held by the exporter that last claimed it: after a crash, another
exporter takes it over this much later (the same ``--name`` at once)."""
INTERVAL_S = 0.5
"""The least time between passes: a pass serves at least this much of the worker's writes (its
spans sent in as few requests as may be)."""
GIVE_UP_S = 30.0
"""How long one pass retries the backend before it drops what it could not send."""
MAX_BUFFERED = 200_000
"""Events handed over and not folded yet; past it a run's events are read back from the log."""
READY_BUFFERED = MAX_BUFFERED // 10
"""Events handed over and not folded yet that call a pass without waiting for the schedule delay."""
READY_SPANS = 5_000
"""Ended spans (five requests' worth, ~1.5 MB) that call a pass without waiting for the schedule
delay. Beside its posts a pass costs ~1 ms (claims, a commit, a look at each run it holds): a
pass a second for 1,000 spans was ~1 % of a worker's CPU at 10,000 events/s."""
MAX_PENDING = 100_000
"""Ended spans not sent yet (~300 bytes each; they pile up while the backend is retried); past
it a run's tree and spans are dropped here and folded again from the log by a later pass."""
FOLD_PAGE = 2000
"""Events of a run read from the log and folded at a time (an exporter that starts, or took a
run over, folds a long run page by page)."""
MAX_TREES = 10_000
"""Runs whose open spans are kept in memory; one evicted is folded again from the log."""
BEHIND_WINDOW = timedelta(minutes=10)
"""How far back the sweep looks for runs a dead exporter left behind."""


def _root_or_not(events: Sequence[Event]) -> bool | None:
    """Whether a stream of the log is a root run's, by its own events (a child's carry its
    parent); None when it holds only fanned-in ones, which do not say."""
    own = next((event for event in events if event.child_id is None), None)
    return None if own is None else own.parent_id is None


class _Held:
    """A root run folded here: ``tree`` (its fold), ``cursor`` (the log's export cursor when
    claimed or last moved: ``pending`` holds the spans ended past it not sent yet), ``until``
    (when the hold runs out, monotonic; 0 before the first claim), and ``staged``: per stretch of
    events folded as the worker encoded them, its first and last seq and the spans it ended, kept
    back until the log holds those events."""

    __slots__ = ("cursor", "pending", "staged", "tree", "until")

    def __init__(self, tree: Fold, cursor: int, until: float) -> None:
        self.tree, self.cursor, self.until = tree, cursor, until
        self.pending: list[Any] = []
        self.staged: list[tuple[int, int, list[Any]]] = []

    def sent_to(self) -> int:
        """Where the cursor may move once ``pending`` is sent: the tree's last event, or before
        the first staged one (a staged span is not sent yet, and may end before the tree's last)."""
        return self.staged[0][0] - 1 if self.staged else self.tree.last_seq

    def logged(self, last: int) -> None:
        """The stretches staged up to ``last``, which the log now holds, made pending."""
        while self.staged and self.staged[0][1] <= last:
            self.pending += self.staged.pop(0)[2]

    def unsent(self) -> int:
        """Ended spans not sent yet: pending, or staged."""
        return len(self.pending) + sum(len(ended) for _, _, ended in self.staged)


class SpanExporter:
    """Folds the runs a worker writes into spans and posts them (see the module docs)."""

    def __init__(
        self,
        store: ReplayLog,
        settings: OtlpSettings,
        *,
        holder: str,
        metrics: ExportMetrics | None = None,
        hold_s: float = HOLD_S,
        interval_s: float = INTERVAL_S,
        give_up_s: float = GIVE_UP_S,
        version: str = "",
    ) -> None:
        self.store = store
        self.settings = settings
        self.holder = holder
        self.metrics = metrics or ExportMetrics()
        self.hold_s = hold_s
        self.interval_s = interval_s
        self.give_up_s = give_up_s
        self.version = version
        self._buffers: dict[str, list[Event]] = {}
        self._buffered = 0
        self._from_log: set[str] = set()
        self._trees: OrderedDict[str, _Held] = OrderedDict()
        """Per root run folded here: its tree, the cursor it was folded from, until when the hold
        lasts and the spans it ended that are not sent yet (see :class:`_Held`)."""
        self._offered: list[Sequence[tuple[Any, ...]]] = []
        self._folding = False
        self._staging = staging(self._trees, self._begin, self._fold_failed, MAX_PENDING)
        self.stage = self._staging
        """A stream's events as the worker encodes them, before its log write (``stage(run_id,
        events)``): a root run's that continue its tree here (or begin the run) are folded now,
        while they are in the CPU's cache (20–35 % less CPU than folding them after the write);
        the spans they end are kept back until :meth:`offer` says the write is in the log.
        Returns a token when it took the stream (the worker hands the token to :meth:`offer`,
        not the stream: no look-up a stream after the write), else None (the stream is handed
        over after the write). :class:`~runwire.jobs.staging.Staging`, compiled where built."""
        self._roots: OrderedDict[str, bool] = OrderedDict()
        """Whether each run seen lately is a root (only a root's stream holds its whole tree)."""
        self.poster = Poster(settings, self.metrics, version)
        self._swept_at = 0.0
        self._wake = asyncio.Event()
        """Set when a pass is due before the schedule delay (:meth:`_ready`, or the stop)."""
        self.ready_spans = READY_SPANS
        self._make_fold: Callable[[str, bool], Fold] | None = None

    # ---- the worker's side: no await, bounded ---------------------------------
    def _begin(self, run_id: str, events: Sequence[Event]) -> _Held | None:
        """:attr:`stage` of a run not held here: when its stream begins it (and it is a root
        run's), its tree, held now; else None (the stream is handed over after the write)."""
        if not events or events[0].seq != 1 or run_id in self._from_log or run_id in self._buffers:
            return None
        try:
            if not self._is_root(run_id, events):
                return None
            return self._hold(run_id, _Held(self._new_fold(run_id), 0, 0.0))
        except Exception as exc:  # the worker goes on
            self._fold_failed(run_id, exc)
            return None

    def offer(self, streams: Sequence[tuple[Any, ...]], taken: Sequence[tuple[_Held, int]] = ()) -> None:
        """A write is in the log: ``taken``, what :meth:`stage` returned for the streams it took
        (their spans may now be sent), and ``streams``, the write's other streams (``(run_id,
        events, …)`` each; the worker leaves out a sub-run's own, whose events are in its root's,
        and any left in are passed over): folded as soon as the worker's task next waits (its
        views' write is on its way by then), so an event is held no longer than that, not until
        the next pass (a pass's worth is ~50,000 events at 100 k events/s); what is kept between
        passes is the spans that ended."""
        self._staging.release(taken)  # (a tree dropped since is folded again from the log)
        if streams:
            self._offered.append(streams)
            if not self._folding:
                self._folding = True
                asyncio.get_running_loop().call_soon(self._fold_offered)
        elif self._ready():
            self._wake.set()

    def _fold_offered(self) -> None:
        self._folding = False
        offered, self._offered = self._offered, []
        for streams in offered:
            for stream in streams:
                try:
                    self._take(stream[0], stream[1])
                except Exception as exc:  # the worker goes on
                    self._fold_failed(stream[0], exc)
        if self._ready():
            self._wake.set()

    @property
    def _pending(self) -> int:
        """Ended spans not sent yet, staged or pending, over every tree (counted as they end,
        recounted each pass)."""
        return self._staging.pending

    @_pending.setter
    def _pending(self, count: int) -> None:
        self._staging.pending = count

    def _ready(self) -> bool:
        """Whether enough ended spans, or events to fold, wait for a pass not to wait for the delay."""
        return self._pending >= self.ready_spans or self._buffered >= READY_BUFFERED

    def _fold_failed(self, run_id: str, exc: Exception) -> None:
        """A fold that raised: its tree is dropped and the run folded again from the log."""
        log.warning("span fold of %s failed (folded again from the log): %s", run_id, exc)
        self._trees.pop(run_id, None)
        self._from_log.add(run_id)

    def _is_root(self, run_id: str, events: Sequence[Event]) -> bool | None:
        """Whether ``run_id`` is a root run, as remembered or as its events say (None: they do not)."""
        root = self._roots.get(run_id)
        if root is None:
            root = _root_or_not(events)
            if root is not None:
                self._remember(run_id, root)
        return root

    def _take(self, run_id: str, events: Sequence[Event]) -> None:
        """Fold a root run's new events into its tree, where they continue one held here or begin
        the run; else keep them for the pass (bounded: past it the pass reads the log)."""
        if not events:
            return
        if self._is_root(run_id, events) is False:
            return
        if run_id not in self._from_log and run_id not in self._buffers:
            held = self._trees.get(run_id)
            if held is None and events[0].seq == 1:  # the run begins: its cursor can only be 0 (the pass checks)
                held = self._hold(run_id, _Held(self._new_fold(run_id), 0, 0.0))
            if held is not None and self._pending > MAX_PENDING:  # folded again by a later pass
                self._trees.pop(run_id)
                self._from_log.add(run_id)
                return
            if held is not None:
                held.logged(events[-1].seq)  # folded as encoded: in the log now, to send
                last = held.tree.last_seq
                if events[-1].seq <= last:  # folded already: as encoded, or read from the log by a pass
                    return
                if events[0].seq <= last + 1:
                    if events[0].seq <= last:
                        events = [event for event in events if event.seq > last]
                    ended = held.tree.apply_many(events, held.cursor)
                    held.pending += ended
                    self._pending += len(ended)
                    return
        if run_id in self._from_log or self._buffered + len(events) > MAX_BUFFERED:
            self._from_log.add(run_id)
            self._buffered -= len(self._buffers.pop(run_id, ()))
            return
        self._buffers.setdefault(run_id, []).extend(events)
        self._buffered += len(events)

    def _new_fold(self, root: str) -> Fold:
        make = self._make_fold
        if make is None:  # (an import statement a run was ~1 µs of a short run's ~30)
            from .otlp import span_fold  # loaded by a process that exports, only

            make = self._make_fold = span_fold
        return make(root, self.settings.content)

    def _hold(self, root: str, held: _Held) -> _Held:
        self._trees[root] = held
        self._trees.move_to_end(root)
        while len(self._trees) > MAX_TREES:  # one evicted is folded again from the log
            evicted, dropped = self._trees.popitem(last=False)
            if dropped.staged or dropped.pending:
                self._from_log.add(evicted)
        return held

    # ---- the background side ---------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Pass after pass until ``stop``; then one last pass for what was handed over."""
        async with contextlib.AsyncExitStack() as stack:
            opened = self.store.beside()
            if opened is not None:
                self.store = await stack.enter_async_context(opened)
            await stack.enter_async_context(self.poster.connected())
            woken = asyncio.create_task(self._wake_on(stop))
            stack.callback(woken.cancel)
            while not stop.is_set():
                await self._until_due(stop)
                await self._guarded(self._sweep_if_due)
                await self._guarded(self.pass_once)
            await self._guarded(self.pass_once)

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _until_due(self, stop: asyncio.Event) -> None:
        """Wait ``interval_s``, then until enough is ready (:meth:`_ready`) or the
        schedule delay since the last pass has passed (at most a third of the hold, so that a
        held run's claim is renewed well before it lapses)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), self.interval_s)
        rest = min(self.settings.delay_s, self.hold_s / 3) - self.interval_s
        if rest <= 0 or stop.is_set() or self._ready():
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), rest)

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[None]:
        """The exporter's HTTP connection pool open for the block (:meth:`run` opens it itself)."""
        async with self.poster.connected():
            yield

    async def _guarded(self, step: Any) -> None:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker goes on whatever the exporter meets
            log.warning("span export pass failed (tried again next pass): %s", exc)

    async def _sweep_if_due(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < self.hold_s:
            return
        self._swept_at = now
        moment = self.store.clock()
        behind = await self.store.export_behind(moment - BEHIND_WINDOW, moment - timedelta(seconds=self.hold_s),
                                                1000)
        for root in behind:
            if root not in self._buffers:
                self._from_log.add(root)

    async def pass_once(self) -> int:
        """Fold what was handed over (or is behind) and send the spans that ended; spans sent."""
        self._fold_offered()
        buffers, self._buffers, self._buffered = self._buffers, {}, 0
        behind, self._from_log = self._from_log, set()
        asked = list(dict.fromkeys([*buffers, *behind]))
        roots = list(dict.fromkeys([*(await self._only_roots(asked)),
                                    *(root for root, held in self._trees.items() if held.pending)]))
        if not roots:
            return 0
        now = time.monotonic()
        due = [root for root in roots if root not in self._trees or self._trees[root].until - now < self.hold_s / 2]
        claimed = await self.store.export_claim(due, self.holder, self.hold_s) if due else {}
        spans: list[Any] = []  # ended spans: Span, or the compiled fold's bytes of one
        moves: list[tuple[str, int, int]] = []
        taken: dict[str, _Held] = {}
        for root in roots:
            held = self._trees.get(root)
            if root in claimed:
                if held is not None and held.cursor != claimed[root]:  # moved by another: fold again
                    self._trees.pop(root)
                    held = None
                if held is None:
                    held = _Held(self._new_fold(root), claimed[root], 0.0)
                held.until = now + self.hold_s
            elif root in due or held is None:  # another exporter holds it: its spans are that one's to send
                self._trees.pop(root, None)
                continue
            buffered = buffers.get(root)
            if buffered is None and root not in behind and held.tree.last_seq >= held.cursor \
                    and self._trees.get(root) is held:  # folded as handed over: nothing to read
                self._trees.move_to_end(root)
            else:
                await self._fold(root, held, buffered or [], root in behind)
            if held.pending:  # the cursor moves only past spans sent (folding alone is redone)
                spans += held.pending
                held.pending = []
                moves.append((root, held.cursor, held.sent_to()))
                taken[root] = held
            if not held.tree.is_open and not held.staged:
                self._trees.pop(root, None)
        self._pending = sum(held.unsent() for held in self._trees.values())
        sent = await self.poster.send(spans, time.monotonic() + self.give_up_s) if spans else 0
        moved = set(await self.store.export_commit(moves, self.holder, self.hold_s))
        for root, _, after in moves:
            held = taken[root]
            if root not in moved:
                if self._trees.get(root) is held:
                    self._trees.pop(root)  # the cursor moved under us: fold again next time
            else:
                held.cursor, held.until = after, now + self.hold_s
        return sent

    def _remember(self, run_id: str, root: bool) -> None:
        self._roots[run_id] = root
        self._roots.move_to_end(run_id)
        while len(self._roots) > MAX_TREES:
            self._roots.popitem(last=False)

    async def _only_roots(self, run_ids: list[str]) -> list[str]:
        """``run_ids`` less the sub-runs (asking the log about runs whose events did not say)."""
        unknown = [run_id for run_id in run_ids if run_id not in self._roots]
        if unknown:
            infos = await self.store.runs_by_id(unknown)
            for run_id in unknown:
                info = infos.get(run_id)
                self._remember(run_id, info is None or info.parent_id is None)
        return [run_id for run_id in run_ids if self._roots[run_id]]

    async def _fold(self, root: str, held: _Held, buffered: list[Event], behind: bool) -> None:
        """Fold into ``held`` the events kept for the pass, or (``behind``, or they do not
        continue the tree) read the run's rest from the log."""
        tree = held.tree
        if buffered and buffered[0].seq <= tree.last_seq + 1 and not behind:
            held.logged(buffered[-1].seq)  # any staged before them is in the log too
            fresh = [event for event in buffered if event.seq > tree.last_seq]
            held.pending += tree.apply_many(fresh, held.cursor)
        elif buffered or behind or tree.last_seq < held.cursor:
            # from the log, a page at a time (a long run is never held whole); offered events
            # are kept for the next pass meanwhile (the tree is not held while the pass waits)
            self._trees.pop(root, None)
            page: list[Event] = []
            async for event in self.store.iter_events(root, after=tree.last_seq, batch=FOLD_PAGE):
                page.append(event)
                if len(page) >= FOLD_PAGE:
                    held.pending += tree.apply_many(page, held.cursor)
                    page = []
            held.pending += tree.apply_many(page, held.cursor)
        if tree.is_open or held.pending or held.staged:
            self._hold(root, held)


def exporter_from_env(
    env: Mapping[str, str], store: ReplayLog, *, holder: str, registry: CollectorRegistry | None = None,
) -> SpanExporter | None:
    """The exporter the standard ``OTEL_*`` variables ask for (docs/observability.md), else None;
    its counters go in ``registry`` (a ``/metrics`` page's)."""
    settings = OtlpSettings.from_env(env)
    if settings is None:
        return None
    log.info("exporting spans to %s as %s", settings.endpoint, settings.resource.get("service.name"))
    return SpanExporter(store, settings, holder=holder, metrics=ExportMetrics(registry), version=release())


@contextlib.asynccontextmanager
async def exporting(exporter: SpanExporter | None, *, drain_s: float = 5.0) -> AsyncIterator[None]:
    """Run ``exporter`` (if any) in the background for the block; on leaving, give its last pass
    up to ``drain_s`` seconds (what it cannot send then, the next exporter folds from the log)."""
    if exporter is None:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(exporter.run(stop), name="runwire-span-export")
    try:
        yield
    finally:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=drain_s)
        if not done:
            task.cancel()
            await asyncio.wait({task})
