"""Run metadata maintained on append, shared by every replay log backend.

:func:`summarize` folds the *newly stored* events of one append into one
:class:`RunDelta` per run; a backend merges it into its runs table with an
upsert (counts add up, the later lifecycle state wins by seq). Only a run's
own events (``child_id`` unset) move its state, tokens and drops: a child's
``run.lifecycle done`` fanned into the parent does not end the parent.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ..envelope import DELTA_TYPES, TERMINAL_STATES, Event, Gap, RunLifecycle, Usage


class RunDelta(msgspec.Struct, kw_only=True):
    """What one append adds to a run's metadata."""

    run_id: str
    tenant: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
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


def _fold(delta: RunDelta, event: Event) -> None:
    seq, ts = event.seq, event.ts
    if delta.events == 0 or seq < delta.first_seq:
        delta.first_seq = seq
    if seq > delta.last_seq:
        delta.last_seq = seq
    if delta.events == 0:
        delta.first_ts = delta.last_ts = ts
    elif ts < delta.first_ts:  # type: ignore[operator]
        delta.first_ts = ts
    elif ts > delta.last_ts:  # type: ignore[operator]
        delta.last_ts = ts
    delta.events += 1
    if delta.tenant is None:
        delta.tenant = event.tenant
    if event.child_id is not None:
        return
    if delta.parent_id is None and event.parent_id is not None:
        delta.parent_id, delta.root_id = event.parent_id, event.root_id
    if event.type in DELTA_TYPES:
        return
    if isinstance(event, RunLifecycle):
        if seq >= delta.state_seq:
            delta.state, delta.state_seq = event.payload.state, seq
        delta.dropped += event.payload.dropped_count or 0
    elif isinstance(event, Usage):
        delta.input_tokens += event.payload.input_tokens
        delta.output_tokens += event.payload.output_tokens
    elif isinstance(event, Gap):
        delta.dropped += event.payload.last - event.payload.first + 1


def summarize(events: Iterable[Event]) -> dict[str, RunDelta]:
    """Per-run metadata deltas of newly stored events."""
    deltas: dict[str, RunDelta] = {}
    for event in events:
        delta = deltas.get(event.run_id)
        if delta is None:
            delta = deltas[event.run_id] = RunDelta(run_id=event.run_id)
        _fold(delta, event)
    return deltas
