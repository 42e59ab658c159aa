"""Per-run statistics from a run's stored events, computed in one streaming pass.

Counts cover every event stored under the run, child events fanned in
included (``child_events`` says how many of them). Tokens, drops and the
final state count only the run's own events, as in the replay log's run
metadata, so a parent does not count its children's usage twice.
"""

from __future__ import annotations

import msgspec

from ..core.envelope import Event, Gap, RunLifecycle, ToolEnd, ToolStart, Usage, ts_ms


class RunStats(msgspec.Struct, kw_only=True):
    """What ``runwire replay stats`` prints for one run."""

    run_id: str
    events: int = 0
    by_type: dict[str, int] = {}
    child_events: int = 0
    children: list[str] = []
    first_ts: str | None = None
    last_ts: str | None = None
    duration_ms: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dropped: int = 0
    """Publisher seq gaps (``x.gap``) plus drops reported in ``run.lifecycle``."""
    state: str | None = None


class StatsCollector:
    """Folds events into :class:`RunStats`, one at a time."""

    def __init__(self, run_id: str) -> None:
        self.stats = RunStats(run_id=run_id)
        self._children: dict[str, None] = {}
        self._first_ms: int | None = None
        self._last_ms: int | None = None

    def add(self, event: Event) -> None:
        stats = self.stats
        stats.events += 1
        stats.by_type[event.type] = stats.by_type.get(event.type, 0) + 1
        self._track_time(event.ts)
        if isinstance(event, ToolStart):
            stats.tool_calls += 1
        elif isinstance(event, ToolEnd) and not event.payload.ok:
            stats.tool_errors += 1
        if event.child_id is not None:
            stats.child_events += 1
            self._children.setdefault(event.child_id)
            return
        self._own(event)

    def _own(self, event: Event) -> None:
        stats = self.stats
        if isinstance(event, Usage):
            stats.input_tokens += event.payload.input_tokens
            stats.output_tokens += event.payload.output_tokens
        elif isinstance(event, Gap):
            stats.dropped += event.payload.last - event.payload.first + 1
        elif isinstance(event, RunLifecycle):
            stats.state = event.payload.state
            stats.dropped += event.payload.dropped_count or 0

    def _track_time(self, ts: str) -> None:
        moment = ts_ms(ts)
        if self._first_ms is None or moment < self._first_ms:
            self._first_ms, self.stats.first_ts = moment, ts
        if self._last_ms is None or moment > self._last_ms:
            self._last_ms, self.stats.last_ts = moment, ts

    def result(self) -> RunStats:
        stats = self.stats
        stats.children = list(self._children)
        if self._first_ms is not None and self._last_ms is not None:
            stats.duration_ms = self._last_ms - self._first_ms
        stats.by_type = dict(sorted(stats.by_type.items()))
        return stats
