"""What a protocol codec is.

An **ingest** codec turns frames of one format into canonical events; an
**egress** codec turns canonical events into frames of one format. Both are
stateful per stream (a Loom stream learns its run id from ``run_start``; an
AG-UI stream tracks which messages are open), so one instance serves one run.

Egress state is per *stream*, not per client: the edge keeps one encoder per
(run, view, format, profile) and writes the same bytes to every client of it.
A client that joins mid-stream first gets :meth:`Egress.preamble` — frames
that re-open whatever the format needs open (AG-UI's verifyEvents rejects
content for a message whose start it never saw).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import msgspec

from ..core.envelope import Event

_json = msgspec.json.Encoder()


class Ingest(ABC):
    """Frames of one format → canonical events, for one stream."""

    name: ClassVar[str]
    line_based: ClassVar[bool] = True
    """NDJSON formats get one line per :meth:`feed`; raw formats get arbitrary chunks."""

    def __init__(self, *, run_id: str | None = None) -> None:
        self.default_run_id = run_id

    @abstractmethod
    def feed(self, data: bytes) -> list[Event]:
        """Decode one frame (or, for raw formats, one chunk) into 0..n events.

        Raises :class:`~runwire.core.errors.ProtocolError` for a bad frame; the
        codec stays usable for the frames after it.
        """

    def close(self) -> list[Event]:
        """End of input: events still held back (e.g. an unterminated block)."""
        return []


class Egress(ABC):
    """Canonical events → frames of one format, for one stream."""

    name: ClassVar[str]
    media_type: ClassVar[str] = "application/json"
    headers: ClassVar[dict[str, str]] = {}
    """Extra HTTP response headers this format's clients expect."""

    @abstractmethod
    def convert(self, event: Event) -> list[Any]:
        """One event → 0..n JSON-ready frames (dicts), updating stream state."""

    def finish(self) -> list[Any]:
        """Frames that close the stream when it ends without a terminal event."""
        return []

    def preamble(self) -> list[Any]:
        """Frames a client joining now needs before the next event."""
        return []

    def encode(self, event: Event) -> list[bytes]:
        """:meth:`convert`, JSON-encoded once for every client."""
        return [_json.encode(frame) for frame in self.convert(event)]

    def encode_all(self, events: Iterable[Event]) -> list[bytes]:
        out: list[bytes] = []
        for event in events:
            out.extend(self.encode(event))
        return out
