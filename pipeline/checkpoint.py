"""A delivery stream's checkpoint: what its writer stores with each raw append to resume exactly.

A successor worker restores it before it touches the stream (the sequencer's
next seq and dedupe state, the open shaping windows), so a takeover continues
where the dead writer stopped. Checkpoints are msgpack; this module also picks
the furthest ahead of several stored ones and settles a checkpoint against the
shaped view its writer already appended.
"""

from __future__ import annotations

import msgspec

from .sequencing import SequencerState
from .shaping import ShaperState


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
    return _decoder.decode(data)


def newest_checkpoint(*stored: bytes | None) -> bytes | None:
    """Of several stored checkpoints of one stream, the one furthest ahead.

    Ahead by delivery seq, then by shaped seq: a tick that closed windows
    wrote a checkpoint with the same delivery seq as the one before it, and
    restoring that earlier one would close the same windows again.
    """
    best: bytes | None = None
    best_key = (-1, -1)
    for data in stored:
        if data:
            checkpoint = _decoder.decode(data)
            key = (checkpoint.sequencer.last_seq, checkpoint.shaped_seq)
            if key > best_key:
                best, best_key = data, key
    return best


def open_windows(data: bytes | None) -> bool:
    """Whether a stored checkpoint holds shaping windows not sent yet (open or held)."""
    if not data:
        return False
    shaper = _decoder.decode(data).shaper
    return bool(shaper.windows or shaper.held)


def settle_windows(data: bytes, shaped_last: int) -> bytes:
    """A checkpoint with the windows the shaped view already shows taken out.

    A writer appends a write's shaped events before the raw append that
    stores its checkpoint; a writer that died between the two left a
    checkpoint whose windows are open (or held) although the shaped view has
    them. A successor that kept them would let later deltas join a window
    the clients already saw and send its text again (Koder agent stream §7
    T2 and §4 R1: every character once). Windows go out in order of their
    last raw seq, and one goes out only once no window of the stream ends
    before it, so each window whose last seq is at or below the shaped
    view's last seq was emitted; the shaped view's last seq is also where
    the next span starts.
    """
    checkpoint = _decoder.decode(data)
    shaper = checkpoint.shaper
    emitted = [key for key, window in shaper.windows.items() if window.last.seq <= shaped_last]
    held = [window for window in shaper.held if window.last.seq > shaped_last]
    if not emitted and len(held) == len(shaper.held) and checkpoint.shaped_seq >= shaped_last:
        return data
    for key in emitted:
        del shaper.windows[key]
    shaper.held = held
    checkpoint.shaped_seq = max(checkpoint.shaped_seq, shaped_last)
    return _encoder.encode(checkpoint)
