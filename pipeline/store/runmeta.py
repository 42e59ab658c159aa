"""Run metadata maintained on append, shared by every replay log backend.

:func:`summarize` folds the *newly stored* events of one append into one
:class:`RunDelta` per run; a backend merges it into its runs table with an
upsert (counts add up, the later lifecycle state wins by seq). Only a run's
own events (``child_id`` unset) move its state, tokens and drops and give its
thread: a child's ``run.lifecycle done`` fanned into the parent does not end
the parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import msgspec

from ..envelope import TERMINAL_STATES, Event, Gap, RunLifecycle, Usage


class RunDelta(msgspec.Struct, kw_only=True):
    """What one append adds to a run's metadata."""

    run_id: str
    tenant: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    thread_id: str | None = None
    state: str | None = None
    state_seq: int = 0
    events: int = 0
    first_seq: int = 0
    last_seq: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dropped: int = 0
    first_ts: str | None = None
    last_ts: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


_METERED: frozenset[type] = frozenset({RunLifecycle, Usage, Gap})


def _meter(delta: RunDelta, event: Event) -> None:
    """State, tokens and drops from one of the run's own lifecycle/usage/gap events."""
    if isinstance(event, RunLifecycle):
        if event.seq >= delta.state_seq:
            delta.state, delta.state_seq = event.payload.state, event.seq
        delta.dropped += event.payload.dropped_count or 0
    elif isinstance(event, Usage):
        delta.input_tokens += event.payload.input_tokens
        delta.output_tokens += event.payload.output_tokens
    elif isinstance(event, Gap):
        delta.dropped += event.payload.last - event.payload.first + 1


_seq = attrgetter("seq")
_ts = attrgetter("ts")
_tenant = attrgetter("tenant")
_parent = attrgetter("parent_id")
_thread = attrgetter("thread_id")


def summarize_run(run_id: str, events: Sequence[Event]) -> RunDelta:
    """The metadata delta of one run's newly stored events (any order, at least one).

    Called for every stream of every worker write: the passes over the
    events are C-level (``map``) except where a rare field is present.
    """
    seqs = list(map(_seq, events))
    stamps = list(map(_ts, events))
    delta = RunDelta(
        run_id=run_id, events=len(events), first_seq=min(seqs), last_seq=max(seqs),
        first_ts=min(stamps), last_ts=max(stamps),
    )
    tenants = set(map(_tenant, events))
    if tenants != _ONLY_NONE:
        delta.tenant = next(t for t in map(_tenant, events) if t is not None)
    if set(map(_parent, events)) != _ONLY_NONE:
        linked = next((e for e in events if e.parent_id is not None and e.child_id is None), None)
        if linked is not None:
            delta.parent_id, delta.root_id = linked.parent_id, linked.root_id
    if set(map(_thread, events)) != _ONLY_NONE:
        delta.thread_id = next(
            (e.thread_id for e in events if e.thread_id is not None and e.child_id is None), None)
    if not _METERED.isdisjoint(map(type, events)):
        for event in events:
            if type(event) in _METERED and event.child_id is None:
                _meter(delta, event)
    return delta


_ONLY_NONE = {None}


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
