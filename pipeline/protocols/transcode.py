"""One stream from an ingest format to an egress format, frame by frame.

:class:`Transcoder` is what ``runwire convert`` (and anything else that turns
a file of one format into another) runs: it feeds each frame to the ingest
codec, passes the events to the egress codec and collects the encoded
frames; a rejected frame becomes a :class:`~runwire.core.errors.ProtocolError`
tagged with its line number while the frames around it go on. At the end it
flushes the ingest codec and, when the stream had no terminal event, asks the
egress codec for the frames that close it.
"""

from __future__ import annotations

import msgspec

from ..core.envelope import Event, is_terminal
from ..core.errors import ProtocolError
from . import egress as egress_codec
from . import ingest as ingest_codec
from .base import Egress, Ingest

_json = msgspec.json.Encoder()


class Transcoder:
    """Frames of ``source`` format in, encoded frames of ``target`` format out."""

    def __init__(self, source: str, target: str, *, run_id: str | None = None) -> None:
        options = {"run_id": run_id} if run_id else {}
        self.ingest: Ingest = ingest_codec(source, **options)
        self.egress: Egress = egress_codec(target)
        self.terminated = False
        self.rejected = 0

    @property
    def line_based(self) -> bool:
        """True when the source format is NDJSON (one frame a line)."""
        return self.ingest.line_based

    def feed(self, data: bytes, line: int) -> tuple[list[bytes], ProtocolError | None]:
        """Encoded output for one frame (or raw chunk) and the error if it was rejected."""
        try:
            events = self.ingest.feed(data)
        except ProtocolError as exc:
            self.rejected += 1
            return [], exc.at_line(line)
        return self._encode(events), None

    def close(self) -> list[bytes]:
        """Frames still held by the ingest codec, then the egress codec's closing frames."""
        out = self._encode(self.ingest.close())
        if not self.terminated:
            out.extend(_json.encode(frame) for frame in self.egress.finish())
        return out

    def _encode(self, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        for event in events:
            out.extend(self.egress.encode(event))
            self.terminated = self.terminated or is_terminal(event)
        return out
