"""Canonical events for tests: the one factory every test builds events with."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from runwire.core.envelope import Event, format_ts, make

T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""The time test events are stamped relative to."""
_YEAR = 365 * 86_400


def event(
    run_id: str,
    seq: int,
    type: str = "text.delta",
    payload: Mapping[str, Any] | None = None,
    *,
    text: str | None = None,
    second: float | None = None,
    ts: str | None = None,
    id: str | None = None,
    **fields: Any,
) -> Event:
    """An event of ``run_id`` at ``seq``.

    ``payload`` defaults to ``{"text": text}`` for a delta (``text`` defaults to
    ``"t<seq>"``) and to ``{}`` otherwise. ``id`` defaults to
    ``evt_<run_id>_<seq>``, so the same (run, seq) is the same event when built
    twice (a redelivery). ``ts`` defaults to ``T0`` + ``second`` seconds
    (``second`` defaults to ``seq``, or 0 for a seq beyond a year of seconds). Other envelope fields (``child_id``,
    ``tenant``, ``parent_id``, ``span`` …) pass through.
    """
    if payload is None:
        payload = {"text": f"t{seq}" if text is None else text} if type.endswith(".delta") else {}
    if ts is None:
        offset = (seq if seq < _YEAR else 0) if second is None else second
        ts = format_ts(T0 + timedelta(seconds=offset))
    return make(type, payload, id=id or f"evt_{run_id}_{seq:06d}", ts=ts, run_id=run_id, seq=seq, **fields)


def deltas(run_id: str, first: int, last: int, **fields: Any) -> list[Event]:
    """``text.delta`` events of ``run_id`` at seqs ``first`` … ``last``."""
    return [event(run_id, seq, **fields) for seq in range(first, last + 1)]
