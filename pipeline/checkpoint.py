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
    """The seq of the last shaped event emitted. Closing windows (a tick) moves the
    shaped view but not the sequencer, so progress is ``(sequencer.last_seq, shaped_seq)``."""


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
    """Whether a stored checkpoint holds open shaping windows."""
    return bool(data) and bool(_decoder.decode(data).shaper.windows)  # type: ignore[arg-type]


def settle_windows(data: bytes, shaped_last: int) -> bytes:
    """A checkpoint with the windows the shaped view already shows taken out.

    A writer appends a write's shaped events before the raw append that
    stores its checkpoint; a writer that died between the two left a
    checkpoint whose windows are open although the shaped view has them. A
    successor that kept them open would let later deltas join a window the
    clients already saw, and send it again with a span reaching back over
    events since (Koder agent stream §7 T2: spans would overlap). Windows
    close in order of their last raw seq, every window ending before a
    closing one with it, so each open window whose last seq is at or below
    the shaped view's last seq was emitted.
    """
    checkpoint = _decoder.decode(data)
    windows = checkpoint.shaper.windows
    emitted = [key for key, window in windows.items() if window.last.seq <= shaped_last]
    if not emitted and checkpoint.shaped_seq >= shaped_last:
        return data
    for key in emitted:
        del windows[key]
    checkpoint.shaped_seq = max(checkpoint.shaped_seq, shaped_last)
    return _encoder.encode(checkpoint)
