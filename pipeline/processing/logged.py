"""The replay log as the checkpoint of record: what a worker takes from it when the bus has none.

A worker's write goes to the replay log first, each run's part with its raw
stream's checkpoint (``ReplayLog.append_streams``), then to the bus's views
with the same checkpoints. When the bus lost a stream's checkpoint (Redis
restarted without persistence, flushed, failed over to a replica that missed
writes) the log's is the one left: a run that ended longer ago than the bus
keeps checkpoints is *retired* (:func:`retired_checkpoint`), any other run
with a logged checkpoint continues from it (:func:`continued_checkpoint`) and
its hot delivery streams are rebuilt from the log (:func:`rebuilt_views`), so
clients of the hot tier see the whole live run again. Pure functions; the
reads and appends are ``Stages``'.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bus import Append
from ..bus.options import BusOptions
from ..core.envelope import Event
from ..core.lines import encode_lines
from ..store.base import LoggedRun, RunInfo
from .checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint, settle_windows
from .sequencing import SequencerState
from .shaping import ShaperState, is_delta, shape, window_deltas, window_key


def retired_checkpoint(info: RunInfo) -> bytes:
    """The checkpoint of a run that ended longer ago than the bus keeps checkpoints: ended and
    retired at its last logged seq (what still arrives for it is dropped and counted)."""
    return encode_checkpoint(Checkpoint(sequencer=SequencerState(
        last_seq=info.last_seq, terminal=True, retired=True, owned=True, tenant=info.tenant)))


def continued_checkpoint(info: LoggedRun) -> bytes | None:
    """The log's checkpoint of a run to continue from (None: it has none).

    A checkpoint behind the run's last logged seq (events appended after it
    without one: an import into a live run) is moved up to that seq, so the
    next events get seqs the log does not hold yet — an append idempotent on
    ``(run_id, seq)`` would drop them.
    """
    data = info.checkpoint
    if data is None:
        return None
    checkpoint = decode_checkpoint(data)
    if checkpoint.sequencer.last_seq >= info.last_seq:
        return data
    checkpoint.sequencer.last_seq = info.last_seq
    return encode_checkpoint(checkpoint)


def hot_length(bus: object) -> int:
    """How many events of a delivery stream the bus's hot tier keeps (its ``maxlen``)."""
    maxlen = getattr(getattr(bus, "options", None), "maxlen", None)
    return maxlen if isinstance(maxlen, int) and maxlen > 0 else BusOptions().maxlen


def rebuilt_views(run_id: str, data: bytes, raw: Sequence[Event]) -> tuple[bytes, list[Append]]:
    """The appends that give a run's hot streams back from its logged raw events (seq order, the
    last ones up to the checkpoint's seq) — its shaped view, then its raw view with the
    checkpoint — and the checkpoint to continue from.

    The shaped view is :func:`~.shaping.shape` of the raw events (the same
    function of them as the live path). Up to the checkpoint's shaped seq it is
    what the lost view held, and past it the windows the checkpoint holds open:
    those are left to the live path, to close by its rules, and the
    checkpoint is ``data`` as it is. Where the two differ (the dead writer's
    wall-clock tick closed a window that ``shape`` extends, or a view cut at
    the hot tier's length, which starts its shaped part at its first event that
    is not a delta), the whole shaped view goes out and the checkpoint is
    settled against it (:func:`~.checkpoint.settle_windows`): every text once,
    its windows closed here.
    """
    if not raw:
        return data, []
    checkpoint = decode_checkpoint(data)
    if raw[0].seq == 1:
        shaped = shape(raw)
    else:
        start = next((index for index, event in enumerate(raw) if not is_delta(event)), None)
        shaped = [] if start is None else [raw[start], *shape(raw[start + 1:], after=raw[start].seq)]
    sent = [event for event in shaped if event.seq <= checkpoint.shaped_seq]
    if raw[0].seq == 1 and _texts(shaped[len(sent):]) == _open_texts(checkpoint.shaper, raw):
        shaped = sent
    elif shaped:
        data = settle_windows(data, shaped)
    appends: list[Append] = []
    if shaped:
        appends.append(((run_id, "shaped"), shaped, encode_lines(shaped), None))
    appends.append(((run_id, "raw"), raw, encode_lines(raw), data))
    return data, appends


def _texts(shaped: Sequence[Event]) -> dict[str, str] | None:
    """The text of each window key in shaped deltas (None: a non-delta event among them)."""
    texts: dict[str, list[str]] = {}
    for event in shaped:
        key = window_key(event)
        if key is None:
            return None
        texts.setdefault(key, []).append(event.payload.text)  # type: ignore[union-attr]
    return {key: "".join(parts) for key, parts in texts.items()}


def _open_texts(shaper: ShaperState, raw: Sequence[Event]) -> dict[str, str]:
    """The text of each window key in a checkpoint's windows not sent yet, in seq order (their
    deltas read from the run's whole ``raw`` events)."""
    deltas = window_deltas(shaper, raw)
    texts: dict[str, list[str]] = {}
    for window in sorted([*shaper.held, *shaper.windows.values()], key=lambda window: window.last_seq):
        found = deltas[window.first_seq]
        texts.setdefault(window_key(found[0]) or "", []).extend(delta.payload.text for delta in found)
    return {key: "".join(parts) for key, parts in texts.items()}
