"""Shaping (Koder agent stream §4, R1 and R3): the *shaped* view of one delivery stream.

§4 R1 — ``reasoning.delta`` and ``text.delta`` are coalesced per
``(child_id, type)`` in windows of 100 ms of **event time** (``ts``), each
window anchored at its first delta; the texts are concatenated in order. A
window closes when a later delta of the stream has ``ts`` at or past its end,
when a non-delta event arrives (§4 R3), or, live, when the wall clock passes its
end (:meth:`DeltaCoalescer.tick`) so an agent's last words are not held back.

One source (a run, or one child in a parent stream) streams reasoning and
text one after the other, so a delta of the other type closes that source's
open window: its span then never reaches over the other type's seqs, and the
spans of a stream whose children do not stream at the same time tile its seq
space (Koder agent stream §7 T2: a client checks ``span[0] == previous seq +
1``). Windows of children streaming at the same time overlap; there only the raw
view lets a client check for drops.

§4 R3 — any other event first flushes the stream's pending deltas, then goes out
at once, never batched, its raw seq unchanged.

A shaped delta has ``seq`` = the last raw seq it covers and
``span = (first, last)``. Closing windows go out in order of their last raw
seq (closing one window first closes every pending window that ends before
it), so the shaped stream's seq strictly increases and an idempotent append
never drops a shaped event.

Given the raw events and their timestamps the result is deterministic:
:func:`shape` (replay, export, catch-up) gives what the live path gave when
the events arrived in time. The coalescer's open windows are part of the
worker's checkpoint (:class:`ShaperState`), so a successor resumes them exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from .envelope import Event, ReasoningDelta, TextDelta, TextPayload, replace, ts_ms

WINDOW_MS = 100
"""§4 R1's aggregation window: at most 10 shaped deltas per second per (child, type)."""


class Window(msgspec.Struct, kw_only=True):
    """Open deltas of one (child_id, type) in one stream."""

    last: ReasoningDelta | TextDelta
    """The newest delta (its envelope is the shaped event's envelope)."""
    texts: list[str]
    first_seq: int
    end_ms: int


class ShaperState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A coalescer's open windows, keyed ``"<child_id>|<type>"``, in opening order."""

    windows: dict[str, Window] = {}


Delta = ReasoningDelta | TextDelta
_KEY_SUFFIX: dict[type, str] = {
    ReasoningDelta: "|" + ReasoningDelta.type_name,
    TextDelta: "|" + TextDelta.type_name,
}
"""A window's key is ``"<child_id>|<type>"``; the delta classes' suffixes."""
_OTHER: dict[str, str] = {
    _KEY_SUFFIX[ReasoningDelta]: _KEY_SUFFIX[TextDelta],
    _KEY_SUFFIX[TextDelta]: _KEY_SUFFIX[ReasoningDelta],
}
"""The suffix of the other delta type: a source's switch between the two closes its open window."""


class DeltaCoalescer:
    """Shapes one delivery stream: feed raw events in seq order, get shaped events."""

    __slots__ = ("_first_end", "state", "window_ms")

    def __init__(self, state: ShaperState | None = None, *, window_ms: int = WINDOW_MS) -> None:
        self.state = state if state is not None else ShaperState()
        self.window_ms = window_ms
        self._first_end = _first_end(self.state.windows)
        """The earliest end of an open window (cached: checked for every delta)."""

    @property
    def pending(self) -> bool:
        """True while some deltas wait in an open window."""
        return bool(self.state.windows)

    def feed(self, event: Event) -> list[Event]:
        """One raw event (delivery seq set) → the shaped events now ready, in seq order."""
        out: list[Event] = []
        self.feed_into(event, out)
        return out

    def feed_into(self, event: Event, out: list[Event]) -> None:
        """:meth:`feed`, appending the shaped events now ready to ``out``."""
        suffix = _KEY_SUFFIX.get(type(event))
        windows = self.state.windows
        if suffix is None:  # not a delta (§4 R3): flush, then the event itself
            if windows:
                out.extend(self._close(_always))
            out.append(event)
            return
        now = ts_ms(event.ts)
        if self._first_end <= now and windows:
            out.extend(self._close(lambda window: window.end_ms <= now))
        child = event.child_id
        key = child + suffix if child else suffix
        if windows:
            other = windows.get(child + _OTHER[suffix] if child else _OTHER[suffix])
            if other is not None:  # one source switched between reasoning and text
                out.extend(self._close(lambda window: window is other))
        window = windows.get(key)
        if window is None:
            end_ms = now + self.window_ms
            windows[key] = Window(
                last=event, texts=[event.payload.text], first_seq=event.seq, end_ms=end_ms  # type: ignore[arg-type,union-attr]
            )
            if end_ms < self._first_end:
                self._first_end = end_ms
        else:
            window.last = event  # type: ignore[assignment]
            window.texts.append(event.payload.text)  # type: ignore[union-attr]

    def tick(self, now_ms: int, grace_ms: int = 0) -> list[Event]:
        """Close windows whose end (plus ``grace_ms`` for transport latency) has passed."""
        return self._close(lambda window: window.end_ms + grace_ms <= now_ms)

    def flush(self) -> list[Event]:
        """Close every open window (§4 R3: before any non-delta event; at the end of a replay)."""
        if not self.state.windows:
            return []
        return self._close(_always)

    def _close(self, due: Callable[[Window], bool]) -> list[Event]:
        windows = self.state.windows
        if not windows:
            return []
        closing = [key for key, window in windows.items() if due(window)]
        if not closing:
            return []
        # Keep seq increasing: a window ending before a closing one closes with it.
        horizon = max(windows[key].last.seq for key in closing)
        closing = [key for key, window in windows.items() if window.last.seq <= horizon]
        closed = sorted((windows.pop(key) for key in closing), key=lambda w: w.last.seq)
        self._first_end = _first_end(windows)
        return [_shaped(window) for window in closed]


def _always(window: Window) -> bool:
    return True


def _first_end(windows: dict[str, Window]) -> float:
    return min((window.end_ms for window in windows.values()), default=float("inf"))


def _shaped(window: Window) -> Event:
    last = window.last
    text = window.texts[0] if len(window.texts) == 1 else "".join(window.texts)
    return replace(last, payload=TextPayload(text=text), span=(window.first_seq, last.seq))


def shape(raw_events: Iterable[Event], *, window_ms: int = WINDOW_MS) -> list[Event]:
    """The shaped view of one stream's raw events (seq order), as the live path makes it."""
    coalescer = DeltaCoalescer(window_ms=window_ms)
    out: list[Event] = []
    for event in raw_events:
        out.extend(coalescer.feed(event))
    out.extend(coalescer.flush())
    return out
