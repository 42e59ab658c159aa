"""JSONL import: one canonical envelope a line, bad lines reported, good ones kept."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import envelope
from ..envelope import Event
from ..errors import ProtocolError
from .base import ImportReport, LineError

if TYPE_CHECKING:
    from .base import ReplayLog


def decode_line(number: int, line: bytes) -> tuple[Event, bytes] | LineError:
    """One JSONL line → the event and its canonical bytes, or the line's error."""
    try:
        event = envelope.decode(line)
    except ProtocolError as exc:
        code = exc.code or "KAI-STREAM-PROTO-0001"
        where = f" at `{exc.field}`" if exc.field else ""
        return LineError(line=number, code=code, message=exc.message + where)
    return event, envelope.encode(event)


async def import_lines(
    log: ReplayLog, lines: Iterable[bytes], *, batch: int = 20_000
) -> ImportReport:
    """Decode ``lines`` and append them to ``log`` in batches of ``batch`` events."""
    report = ImportReport()
    runs: dict[str, None] = {}
    pending: list[tuple[Event, bytes]] = []
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
            report.added += await log.append_encoded(pending)
            pending = []
    if pending:
        report.added += await log.append_encoded(pending)
    report.runs = list(runs)
    return report
