"""Fork a run: a new run whose history is another run's events up to a seq, open to continue.

:func:`fork_run` is the one fork: ``POST /v1/runs/{run_id}/fork``, a Durable
Streams ``PUT`` with ``Stream-Forked-From`` and ``runwire replay fork`` all call
it. It reads the source's raw delivery view from the replay log (its children's
events fanned in with ``child_id``, which they keep) up to ``at`` and appends it
as the fork's seqs ``1 … at``, each event as it was but for ``run_id`` (the
fork's) and ``parent_id``/``root_id`` (none: a fork is a root run of its own).

The last write carries the fork's **checkpoint of record** (the replay log's
``checkpoint``, :mod:`runwire.processing.logged`): next delivery seq ``at + 1``,
no publisher seqs seen (an agent publishing to the fork starts at its own seq 1,
as for any run), the source's tenant, every shaping window closed at ``at``. A
worker that gets the fork's first new event finds no checkpoint on the bus (or
the one written here) and continues from it — with either bus and either worker
runtime, the same path that continues a run whose bus lost its state. Given a
bus, the fork's hot views are written here too (the raw view with the same
checkpoint, and its shaped view), so a client reads the fork from the hot tier
at once; without one (the offline command) the first worker that continues the
fork rebuilds them from the log, and clients read the log until then.

The fork is recorded (:meth:`ReplayLog.record_fork`) before anything is copied:
the same fork asked again (same id, source and seq) completes a copy that was
cut short and answers as the first did; another fork or run under that id is
refused. Retention treats a fork as any run: its events are its own copy, so it
outlives its source.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import msgspec

from ..bus.ports import DeliveryStreams
from ..core import envelope, limits
from ..core.envelope import Event
from ..core.errors import QuotaExceeded, RequestError, StoreError, UnknownRun
from ..core.lines import encode_lines
from ..core.ulid import new_random_ulid
from ..processing.checkpoint import Checkpoint, encode_checkpoint
from ..processing.logged import hot_length, rebuilt_views
from ..processing.sequencing import SequencerState
from ..store.base import ForkPoint, RunInfo
from ..store.ports import RunHistory

COPY_BATCH = 2000
"""Events read and appended at a time (memory stays bounded however long the source is)."""


class RunExists(RequestError):
    """The id asked for a fork is another run's, or another fork's (409)."""

    status = 409
    grpc = "ALREADY_EXISTS"


class ForkResult(msgspec.Struct, kw_only=True):
    fork: ForkPoint
    created: bool
    """False when the same fork had been made already (it was completed, not made again)."""


async def fork_run(
    store: RunHistory,
    source_id: str,
    *,
    at: int | None = None,
    run_id: str | None = None,
    bus: DeliveryStreams | None = None,
    source: RunInfo | None = None,
) -> ForkResult:
    """Fork ``source_id`` at seq ``at`` (default: its last; 0: no history) into ``run_id`` (default:
    a new id).

    Raises :class:`~runwire.core.errors.UnknownRun` for a source the log does
    not hold, :class:`~runwire.core.errors.RequestError` (400) for a seq
    outside ``0 … last seq``, :class:`RunExists` (409) for an id that is taken,
    :class:`~runwire.core.errors.QuotaExceeded` (429) for a source with
    :data:`~runwire.core.limits.FORKS_PER_RUN` forks (:func:`check_fork`).
    ``source`` is the source's metadata when the caller has read it already.
    """
    info = source or await store.require_run(source_id)
    fork, existing = await check_fork(store, info, at=at, run_id=run_id)
    if existing is None and (recorded := await store.record_fork(fork)) != fork:  # (made meanwhile)
        raise RunExists(f"run id {fork.run_id!r} is taken (a fork of {recorded.source_id!r} at seq {recorded.at})")
    if existing is None or existing.last_seq < fork.at:  # new, or a copy cut short: (the rest of) the copy
        tail, state = await _copy(store, fork, info.tenant, bus)
        if bus is not None:
            _, appends = rebuilt_views(fork.run_id, state, tail)
            await bus.append_many([append for append in appends if append[0][1] == "shaped"])
            await bus.append_many([append for append in appends if append[0][1] == "raw"])
    return ForkResult(fork=fork, created=existing is None)


async def check_fork(
    store: RunHistory, source: RunInfo, *, at: int | None, run_id: str | None
) -> tuple[ForkPoint, RunInfo | None]:
    """What :func:`fork_run` checks before it writes anything: the fork (its seq, its id) and the run
    its id already names (the same fork asked again), or the error it would raise — a seq outside
    the source (400), a taken id (409), a source forked :data:`~runwire.core.limits.FORKS_PER_RUN`
    times already (QuotaExceeded, 429). An entrance calls it before it claims the fork's id."""
    source_id = source.run_id
    at = source.last_seq if at is None else at
    if not 0 <= at <= source.last_seq:
        raise RequestError(f"cannot fork run {source_id!r} at seq {at}: "
                           + (f"past its end (its last seq is {source.last_seq})" if at > 0 else "no such seq"))
    fork = ForkPoint(run_id=run_id or new_random_ulid("run_"), source_id=source_id, at=at)
    if fork.run_id == source_id:
        raise RunExists(f"a fork needs an id of its own, not its source's ({source_id!r})")
    existing = await store.run(fork.run_id)
    points = await store.fork_points([source_id, fork.run_id])
    recorded = next((f for f in points if f.run_id == fork.run_id), None)
    if recorded is not None or existing is not None:
        if recorded != fork:
            raise RunExists(f"run id {fork.run_id!r} is taken" + (
                f" (a fork of {recorded.source_id!r} at seq {recorded.at})" if recorded is not None else ""))
    elif sum(1 for f in points if f.source_id == source_id) >= limits.FORKS_PER_RUN:
        raise QuotaExceeded(f"run {source_id!r} has {limits.FORKS_PER_RUN} forks, the most one run may have; "
                            "fork one of its forks, or remove some")
    else:
        await _check_depth(store, source_id, points)
    return fork, existing


async def _check_depth(store: RunHistory, source_id: str, points: list[ForkPoint]) -> None:
    """QuotaExceeded when ``source_id`` is :data:`~runwire.core.limits.FORK_DEPTH` forks down from
    the run its chain began with (at most that many lookups)."""
    chain = [source_id]
    parent = next((f for f in points if f.run_id == source_id), None)
    while parent is not None:
        chain.append(parent.source_id)
        if len(chain) > limits.FORK_DEPTH:
            raise QuotaExceeded(
                f"run {source_id!r} is a fork of a fork {limits.FORK_DEPTH} deep (its chain: "
                f"{' <- '.join(chain[:3])} <- …), the deepest forks go; fork a run higher up its chain")
        found = await store.fork_points([parent.source_id])
        parent = next((f for f in found if f.run_id == parent.source_id), None)


async def _copy(
    store: RunHistory, fork: ForkPoint, tenant: str | None, bus: DeliveryStreams | None
) -> tuple[list[Event], bytes]:
    """Append the source's events ``1 … at`` as the fork's; the last write carries the checkpoint.
    Returns the copied events the hot tier keeps (the last ``hot_length`` of them) and the checkpoint."""
    tail: deque[Event] = deque(maxlen=hot_length(bus) if bus is not None else 1)
    batch: list[Event] = []
    expected, terminal = 1, False
    async for event in store.iter_events(fork.source_id, after=0, batch=COPY_BATCH):
        if event.seq > fork.at:
            break
        if event.seq != expected:
            raise StoreError(f"run {fork.source_id!r} lacks seq {expected} in the replay log: cannot fork it")
        expected += 1
        copy = envelope.replace(event, run_id=fork.run_id, parent_id=None, root_id=None)
        terminal = terminal or (copy.child_id is None and envelope.is_terminal(copy))
        batch.append(copy)
        tail.append(copy)
        if len(batch) >= COPY_BATCH and copy.seq < fork.at:
            await _append(store, fork.run_id, batch, None)
            batch = []
    if expected <= fork.at:
        raise UnknownRun(f"run {fork.source_id!r} has no seq {expected} in the replay log (swept meanwhile?)")
    state = checkpoint(fork.at, tenant, terminal=terminal)
    if batch:  # (a fork at seq 0 has no history: a new run, recorded as a fork)
        await _append(store, fork.run_id, batch, state)
    return list(tail), state


def checkpoint(at: int, tenant: str | None, *, terminal: bool = False) -> bytes:
    """A fork's checkpoint of record: delivery seq ``at`` given, no publisher seq seen, the tenant
    decided, every shaping window closed at ``at`` (the shaped view is ``shape`` of the copy)."""
    return encode_checkpoint(Checkpoint(
        sequencer=SequencerState(last_seq=at, terminal=terminal, owned=True, tenant=tenant), shaped_seq=at))


async def _append(store: RunHistory, run_id: str, events: Sequence[Event], state: bytes | None) -> None:
    await store.append_streams([(run_id, events, encode_lines(events), state)])
