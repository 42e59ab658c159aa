"""The replay log: an append-only per-run event store with retention.

Holds each run's **raw delivery view** (delivery seq, child events fanned in
with ``child_id``); the shaped view is recomputed from it deterministically.
Selected by URL: ``sqlite:///path`` (embedded default) and
``postgresql://…`` (production, Koder agent stream §6's table shape).

Retention is by terminal state — done 90 days, aborted/error 30 days,
unfinished runs by last activity — overridable per tenant; ``sweep`` deletes
what expired. Run metadata (tenant, parent, thread, state, counts, tokens, times) is
maintained on append.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec

from ..core import envelope
from ..core.envelope import Event
from ..core.errors import UnknownRun
from ..core.lifecycle import ConnectedResource
from .outbox import Outbox
from .producers import Reservation
from .retention import RetentionPolicy, split_retention, utc_now


class RunFields(msgspec.Struct, kw_only=True):
    """Who a run is, where it stands and what it counted: the fields its metadata and each
    change to it (what one append adds) share."""

    run_id: str
    tenant: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    thread_id: str | None = None
    """The chat/thread the run answers (its own events' ``thread_id``)."""
    state: str | None = None
    """Last run.lifecycle state seen (None before any)."""
    events: int = 0
    last_seq: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dropped: int = 0
    first_ts: str | None = None
    last_ts: str | None = None


class ForkPoint(msgspec.Struct, kw_only=True, frozen=True):
    """A fork: run ``run_id`` began as a copy of run ``source_id``'s events up to seq ``at``."""

    run_id: str
    source_id: str
    at: int


class RunInfo(RunFields, kw_only=True):
    terminal: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    """Wall-clock time of the last append (retention of unfinished runs)."""
    expires_at: datetime | None = None
    forked_from: ForkPoint | None = None
    """The run is a fork of another (filled in by :meth:`ReplayLog.with_forks`)."""
    forks: list[ForkPoint] = []
    """The forks made of this run (filled in by :meth:`ReplayLog.with_forks`)."""


class LoggedRun(RunInfo, kw_only=True):
    """A run's metadata with the checkpoint of record (:meth:`ReplayLog.logged_runs`)."""

    checkpoint: bytes | None = None
    """The raw delivery stream's checkpoint (``processing.checkpoint.Checkpoint``, msgpack) that
    the worker's write logging the run's newest events carried; None when no write carried one
    (events appended by an import, or logged before the log kept checkpoints)."""


LogStream = (tuple[str, Sequence[Event], Sequence[bytes]]
             | tuple[str, Sequence[Event], Sequence[bytes], bytes | None]
             | tuple[str, Sequence[Event], Sequence[bytes], bytes | None, Any])
"""One run's part of a write to the log (:meth:`ReplayLog.append_streams`): ``(run_id, events,
encoded)``, optionally with the checkpoint of the run's raw delivery stream after these events,
and what the worker summed of the events as it admitted them (``runwire.core._native.RunSummary``,
or None: :func:`runwire.store.runmeta.stream_summary`)."""


def stream_checkpoint(stream: LogStream) -> bytes | None:
    """The checkpoint a :data:`LogStream` carries (None: it carries none)."""
    return stream[3] if len(stream) > 3 else None


class RunOwner(msgspec.Struct, kw_only=True, frozen=True):
    """Who owns a run id: recorded once, by the first entrance that saw it (:meth:`ReplayLog.claim_run`)."""

    tenant: str
    root_id: str
    """The root of the run's tree as first claimed (the run itself for a root run)."""


class SweepResult(msgspec.Struct, kw_only=True):
    runs: list[str]
    events: int


Clock = Callable[[], datetime]


class ReplayLog(ConnectedResource):
    """One replay log, selected by URL. ``async with open_store(url) as log``.

    Each backend implements its ports (:mod:`runwire.store.ports`: ``EventLog``,
    ``RunCatalogue``, ``Ownership``, ``DurableState``, ``SpanCursor``; and the outbox); a caller
    depends on the ports it uses, and only what opens a log or hands it on holds the whole of
    it (``tests/test_layout.py`` checks this).

    ``connect`` opens it (and migrates the schema), raising StoreUnavailable.
    """

    def __init__(
        self,
        url: str,
        *,
        retention: RetentionPolicy | None = None,
        tenant_retention: dict[str, RetentionPolicy] | None = None,
        clock: Clock | None = None,
    ) -> None:
        location, policy, per_tenant = split_retention(url, retention)
        self.url = url
        self.retention = policy
        self.tenant_retention = {**per_tenant, **(tenant_retention or {})}
        self.clock: Clock = clock or utc_now
        """Wall clock for activity times and expiry (injectable in tests)."""
        self._locate(location)

    @abstractmethod
    def _locate(self, location: str) -> None:
        """Set up for ``location``: the URL without its retention parameters (nothing opens yet)."""

    def beside(self) -> ReplayLog | None:
        """Another log on the same store (not yet connected), for a job beside this one's writer
        (the span exporter): its reads never queue behind this one's writes, and it leaves the
        store's upkeep to the writer (SQLite: the WAL's checkpoints, which copy the writer's
        pages). None where the store lives in this process's memory only."""
        return None if ":memory:" in self.url else type(self)(self.url, clock=self.clock)

    @abstractmethod
    def outbox(self) -> Outbox:
        """The deliveries kept in this log's store: webhooks, their run notices, signed HTTP
        deliveries queued until a receiver took them (:mod:`.outbox`)."""

    @abstractmethod
    async def append(self, events: Sequence[Event]) -> int:
        """Append events of any runs; idempotent on ``(run_id, seq)``. Returns rows added."""

    async def append_encoded(self, rows: Sequence[tuple[Event, bytes]]) -> int:
        """:meth:`append` for events whose canonical JSON is already at hand.

        Bulk paths (import, workers that encoded the event once) skip a second
        encode; backends that store the bytes override this. The bytes are the
        event's canonical JSON (``envelope.encode``: one line, no newline byte),
        which export writes as they are.
        """
        return await self.append([event for event, _ in rows])

    async def append_streams(self, streams: Sequence[LogStream]) -> int:
        """:meth:`append_encoded` for events grouped by run: ``(run_id, events, encoded[, checkpoint])``.

        A worker's write is grouped so already (one group per delivery
        stream); a backend can then summarize each run without regrouping.
        Same semantics as :meth:`append_encoded` of all the rows, and a run's
        checkpoint, when given, is kept as its checkpoint of record
        (:meth:`logged_runs`) if this write stores new events of the run and its
        last seq is at or past the run's last stored seq: it never moves
        backward. This base implementation keeps none (a backend that keeps
        them overrides this and :meth:`logged_runs`).
        """
        return await self.append_encoded(
            [row for stream in streams for row in zip(stream[1], stream[2], strict=True)]
        )

    @abstractmethod
    async def read(
        self, run_id: str, after: int = 0, limit: int | None = None
    ) -> list[Event]:
        """Events of one run with seq > ``after``, ascending."""

    @abstractmethod
    def iter_events(self, run_id: str, after: int = 0, batch: int = 5000) -> AsyncIterator[Event]:
        """All events of a run after a seq, streamed in batches (bounded memory)."""

    @abstractmethod
    async def first_seq(self, run_id: str) -> int | None:
        """Lowest seq still stored for a run, or None."""

    @abstractmethod
    async def run(self, run_id: str) -> RunInfo | None: ...

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        """:meth:`run` of each run the log holds, by run id (a worker restoring many runs at
        once: a backend that can looks them up in one query)."""
        infos = {run_id: await self.run(run_id) for run_id in dict.fromkeys(run_ids)}
        return {run_id: info for run_id, info in infos.items() if info is not None}

    async def logged_runs(self, run_ids: Sequence[str]) -> dict[str, LoggedRun]:
        """:meth:`runs_by_id` with each run's checkpoint of record (one query where the backend can).

        The log is written before the bus's views and checkpoints, so when the
        bus lost a stream's checkpoint (Redis flushed or failed over) a worker
        continues the run from this one (``Stages._load_states``). Kept apart
        from :meth:`run` and :meth:`runs`, which never read the blob. This base
        implementation keeps no checkpoints (each is None).
        """
        infos = await self.runs_by_id(run_ids)
        return {run_id: LoggedRun(**msgspec.structs.asdict(info)) for run_id, info in infos.items()}

    @abstractmethod
    async def claim_run(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        """Record ``tenant`` as the owner of ``run_id`` unless an owner is recorded; return the owner.

        Atomic across every process sharing the log (the first claim wins; a
        run already in the log keeps the tenant and root it was logged with),
        so two edges seeing a fresh run id at once agree on one tenant.
        Claims are swept with their run, or after the unfinished-run
        retention when the run never reached the log.
        """

    @abstractmethod
    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The recorded owner of a run id, or None when nobody claimed it."""

    # ---- forks (runwire.jobs.fork) ------------------------------------------
    @abstractmethod
    async def record_fork(self, fork: ForkPoint) -> ForkPoint:
        """Record ``fork`` unless a fork is recorded for ``fork.run_id``; return the recorded one
        (``fork`` itself, or the earlier one: a different one means the id is taken).

        A fork is recorded before its events are copied, so a retry of the same
        fork finds its record and completes the copy (appends are idempotent).
        The record goes with the fork's run when retention sweeps it (or after
        the unfinished-run retention when no event of the fork reached the log);
        a fork outlives its source.
        """

    @abstractmethod
    async def fork_points(self, run_ids: Sequence[str]) -> list[ForkPoint]:
        """Every recorded fork made of, or into, one of ``run_ids``."""

    async def with_forks(self, infos: Sequence[RunInfo]) -> list[RunInfo]:
        """``infos`` with ``forked_from`` and ``forks`` filled in (one query)."""
        found = await self.fork_points([info.run_id for info in infos]) if infos else []
        out = list(infos)
        for info in out:
            info.forked_from = next((f for f in found if f.run_id == info.run_id), None)
            info.forks = sorted((f for f in found if f.source_id == info.run_id), key=lambda f: f.run_id)
        return out

    # ---- Durable Streams write state (runwire.store.producers) ----------
    @abstractmethod
    async def stream_create(self, run_id: str) -> bool:
        """Record ``run_id`` as a Durable Streams stream; False when it already was one."""

    @abstractmethod
    async def stream_state(self, run_id: str) -> tuple[int, bool] | None:
        """``(next_seq, closed)`` of a stream created with :meth:`stream_create`, else None."""

    @abstractmethod
    async def stream_reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, *, close: bool, hold_s: float,
        digest: str = "",
    ) -> Reservation:
        """Decide a batch of ``count`` events (``producer`` = id, epoch, seq) and number it, atomically.

        ``digest`` identifies the batch's bytes: a retry of the producer's latest
        batch with other bytes is a ``conflict`` (:func:`~.producers.decide`).

        ``busy`` while another batch holds the stream (retry shortly), ``missing`` for a run that
        is not a stream, ``closed`` after a closing batch; an accepted batch holds the stream
        for ``hold_s`` or until :meth:`stream_release`. ``close`` marks the stream closed.
        """

    @abstractmethod
    async def stream_release(self, run_id: str) -> None:
        """The batch reserved last has been published: the next may go."""

    # ---- span export cursors (runwire.jobs.export) ---------------------
    @abstractmethod
    async def export_claim(self, roots: Sequence[str], holder: str, hold_s: float) -> dict[str, int]:
        """Hold the span export of each root run for ``hold_s`` seconds, unless another holder's
        hold is still live; returns, for each root now held by ``holder``, the seq its spans are
        exported through (0 before any). Atomic across every process sharing the log."""

    @abstractmethod
    async def export_commit(
        self, moves: Sequence[tuple[str, int, int]], holder: str, hold_s: float
    ) -> list[str]:
        """Move each ``(root, before, after)`` export cursor from ``before`` to ``after`` where
        ``holder`` still holds it and it still stands at ``before`` (renewing the hold); returns
        the roots moved."""

    @abstractmethod
    async def export_behind(self, since: datetime, until: datetime, limit: int) -> list[str]:
        """Root runs last written between ``since`` and ``until`` whose last seq is past their
        export cursor (or that have none): what a crashed exporter left unsent."""

    async def runs(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        thread_id: str | None = None,
        updated_until: datetime | None = None,
    ) -> list[RunInfo]:
        """Runs newest first (by ``updated_at``, then ``run_id``), filtered by tenant, last state,
        activity time (``since`` ≤ ``updated_at`` ≤ ``updated_until``), creation (``until``) and thread."""
        filters = {"tenant = {}": tenant, "thread_id = {}": thread_id, "state = {}": state,
                   "updated_at >= {}": since, "created_at <= {}": until, "updated_at <= {}": updated_until}
        return await self._runs({sql: v for sql, v in filters.items() if v is not None}, limit)

    async def count_runs(
        self,
        *,
        cap: int,
        tenant: str | None = None,
        states: Sequence[str | None] | None = None,
        since: datetime | None = None,
        thread_id: str | None = None,
        run_ids: Sequence[str] | None = None,
    ) -> int:
        """How many runs :meth:`runs` would give with these filters and no limit, counted up to
        ``cap`` (one query, which stops there). ``states``: the last state is one of them (None for
        a run with none yet); ``run_ids``: the run is one of these."""
        conditions: list[tuple[str, Sequence[str | datetime]]] = [
            (sql, [value]) for sql, value in (("tenant = {}", tenant), ("thread_id = {}", thread_id),
                                              ("updated_at >= {}", since)) if value is not None]
        if states is not None:
            named = [state for state in states if state is not None]
            alternatives = [f"state IN ({', '.join(['{}'] * len(named))})"] if named else []
            if None in states:
                alternatives.append("state IS NULL")
            conditions.append(("(" + " OR ".join(alternatives or ["1 = 0"]) + ")", named))
        if run_ids is not None:
            conditions.append((f"run_id IN ({', '.join(['{}'] * len(run_ids))})" if run_ids else "1 = 0",
                               list(run_ids)))
        return await self._count_runs(conditions, cap)

    @abstractmethod
    async def _count_runs(self, conditions: list[tuple[str, Sequence[str | datetime]]], cap: int) -> int:
        """:meth:`count_runs`: the ``runs`` rows meeting every SQL condition (``{}`` stands for each
        of its values' placeholders, in order), counted up to ``cap``."""

    @abstractmethod
    async def _runs(self, filters: dict[str, str | datetime], limit: int) -> list[RunInfo]:
        """:meth:`runs`: the ``runs`` table's rows meeting every SQL condition of ``filters``
        (``{}`` stands for the value's placeholder), newest first, with their expiry."""

    def shortest_retention(self) -> timedelta:
        """The shortest time any policy keeps a run: nothing more recent can have expired."""
        return min(p.keep_for(s) for p in (self.retention, *self.tenant_retention.values())
                   for s in ("done", "error", None))

    def policy_for(self, tenant: str | None) -> RetentionPolicy:
        """The retention policy of a tenant (its override, else the default)."""
        if tenant is not None and tenant in self.tenant_retention:
            return self.tenant_retention[tenant]
        return self.retention

    def expiry(self, tenant: str | None, state: str | None, last_activity: datetime) -> datetime:
        """When a run with this tenant, state and last activity expires."""
        return last_activity + self.policy_for(tenant).keep_for(state)

    def with_expiry(self, info: RunInfo) -> RunInfo:
        """``info`` with ``expires_at`` under the current policy (it may have changed since)."""
        if info.updated_at is not None:
            info.expires_at = self.expiry(info.tenant, info.state, info.updated_at)
        return info

    async def require_run(self, run_id: str, *, now: datetime | None = None) -> RunInfo:
        """A run's metadata; raises UnknownRun when it is unknown or its retention expired."""
        info = await self.run(run_id)
        if info is None:
            raise UnknownRun(f"unknown run {run_id!r} (never stored, or already swept)")
        moment = now or self.clock()
        if info.expires_at is not None and info.expires_at <= moment:
            raise UnknownRun(f"run {run_id!r} expired at {info.expires_at.isoformat()}")
        return info

    @abstractmethod
    async def sweep(self, *, now: datetime | None = None, dry_run: bool = False) -> SweepResult:
        """Delete runs whose retention expired (per tenant policy)."""

    async def iter_jsonl(
        self, run_id: str, after: int = 0, batch: int = 20_000
    ) -> AsyncIterator[tuple[bytes, int]]:
        """A run's events as JSONL chunks: ``(lines, how many events)``, in seq order.

        Backends override this to stream the stored canonical bytes without
        decoding and re-encoding each event.
        """
        lines: list[bytes] = []
        async for event in self.iter_events(run_id, after, batch):
            lines.append(envelope.encode(event))
            if len(lines) >= batch:
                yield b"\n".join(lines) + b"\n", len(lines)
                lines = []
        if lines:
            yield b"\n".join(lines) + b"\n", len(lines)
