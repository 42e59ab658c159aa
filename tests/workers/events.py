"""Event builders for the worker tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from runwire.core.envelope import Event, format_ts
from tests.events import event

BASE = datetime(2026, 5, 14, 19, 42, 13, tzinfo=UTC)


def at(ms: float) -> str:
    """An RFC 3339 timestamp ``ms`` milliseconds after a fixed base."""
    return format_ts(BASE + timedelta(milliseconds=ms))


class RunScript:
    """Publishes one run's events the way the SDK does: publisher seq from 1, parent links set."""

    def __init__(self, run_id: str, *, parent: str | None = None, root: str | None = None) -> None:
        self.run_id = run_id
        self.parent = parent
        self.root = root
        self.seq = 0

    def event(self, type: str, payload: dict[str, Any], ms: float = 0) -> Event:
        self.seq += 1
        links: dict[str, Any] = {}
        if self.parent is not None:
            links["parent_id"] = self.parent
            links["root_id"] = self.root or self.parent
        return event(self.run_id, self.seq, type, payload, ts=at(ms), **links)

    def text(self, text: str, ms: float = 0) -> Event:
        return self.event("text.delta", {"text": text}, ms)

    def reasoning(self, text: str, ms: float = 0) -> Event:
        return self.event("reasoning.delta", {"text": text}, ms)

    def tool_start(self, call_id: str, ms: float = 0) -> Event:
        return self.event("tool.start", {"call_id": call_id, "tool": "browser"}, ms)

    def spawn(self, child: str, ms: float = 0) -> Event:
        return self.event("child.spawn", {"child_id": child}, ms)

    def lifecycle(self, state: str, ms: float = 0) -> Event:
        return self.event("run.lifecycle", {"state": state}, ms)
