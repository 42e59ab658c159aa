"""The replay log's ports: what each caller uses of it, as a small Protocol. Every backend's
:class:`~runwire.store.base.ReplayLog` is all of them; a caller names the ones it needs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Protocol

from ..core.envelope import Event
from .base import ForkPoint, LoggedRun, LogStream, RunInfo, RunOwner
from .producers import Reservation


class EventLog(Protocol):
    """The replay log's events: appended by workers (idempotent on ``(run_id, seq)``), read by
    resumes, exports and jobs."""

    async def append(self, events: Sequence[Event]) -> int: ...

    async def append_encoded(self, rows: Sequence[tuple[Event, bytes]]) -> int: ...

    async def append_streams(self, streams: Sequence[LogStream]) -> int: ...

    async def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[Event]: ...

    def iter_events(self, run_id: str, after: int = 0, batch: int = 5000) -> AsyncIterator[Event]: ...

    def iter_jsonl(self, run_id: str, after: int = 0, batch: int = 20_000) -> AsyncIterator[tuple[bytes, int]]: ...

    async def first_seq(self, run_id: str) -> int | None: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the log answers."""


class RunCatalogue(Protocol):
    """The runs the log holds: one entry per run (its tree, tenant, state, counts, retention),
    listed and counted by filters, with its forks and its checkpoint of record."""

    async def run(self, run_id: str) -> RunInfo | None: ...

    async def require_run(self, run_id: str, *, now: datetime | None = None) -> RunInfo: ...

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunInfo]: ...

    async def logged_runs(self, run_ids: Sequence[str]) -> dict[str, LoggedRun]: ...

    async def runs(
        self, *, tenant: str | None = None, state: str | None = None, since: datetime | None = None,
        until: datetime | None = None, limit: int = 100, thread_id: str | None = None,
        updated_until: datetime | None = None,
    ) -> list[RunInfo]: ...

    async def count_runs(
        self, *, cap: int, tenant: str | None = None, states: Sequence[str | None] | None = None,
        since: datetime | None = None, thread_id: str | None = None, run_ids: Sequence[str] | None = None,
    ) -> int: ...

    async def record_fork(self, fork: ForkPoint) -> ForkPoint: ...

    async def fork_points(self, run_ids: Sequence[str]) -> list[ForkPoint]: ...

    async def with_forks(self, infos: Sequence[RunInfo]) -> list[RunInfo]: ...


class RunHistory(EventLog, RunCatalogue, Protocol):
    """A run's events with its catalogue entry: what a resume, a replay or a fork reads."""


class Ownership(Protocol):
    """Which tenant (and tree) a run id belongs to: claimed once by its first writer."""

    async def claim_run(self, run_id: str, tenant: str, root_id: str) -> RunOwner: ...

    async def run_owner(self, run_id: str) -> RunOwner | None: ...


class DurableState(Protocol):
    """Durable Streams' write state per run: created, closed, its producers' last batches."""

    async def stream_create(self, run_id: str) -> bool: ...

    async def stream_state(self, run_id: str) -> tuple[int, bool] | None: ...

    async def stream_reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, *, close: bool,
        hold_s: float, digest: str = "",
    ) -> Reservation: ...

    async def stream_release(self, run_id: str) -> None: ...


class SpanCursor(Protocol):
    """The span exporter's place in each root run, held by one exporter at a time."""

    async def export_claim(self, roots: Sequence[str], holder: str, hold_s: float) -> dict[str, int]: ...

    async def export_commit(self, moves: Sequence[tuple[str, int, int]], holder: str, hold_s: float) -> list[str]: ...

    async def export_behind(self, since: datetime, until: datetime, limit: int) -> list[str]: ...
