"""A delivery stream's checkpoint: what its writer stores with each raw append to resume exactly.

A successor worker restores it before it touches the stream (the sequencer's
next seq and dedupe state, the open shaping windows), so a takeover continues
where the dead writer stopped. Checkpoints are msgpack; this module also
settles a checkpoint against the shaped view its writer already appended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..core.envelope import Event
from .sequencing import SequencerState
from .shaping import ShaperState, window_key


class Checkpoint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stream's writer stores with each raw append to resume exactly."""

    sequencer: SequencerState = msgspec.field(default_factory=SequencerState)
    shaper: ShaperState = msgspec.field(default_factory=ShaperState)
    shaped_seq: int = 0
    """The seq of the last shaped event emitted (the next shaped span starts after it). Closing
    windows (a tick) moves the shaped view but not the sequencer, so progress is
    ``(sequencer.last_seq, shaped_seq)``."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Checkpoint)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    return _encoder.encode(checkpoint)


def decode_checkpoint(data: bytes) -> Checkpoint:
    """A stored checkpoint, of this version or of the one before (whose windows held their
    newest delta and their texts: read as their spans, the deltas are read back from the raw
    view as for any other)."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as error:
        try:
            return _from_texts(msgspec.msgpack.decode(data))
        except (msgspec.ValidationError, AttributeError, KeyError, TypeError):
            raise error from None


def _from_texts(old: dict[str, Any]) -> Checkpoint:
    shaper = old.get("shaper", {})
    for window in [*shaper.get("windows", {}).values(), *shaper.get("held", [])]:
        window["last_seq"] = window.pop("last")["seq"]
        window.pop("texts")
    return msgspec.convert(old, Checkpoint)


def unsent_windows(data: bytes | None) -> int | None:
    """The shaped seq of a stored checkpoint that holds windows not sent yet (None: it holds none).

    Only such a checkpoint needs :func:`settle_windows` (and a read of the
    shaped view): replaying the raw events after one without windows gives
    the shaped events its writer sent, since only a wall-clock tick closing a
    window can make the two differ — and a tick closes windows of a stream
    that has been quiet for a while, which are in the stored checkpoint
    unless they opened in the very write that died (a write that merged
    batches processed while the one before was in flight for over 250 ms).
    """
    if not data:
        return None
    checkpoint = decode_checkpoint(data)
    shaper = checkpoint.shaper
    return checkpoint.shaped_seq if shaper.windows or shaper.held else None


def window_span(data: bytes | None) -> tuple[int, int] | None:
    """The raw seqs a stored checkpoint's windows span, first to last (None: it holds none): a
    restore reads those raw events back for the windows' deltas (the checkpoint keeps spans)."""
    if not data:
        return None
    shaper = decode_checkpoint(data).shaper
    windows = [*shaper.held, *shaper.windows.values()]
    if not windows:
        return None
    return min(window.first_seq for window in windows), max(window.last_seq for window in windows)


def settle_windows(data: bytes, shaped: Sequence[Event]) -> bytes:
    """A checkpoint that continues the shaped view its writer already appended past it.

    ``shaped`` is the shaped view after the checkpoint's ``shaped_seq``. A
    writer appends a write's shaped events before the raw append that stores
    its checkpoint; one that died between the two left a checkpoint behind
    the shaped view clients saw. Its successor replays the same raw events
    (they were never acked), and shaping them again from the checkpoint
    gives the same windows — except where the dead writer's wall-clock tick
    closed one that a replayed delta would now join, sending its text again
    (Koder agent stream §4 R1: every character once). So the windows close
    where the shaped view says they did: a window of the checkpoint already
    sent is closed now, and each later one at the delta the view shows as
    its last (:attr:`ShaperState.closes`). Events at or below the view's last
    seq go out again only to be dropped, so spans continue from it (§7 T2).
    """
    checkpoint = decode_checkpoint(data)
    sent = [e for e in shaped if e.seq > checkpoint.shaped_seq]
    if not sent:
        return data
    shaper = checkpoint.shaper
    closes: dict[str, list[int]] = {}
    for event in sent:
        key = window_key(event)
        if key is not None:
            closes.setdefault(key, []).append(event.seq)
    for key, window in list(shaper.windows.items()):
        seqs = closes.get(key)
        if seqs and window.last_seq in seqs:
            shaper.held.append(shaper.windows.pop(key))
            seqs.remove(window.last_seq)
    shaper.held.sort(key=lambda window: window.last_seq)
    shaper.closes = {key: seqs for key, seqs in closes.items() if seqs}
    checkpoint.shaped_seq = sent[-1].seq
    return _encoder.encode(checkpoint)
