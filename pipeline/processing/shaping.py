"""Shaping (Koder agent stream §4, R1 and R3): the *shaped* view of one delivery stream.

§4 R1 — ``reasoning.delta`` and ``text.delta`` are coalesced per
``(child_id, type)``: each source (the run itself, or one child in a parent
stream) has at most one open window per type, whatever the other types and
sources do meanwhile, and its texts are concatenated in order (text and
reasoning never share an event, §1). A window spans 100 ms of the stream's
**event time** from its opening: the stream's clock is the latest ``ts`` of
its deltas since its last non-delta event (a running maximum, so a source
whose clock lags cannot make the others' windows shorter, nor its own). A
window closes when the clock reaches its end, or, live, when the wall clock
passes its end (:meth:`DeltaCoalescer.tick`) so an agent's last words are not
held back. A source's next window of a type therefore opens at least 100 ms
of event time after the one before, and a shaped delta's ``ts`` is its
window's opening on that clock: between two control events the shaped deltas
of one (source, type) are at least 100 ms apart — at most 10 a second,
however the types alternate and however many children stream at once.

§4 R3 — any other event first flushes every window of the stream (and resets
its clock), then goes out at once, never batched, its raw seq unchanged.

**Seq and span** (Koder agent stream §7 T2 on the shaped view). A shaped delta
has ``seq`` = the last raw seq it holds (and that delta's ``id``). Windows of
one stream overlap in seq space (two children, or reasoning and text of one
source, streaming at once), so a closed window waits while an open window of the stream holds an earlier
raw seq, and windows go out in order of their last raw seq: the shaped
stream's seq strictly increases and an idempotent append never drops one.
``span = [first, last]`` says which stretch of the seq space an event
*accounts for*: ``first`` is one past the previous event of the shaped view,
``last`` its own seq. The spans of the shaped view therefore tile the seq
space — every event's ``span[0]`` (``seq`` for an event without a span) is the
previous event's seq + 1 — and a client that finds ``span[0]`` past its last
seq + 1 missed something. A delta's text is the whole window's, which may have
opened before ``span[0]`` (its other deltas lay under another window's
stretch). Input with a hole in its raw seqs (a replay log missing events)
leaves the hole uncovered, so the client sees it too.

Given the raw events and their timestamps the result is deterministic:
:func:`shape` (replay, export, catch-up) gives what the live path gave when
the events arrived in time. Every window is closed after a non-delta event,
so shaping can also start at any non-delta event (:func:`shape` with
``after``) and reach the same state the live path was in there. The
coalescer's windows are part of the worker's checkpoint
(:class:`ShaperState`), so a successor resumes them exactly: the checkpoint
keeps each window's span of raw seqs, not its deltas, which the raw view
already holds — a successor reads them back from there (``raw`` of
:class:`DeltaCoalescer`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

import msgspec

from ..core.envelope import Event, ReasoningDelta, TextDelta, TextPayload, format_ts, replace, ts_ms

log = logging.getLogger(__name__)

WINDOW_MS = 100
"""§4 R1's aggregation window: at most 10 shaped deltas per second per (child, type)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Window(msgspec.Struct, kw_only=True):
    """Deltas of one (child_id, type) in one stream: the raw seqs ``first_seq`` … ``last_seq``
    of that key (their texts are the coalescer's, :attr:`DeltaCoalescer.texts`)."""

    first_seq: int
    last_seq: int
    """The newest delta's seq (its envelope is the shaped event's envelope)."""
    end_ms: int
    ts: str = ""
    """When the window opened, on the stream's clock: the shaped event's ``ts``."""


class ShaperState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A coalescer's windows: what a successor needs to continue exactly."""

    windows: dict[str, Window] = {}
    """Open windows, keyed ``"<child_id>|<type>"``, in opening order."""
    held: list[Window] = []
    """Closed windows waiting for an open one with an earlier last seq, in last-seq order."""
    clock: int = 0
    """The stream's event time (ms): the latest delta ``ts`` since its last non-delta event."""
    closes: dict[str, list[int]] = {}
    """Where the windows of a writer that died closed after its checkpoint (key → last seqs, from
    the shaped view it had appended): replaying the same raw events, its successor closes them
    at the same deltas, so it sends the same windows whatever the dead writer's wall-clock ticks
    did (see :func:`runwire.processing.checkpoint.settle_windows`)."""


Delta = ReasoningDelta | TextDelta
_KEY_SUFFIX: dict[type, str] = {
    ReasoningDelta: "|" + ReasoningDelta.type_name,
    TextDelta: "|" + TextDelta.type_name,
}
"""A window's key is ``"<child_id>|<type>"``; the delta classes' suffixes."""


class DeltaCoalescer:
    """Shapes one delivery stream: feed raw events in seq order, get shaped events.

    ``state`` restored from a checkpoint needs ``raw``: the stream's raw events its windows
    span (at least), for their deltas (:func:`window_deltas`)."""

    __slots__ = ("_first_end", "fed", "floor", "state", "texts", "window_ms")

    def __init__(
        self,
        state: ShaperState | None = None,
        *,
        window_ms: int = WINDOW_MS,
        floor: int = 0,
        fed: int | None = None,
        raw: Iterable[Event] = (),
    ) -> None:
        self.state = state if state is not None else ShaperState()
        self.texts: dict[int, list[Any]] = {
            first: [deltas[-1], *[delta.payload.text for delta in deltas]]
            for first, deltas in window_deltas(self.state, raw).items()} if self.pending else {}
        """Each window's newest delta, then its deltas' texts in seq order, by its first seq (kept
        here, not in the checkpoint). A text is read as its delta comes, while the delta is in the
        CPU's caches: read from the deltas when the window closes, those reads cost 0.2 µs a
        delta (``bench/processor.py``)."""
        self.window_ms = window_ms
        self.floor = floor
        """The seq of the last shaped event out (the next one's span starts after it)."""
        self.fed = fed
        """The last raw seq fed, when the input's seqs are to be checked for holes (None: not checked;
        the live path's input is contiguous by the sequencer's construction)."""
        self._first_end = _first_end(self.state.windows)
        """The earliest end of an open window (cached: checked for every delta)."""

    @property
    def pending(self) -> bool:
        """True while some deltas wait in a window."""
        return bool(self.state.windows or self.state.held)

    def feed(self, event: Event) -> list[Event]:
        """One raw event (delivery seq set) → the shaped events now ready, in seq order."""
        out: list[Event] = []
        self.feed_into(event, out)
        return out

    def feed_into(self, event: Event, out: list[Event]) -> None:
        """:meth:`feed`, appending the shaped events now ready to ``out``."""
        state = self.state
        fed = self.fed
        if fed is not None:
            if event.seq > fed + 1:  # a hole in the input: leave it uncovered (T2)
                self._emit_all(out)
                self.floor = event.seq - 1
            self.fed = event.seq
        suffix = _KEY_SUFFIX.get(type(event))
        if suffix is None:  # not a delta (§4 R3): flush, then the event itself
            if state.windows or state.held:
                self._emit_all(out)
            state.clock = 0
            if state.closes:
                self._forget_closes(event.seq)
            if event.seq > self.floor:
                out.append(event)
                self.floor = event.seq
            return
        now = ts_ms(event.ts)
        clock = state.clock
        if now > clock:
            state.clock = clock = now
        windows = state.windows
        if self._first_end <= clock:
            self._expire(clock)
        child = event.child_ref  # (UNSET or None: the stream's own)
        key = child + suffix if child else suffix
        window = windows.get(key)
        if window is None:
            end_ms = clock + self.window_ms
            windows[key] = Window(first_seq=event.seq, last_seq=event.seq, end_ms=end_ms,
                                  ts=event.ts if now == clock else format_millis(clock))
            self.texts[event.seq] = [event, event.payload.text]  # type: ignore[union-attr]  # a delta
            if end_ms < self._first_end:
                self._first_end = end_ms
        else:
            window.last_seq = event.seq
            texts = self.texts[window.first_seq]
            texts[0] = event
            texts.append(event.payload.text)  # type: ignore[union-attr]  # a delta
        if state.closes and key in state.closes:
            self._replay_close(key, event.seq)
        if state.held:
            self._release(out)

    def tick(self, now_ms: int, grace_ms: int = 0) -> list[Event]:
        """Close windows whose end (plus ``grace_ms`` for transport latency) has passed by ``now_ms``."""
        out: list[Event] = []
        if self._first_end + grace_ms <= now_ms:
            ends = self._expire(now_ms - grace_ms)
            # the stream's event time has passed those ends: a late delta opens its window there
            self.state.clock = max(self.state.clock, ends)
        if self.state.held:
            self._release(out)
        return out

    def flush(self) -> list[Event]:
        """Close every window (§4 R3: before any non-delta event; at the end of a replay)."""
        out: list[Event] = []
        self._emit_all(out)
        return out

    def _expire(self, clock: int) -> int:
        """Close the open windows that end at or before ``clock`` (they wait in ``held``); their latest end."""
        windows = self.state.windows
        due = [key for key, window in windows.items() if window.end_ms <= clock]
        if not due:
            return 0
        held = self.state.held
        closed = [windows.pop(key) for key in due]
        held.extend(closed)
        held.sort(key=_last_seq)
        self._first_end = _first_end(windows)
        return int(max(map(_END_MS, closed)))

    def _replay_close(self, key: str, seq: int) -> None:
        """Close ``key``'s window at ``seq`` when the writer before this one closed it there."""
        state = self.state
        seqs = state.closes[key]
        while seqs and seqs[0] < seq:
            seqs.pop(0)
        if seqs and seqs[0] == seq:
            seqs.pop(0)
            state.held.append(state.windows.pop(key))
            state.held.sort(key=_last_seq)
            self._first_end = _first_end(state.windows)
        if not seqs:
            del state.closes[key]

    def _forget_closes(self, seq: int) -> None:
        closes = self.state.closes
        for key in list(closes):
            closes[key] = [s for s in closes[key] if s > seq]
            if not closes[key]:
                del closes[key]

    def _release(self, out: list[Event]) -> None:
        """Send the closed windows that end before every open one (so seq keeps increasing)."""
        held = self.state.held
        bound = min(map(_last_seq, self.state.windows.values()), default=None)
        count = len(held) if bound is None else 0
        if bound is not None:
            while count < len(held) and held[count].last_seq < bound:
                count += 1
        if count:
            for window in held[:count]:
                self._send(window, out)
            del held[:count]

    def _emit_all(self, out: list[Event]) -> None:
        state = self.state
        if not (state.windows or state.held):
            return
        closing = sorted([*state.held, *state.windows.values()], key=_last_seq)
        state.held = []
        state.windows = {}
        self._first_end = _NO_END
        for window in closing:
            self._send(window, out)

    def _send(self, window: Window, out: list[Event]) -> None:
        texts = self.texts.pop(window.first_seq)
        if window.last_seq > self.floor:  # else the shaped view has it (a successor's replay)
            out.append(self._shaped(window, texts))

    def _shaped(self, window: Window, texts: list[Any]) -> Event:
        last: Delta = texts[0]
        text = texts[1] if len(texts) == 2 else "".join(texts[1:])
        first, self.floor = self.floor + 1, last.seq
        return replace(
            last, ts=window.ts or last.ts, payload=TextPayload(text=text), span=(first, last.seq)
        )


def format_millis(millis: int) -> str:
    """An RFC 3339 timestamp (milliseconds, ``Z``) of milliseconds since the epoch."""
    return format_ts(_EPOCH + timedelta(milliseconds=millis))


_last_seq = attrgetter("last_seq")
"""A window's last seq (C-level: read for every window a close or a release looks at)."""
_END_MS = attrgetter("end_ms")
_FIRST_SEQ = attrgetter("first_seq")


_NO_END = 1 << 62
"""The first window's end when none is open (later than any ``ts``: an int, as the ends are)."""


def _first_end(windows: dict[str, Window]) -> int:
    return min(map(_END_MS, windows.values()), default=_NO_END)


def window_key(event: Event) -> str | None:
    """The key of the window a delta (raw or shaped) belongs to; None for any other event."""
    suffix = _KEY_SUFFIX.get(type(event))
    if suffix is None:
        return None
    return event.child_id + suffix if event.child_id else suffix


def window_deltas(state: ShaperState, raw: Iterable[Event]) -> dict[int, list[Delta]]:
    """The deltas of ``state``'s windows (open and held) by first seq, from the stream's raw
    events: a window's are the deltas of its key (that of the delta at its first seq) within its
    span — a key has one window at a time, so those are all of them.

    A window whose deltas ``raw`` lacks (a replay log that lost them) is dropped from ``state``,
    with a warning: its text cannot reach the shaped view, and the raw view keeps what it has."""
    windows = [*state.held, *state.windows.values()]
    if not windows:
        return {}
    start = min(map(_FIRST_SEQ, windows))
    by_seq = {event.seq: event for event in raw if event.seq >= start and type(event) in _KEY_SUFFIX}
    found: dict[int, list[Delta]] = {}
    for window in windows:
        opening = by_seq.get(window.first_seq)
        key = window_key(opening) if opening is not None else None
        deltas = [event for seq in range(window.first_seq, window.last_seq + 1)
                  if (event := by_seq.get(seq)) is not None and window_key(event) == key]
        if deltas and deltas[-1].seq == window.last_seq:
            found[window.first_seq] = deltas  # type: ignore[assignment]  # deltas (their suffix)
    lost = [window for window in windows if window.first_seq not in found]
    if lost:
        log.warning("the raw events of %d shaping window(s) from seq %d are missing; their text"
                    " is left out of the shaped view", len(lost), lost[0].first_seq)
        state.held = [window for window in state.held if window.first_seq in found]
        state.windows = {key: window for key, window in state.windows.items() if window.first_seq in found}
    return found


def is_delta(event: Event) -> bool:
    """Whether shaping coalesces ``event`` (every window is closed after any other event)."""
    return type(event) in _KEY_SUFFIX


def shape(raw_events: Iterable[Event], *, window_ms: int = WINDOW_MS, after: int = 0) -> list[Event]:
    """The shaped view of one stream's raw events (seq order), as the live path makes it.

    ``after`` is the seq the events follow: 0 for a stream from its start, or the
    seq of a non-delta event (every window was closed there, so the result is
    the live shaped view after it).
    """
    coalescer = DeltaCoalescer(window_ms=window_ms, floor=after, fed=after)
    out: list[Event] = []
    for event in raw_events:
        coalescer.feed_into(event, out)
    out.extend(coalescer.flush())
    return out
