"""A frame: one event's encoded bytes for one format, shared by every client of that format.

An event is encoded **once per format** by its feed (see ``hub.py``); each
transport then frames those bytes once (SSE, NDJSON) and the same ``bytes``
object is written to every client. SSE framing is a few bytes per frame
(``id: N\\ndata: …\\n\\n``), so it is written here on the pre-encoded bytes
rather than through ``sse-starlette``, whose per-client ``ServerSentEvent``
objects would re-render every frame once per client. Encoding per client is what makes fan-out cost grow with clients.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ...core.envelope import Event

DROP_REASONING = 0
DROP_TEXT = 1
NEVER_DROP = 2
"""Drop ranks (Koder agent stream §4 R4): reasoning deltas go first, then text deltas; the rest never."""

_RANKS = {"reasoning.delta": DROP_REASONING, "text.delta": DROP_TEXT}
_json = msgspec.json.Encoder()

VariantFactory = Callable[[int], list[bytes]]


def drop_rank(event: Event, frame_count: int) -> int:
    """Drop rank (§4 R4) of an event's frames.

    A delta whose encoding is more than one frame also opens or closes
    something in its format (AG-UI ``TEXT_MESSAGE_START``, AI SDK
    ``text-start``); dropping it would break the client's framing, so it is
    kept like a control event.
    """
    rank = _RANKS.get(event.type, NEVER_DROP)
    return rank if frame_count <= 1 else NEVER_DROP


class Frame:
    """The encoded output of one event (or a preamble/error) for one format."""

    __slots__ = ("_encoded", "_ndjson", "_sse", "event_type", "payloads", "rank", "seq", "size", "terminal", "variant")

    def __init__(
        self,
        payloads: list[bytes],
        *,
        seq: int | None,
        rank: int = NEVER_DROP,
        terminal: bool = False,
        event_type: str = "",
        variant: VariantFactory | None = None,
    ) -> None:
        self.payloads = payloads
        self.seq = seq
        self.rank = rank
        self.terminal = terminal
        self.event_type = event_type
        self.variant = variant
        """For a terminal ``run.lifecycle``: its frames re-encoded with a client's ``dropped_count``."""
        self.size = sum(len(p) for p in payloads) + 16 * len(payloads) + 24
        self._sse: bytes | None = None
        self._ndjson: bytes | None = None
        self._encoded: dict[str, bytes] | None = None

    def sse(self) -> bytes:
        """SSE bytes: one ``data:`` event per payload, ``id: seq`` on the last one (cached)."""
        if self._sse is None:
            self._sse = render_sse(self.payloads, self.seq)
        return self._sse

    def ndjson(self) -> bytes:
        """NDJSON bytes: one payload a line (cached)."""
        if self._ndjson is None:
            self._ndjson = b"".join(p + b"\n" for p in self.payloads)
        return self._ndjson

    def encoded(self, kind: str, render: Callable[[Frame], bytes]) -> bytes:
        """This frame rendered by ``render`` (a gRPC message), once for every client (cached by ``kind``)."""
        cache = self._encoded
        if cache is None:
            cache = self._encoded = {}
        data = cache.get(kind)
        if data is None:
            data = cache[kind] = render(self)
        return data

    def with_dropped(self, dropped: int) -> Frame:
        """This terminal frame as one client sees it after ``dropped`` slow-client drops."""
        if not dropped or self.variant is None:
            return self
        return Frame(self.variant(dropped), seq=self.seq, terminal=True, event_type=self.event_type)


class Batch(list[Frame]):
    """Frames fanned out to every client of a feed at once (``Feed.fan_out``). What a direct
    write needs of them (docs/edge.md § Performance) is worked out once for the batch, not once
    per client: their seqs' range, whether one ends the stream, their SSE and NDJSON bytes."""

    __slots__ = ("_ndjson", "_sse", "first_seq", "last_seq", "terminal")

    def __init__(self, frames: list[Frame]) -> None:
        super().__init__(frames)
        seqs = [frame.seq for frame in frames if frame.seq is not None]
        self.first_seq: int | None = seqs[0] if seqs else None
        self.last_seq: int | None = max(seqs) if seqs else None
        self.terminal = any(frame.terminal for frame in frames)
        self._sse: bytes | None = None
        self._ndjson: bytes | None = None

    def sse(self) -> bytes:
        """The frames' SSE bytes, joined once."""
        if self._sse is None:
            self._sse = b"".join(frame.sse() for frame in self)
        return self._sse

    def ndjson(self) -> bytes:
        """The frames' NDJSON bytes, joined once."""
        if self._ndjson is None:
            self._ndjson = b"".join(frame.ndjson() for frame in self)
        return self._ndjson


def render_sse(payloads: list[bytes], seq: int | None) -> bytes:
    """SSE framing of pre-encoded JSON payloads (each is one line: JSON has no raw newline)."""
    parts: list[bytes] = []
    last = len(payloads) - 1
    for index, payload in enumerate(payloads):
        if index == last and seq is not None:
            parts.append(b"id: %d\ndata: %s\n\n" % (seq, payload))
        else:
            parts.append(b"data: %s\n\n" % payload)
    if not payloads and seq is not None:
        # An id-only event moves EventSource's Last-Event-ID without dispatching anything.
        parts.append(b"id: %d\n\n" % seq)
    return b"".join(parts)


def error_frame(code: str, message: str) -> Frame:
    """A stream error (``KAI-STREAM-CONN-0002``, ``KAI-STREAM-BUF-0001``) sent just before closing."""
    body = _json.encode({"type": "error", "code": code, "message": message})
    return Frame([body], seq=None, terminal=True, event_type="error")
