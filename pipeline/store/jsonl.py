"""JSONL import into a replay log: one canonical envelope a line.

Import reports bad lines with their number and code and keeps the good ones. (Export, in
any format, is :func:`runwire.jobs.replay.export_run`.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec

from ..core import envelope
from ..core.envelope import Event
from ..core.errors import LineError, ProtocolError, line_error
from .base import ReplayLog


class ImportReport(msgspec.Struct, kw_only=True):
    """What :func:`import_jsonl` did."""

    lines: int = 0
    """Non-blank lines read."""
    added: int = 0
    """Events newly stored (re-importing the same file adds 0)."""
    runs: list[str] = []
    errors: list[LineError] = []


def decode_line(number: int, line: bytes) -> tuple[Event, bytes] | LineError:
    """One JSONL line → the event and its canonical bytes, or the line's error."""
    try:
        event = envelope.decode(line)
        envelope.ts_ms(event.ts)  # a real instant, as the workers require: nothing imported breaks a read
    except ProtocolError as exc:
        return line_error(number, exc)
    return event, envelope.encode(event)


class _Appender:
    """Appends one batch while the next is decoded: one append in flight at a time."""

    def __init__(self, log: ReplayLog) -> None:
        self.log = log
        self.added = 0
        self._inflight: asyncio.Task[int] | None = None

    async def submit(self, rows: list[tuple[Event, bytes]]) -> None:
        await self.wait()
        self._inflight = asyncio.create_task(self.log.append_encoded(rows))
        await asyncio.sleep(0)  # let it reach the database before decoding goes on

    async def wait(self) -> None:
        if self._inflight is not None:
            task, self._inflight = self._inflight, None
            self.added += await task


async def import_jsonl(
    log: ReplayLog, lines: Iterable[bytes], *, batch: int = 20_000
) -> ImportReport:
    """Append JSONL events to ``log`` (idempotent on ``(run_id, seq)``), ``batch`` at a time.

    Invalid lines are reported with their line number and error code; the
    valid lines around them are kept. Decoding a batch overlaps with storing the previous one (the database
    works in its own thread or server process meanwhile).
    """
    report = ImportReport()
    runs: dict[str, None] = {}
    pending: list[tuple[Event, bytes]] = []
    appender = _Appender(log)
    try:
        for number, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line:
                continue
            report.lines += 1
            decoded = decode_line(number, line)
            if isinstance(decoded, LineError):
                report.errors.append(decoded)
                continue
            pending.append(decoded)
            runs.setdefault(decoded[0].run_id)
            if len(pending) >= batch:
                await appender.submit(pending)
                pending = []
            elif not report.lines % 2048:
                await asyncio.sleep(0)  # keep the event loop (and a PostgreSQL COPY) moving
        if pending:
            await appender.submit(pending)
    finally:
        await appender.wait()
    report.added = appender.added
    report.runs = list(runs)
    return report
