"""Run metadata maintained on append, shared by every replay log backend.

:func:`summarize` folds the *newly stored* events of one append into one
:class:`RunDelta` per run; a backend merges it into its runs table with an
upsert (counts add up, the later lifecycle state wins by seq). Only a run's
own events (``child_id`` unset) move its state, tokens and drops and give its
thread: a child's ``run.lifecycle done`` fanned into the parent does not end
the parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from ..core.envelope import INT64_MAX, TERMINAL_STATES, Event, Gap, RunLifecycle, Usage
from .base import LoggedRun, LogStream, RunFields, RunInfo
from .outbox_schema import AWAITING_APPROVAL, FINISHED, Notice


class RunDelta(RunFields, kw_only=True):
    """What one append adds to a run's metadata."""

    state_seq: int = 0
    first_seq: int = 0
    checkpoint: bytes | None = None
    """The write's checkpoint of the run's raw stream (kept if ``last_seq`` is at or past the
    stored one; ``last_seq`` is then the write's last seq, see :func:`with_checkpoint`)."""
    notices: tuple[Notice, ...] = ()
    """What subscribers hear of these events: the run's end, its requests for approval
    (stored with the events, in the same transaction: ``outbox.py``)."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


METERED: frozenset[type] = frozenset({RunLifecycle, Usage, Gap})
"""The events that move a run's state, tokens and drops (:func:`_meter`)."""


def _meter(delta: RunDelta, event: Event) -> None:
    """State, tokens and drops from one of the run's own lifecycle/usage/gap events."""
    if isinstance(event, RunLifecycle):
        if event.seq >= delta.state_seq:
            delta.state, delta.state_seq = event.payload.state, event.seq
        if event.payload.state in _NOTIFIED:
            delta.notices = (*delta.notices, _notice(event))
        delta.dropped = _add(delta.dropped, event.payload.dropped_count or 0)
    elif isinstance(event, Usage):
        delta.input_tokens = _add(delta.input_tokens, event.payload.input_tokens)
        delta.output_tokens = _add(delta.output_tokens, event.payload.output_tokens)
    elif isinstance(event, Gap):
        delta.dropped = _add(delta.dropped, event.payload.last - event.payload.first + 1)


_NOTIFIED = TERMINAL_STATES | {"awaiting_approval"}


def _notice(event: RunLifecycle) -> Notice:
    """The notice of one of a run's own lifecycle events: its end (once per run), or a request
    for approval (once per event)."""
    state = event.payload.state
    finished = state in TERMINAL_STATES
    return Notice(
        key=event.run_id if finished else f"{event.run_id} {event.seq}",
        type=FINISHED if finished else AWAITING_APPROVAL, run_id=event.run_id,
        root_id=event.root_id or event.run_id, tenant=event.tenant, state=state, seq=event.seq, ts=event.ts,
    )


def _add(total: int, more: int) -> int:
    """Counters saturate at the largest BIGINT: an agent's absurd figures must not stop the writes."""
    return min(INT64_MAX, total + max(0, more))


def stream_summary(stream: LogStream) -> RunDelta:
    """The metadata delta of a write's part for one run, all of whose events are newly stored and
    ascending: from what the worker summed as it admitted them (:func:`summary_delta`) when
    the part carries it, else read from the events (:func:`summarize_run`)."""
    summary = stream[4] if len(stream) > 4 else None
    if summary is None:
        return summarize_run(stream[0], stream[1], ascending=True)
    return summary_delta(stream[0], summary)


def summary_delta(run_id: str, summary: Any) -> RunDelta:
    """:func:`summarize_run` of a run's ascending events, from what was summed of them as they were
    admitted (``runwire.core._native.RunSummary``: the same reads, in the same order)."""
    delta = RunDelta(run_id=run_id, events=summary.count, first_seq=summary.first_seq,
                     last_seq=summary.last_seq, first_ts=summary.first_ts, last_ts=summary.last_ts)
    if summary.tenant is not None:
        delta.tenant = summary.tenant
    if summary.linked:
        delta.parent_id, delta.root_id = summary.parent_id, summary.root_id
    if summary.thread_id is not None:
        delta.thread_id = summary.thread_id
    for event in summary.metered or ():
        _meter(delta, event)
    return delta


def summarize_run(run_id: str, events: Sequence[Event], *, ascending: bool = False) -> RunDelta:
    """The metadata delta of one run's newly stored events (any order, at least one;
    ``ascending``: in seq order, as a caller that checked it says).

    Called for every stream of every worker write, on the log's thread: each
    pass over the events is a comprehension or a loop that stops at its first
    hit, whose attribute reads the interpreter specializes — about a third of
    the CPU of ``map`` over ``attrgetter`` (timed on a ``bench/workers.py`` write's events).
    """
    if ascending:
        first_seq, last_seq = events[0].seq, events[-1].seq
    else:
        seqs = [event.seq for event in events]
        first_seq, last_seq = min(seqs), max(seqs)
    stamps = [event.ts for event in events]
    delta = RunDelta(
        run_id=run_id, events=len(events), first_seq=first_seq, last_seq=last_seq,
        first_ts=min(stamps), last_ts=max(stamps),
    )
    for event in events:
        if event.tenant is not None:
            delta.tenant = event.tenant
            break
    for event in events:
        if event.parent_id is not None and event.child_id is None:
            delta.parent_id, delta.root_id = event.parent_id, event.root_id
            break
    for event in events:
        if event.thread_id is not None and event.child_id is None:
            delta.thread_id = event.thread_id
            break
    if not METERED.isdisjoint(map(type, events)):
        for event in events:
            if type(event) in METERED and event.child_id is None:
                _meter(delta, event)
    return delta


def with_checkpoint(delta: RunDelta, checkpoint: bytes | None, last_seq: int) -> RunDelta:
    """``delta`` carrying the checkpoint of the write it came from, whose last seq is ``last_seq``.

    Every event of the write is stored once it commits (new or already
    there), so its last seq is a true ``last_seq`` even when the newly stored
    events end before it; the checkpoint is kept only where that is at or
    past the run's stored ``last_seq`` (:func:`upsert_run_sql`).
    """
    if checkpoint is not None:
        delta.checkpoint = checkpoint
        delta.last_seq = max(delta.last_seq, last_seq)
    return delta


def summarize(events: Sequence[Event]) -> dict[str, RunDelta]:
    """Per-run metadata deltas of newly stored events."""
    if not events:
        return {}
    first_run = events[0].run_id
    if all(event.run_id == first_run for event in events):
        return {first_run: summarize_run(first_run, events)}
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event.run_id, []).append(event)
    return {run_id: summarize_run(run_id, group) for run_id, group in groups.items()}


RUN_COLUMNS = (
    "run_id, tenant, parent_id, root_id, state, terminal, events, last_seq, input_tokens,"
    " output_tokens, dropped, first_ts, last_ts, created_at, updated_at, expires_at, thread_id"
)
"""The columns of ``runs`` that :func:`run_info` maps, in its order."""


def _same(value: Any) -> Any:
    return value


def run_info(row: Sequence[Any], moment: Callable[[Any], datetime | None] = _same) -> RunInfo:
    """A ``SELECT {RUN_COLUMNS}`` row as RunInfo; ``moment`` reads a stored time."""
    return RunInfo(
        run_id=row[0], tenant=row[1], parent_id=row[2], root_id=row[3], state=row[4],
        terminal=bool(row[5]), events=row[6], last_seq=row[7], input_tokens=row[8],
        output_tokens=row[9], dropped=row[10], first_ts=row[11], last_ts=row[12],
        created_at=moment(row[13]), updated_at=moment(row[14]), expires_at=moment(row[15]),
        thread_id=row[16],
    )


def logged_run(info: RunInfo, checkpoint: bytes | None) -> LoggedRun:
    """``info`` with its checkpoint of record (the ``checkpoint`` column, read after the others)."""
    return LoggedRun(**msgspec.structs.asdict(info), checkpoint=None if checkpoint is None else bytes(checkpoint))


STATE_AFTER_MERGE = ("CASE WHEN excluded.state IS NOT NULL AND excluded.state_seq >= runs.state_seq"
                     " THEN excluded.state ELSE runs.state END")
"""The ``state`` a run has once :func:`upsert_run_sql` merged a delta into it (an SQL expression)."""


def upsert_run_sql(param: str, greatest: str, expires: str | None = None) -> str:
    """The statement merging one :class:`RunDelta` into ``runs`` (18 values, see the
    backends), in a dialect: its placeholder and its two-argument maximum.

    With ``expires`` (an SQL expression over ``runs`` and ``excluded``), a 19th
    value sets ``expires_at`` of a new run, and ``expires`` that of a merged one.
    The checkpoint (the 18th value) replaces the stored one only when given and
    when the delta's ``last_seq`` is at or past the run's: it never moves back.
    """
    values = ", ".join([param] * (18 if expires is None else 19))
    expiry_column = "" if expires is None else ", expires_at"
    expiry_update = "" if expires is None else f"\n    expires_at = {expires},"
    return f"""
INSERT INTO runs (run_id, tenant, parent_id, root_id, thread_id, state, state_seq, terminal,
                  events, last_seq, input_tokens, output_tokens, dropped, first_ts, last_ts,
                  created_at, updated_at, checkpoint{expiry_column})
VALUES ({values})
ON CONFLICT (run_id) DO UPDATE SET
    tenant = coalesce(runs.tenant, excluded.tenant),
    parent_id = coalesce(runs.parent_id, excluded.parent_id),
    root_id = coalesce(runs.root_id, excluded.root_id),
    thread_id = coalesce(runs.thread_id, excluded.thread_id),
    state = {STATE_AFTER_MERGE},{expiry_update}
    terminal = CASE WHEN excluded.state IS NOT NULL AND excluded.state_seq >= runs.state_seq
                    THEN excluded.terminal ELSE runs.terminal END,
    state_seq = {greatest}(runs.state_seq, excluded.state_seq),
    events = runs.events + excluded.events,
    last_seq = {greatest}(runs.last_seq, excluded.last_seq),
    input_tokens = CASE WHEN runs.input_tokens > {INT64_MAX} - excluded.input_tokens THEN {INT64_MAX}
                 ELSE runs.input_tokens + excluded.input_tokens END,
    output_tokens = CASE WHEN runs.output_tokens > {INT64_MAX} - excluded.output_tokens THEN {INT64_MAX}
                 ELSE runs.output_tokens + excluded.output_tokens END,
    dropped = CASE WHEN runs.dropped > {INT64_MAX} - excluded.dropped THEN {INT64_MAX}
                 ELSE runs.dropped + excluded.dropped END,
    first_ts = CASE WHEN runs.first_ts IS NULL OR excluded.first_ts < runs.first_ts
                    THEN excluded.first_ts ELSE runs.first_ts END,
    last_ts = CASE WHEN runs.last_ts IS NULL OR excluded.last_ts > runs.last_ts
                   THEN excluded.last_ts ELSE runs.last_ts END,
    updated_at = {greatest}(runs.updated_at, excluded.updated_at),
    checkpoint = CASE WHEN excluded.checkpoint IS NOT NULL AND excluded.last_seq >= runs.last_seq
                      THEN excluded.checkpoint ELSE runs.checkpoint END
RETURNING tenant, state, updated_at
"""
