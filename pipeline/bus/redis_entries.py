"""Stream entries on Redis that hold several events: ingest and delivery.

**Ingest.** A publish writes one entry per shard and up to
:data:`~runwire.bus.ingest_entries.INGEST_ENTRY_EVENTS` events (the encoding
shared with Kafka, :mod:`runwire.bus.ingest_entries`): field ``m``, the
events' canonical JSON one per line. A lone event is an entry with field
``e`` as before, which is also what a hand-written ``XADD`` sends; consumers
take both (:func:`ingest_frames`).

**Delivery streams.** Several events per entry, the seq ↔ entry mapping exact.

An append writes one entry per stream and up to :data:`ENTRY_EVENTS` events
(the ``APPEND`` script in :mod:`runwire.bus.redis_scripts`):

* entry id ``<seq of its last event>-0`` — ids increase with seq, a
  duplicate is impossible, and ``XRANGE <after+1>-0 +`` starts at the entry
  holding the first event after ``after``;
* field ``s``: the events' seqs, ``first+count`` when consecutive (a raw
  view), else ``seq,seq,…`` (a shaped view's seqs skip the deltas it merged);
* field ``e``: the events' canonical JSON, one per line.

An entry without ``s`` holds one event whose seq is its id's (the format
before multi-event entries); readers take both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

from ..core.envelope import Event, RunLifecycle, decode_many, is_terminal, join_lines
from ..core.errors import ProtocolError
from .ingest_entries import chunks, join, split

_SEQ = attrgetter("seq")
ENTRY_EVENTS = 512
"""At most this many events per delivery entry (a reader resuming mid-entry skips the rest
undecoded)."""
INGEST_FIELD = b"e"
INGEST_MANY_FIELD = b"m"


def ingest_xadd(key: str, frames: Sequence[bytes], maxlen: int) -> list[list[bytes | str | int]]:
    """The ``XADD`` commands that append ``frames`` to an ingest stream, in order.

    ``maxlen`` (events, 0 = unbounded) bounds the stream approximately: an entry of
    ``n`` events trims to ``maxlen // n`` entries.
    """
    commands: list[list[bytes | str | int]] = []
    for chunk in chunks(frames):
        command: list[bytes | str | int] = ["XADD", key]
        if maxlen:
            command += ("MAXLEN", "~", max(1, maxlen // len(chunk)))
        if len(chunk) == 1:
            command += ("*", INGEST_FIELD, chunk[0])
        else:
            command += ("*", INGEST_MANY_FIELD, join(chunk))
        commands.append(command)
    return commands


def ingest_frames(fields: Any) -> list[bytes] | None:
    """The events of an ingest entry (raw ``[name, value, …]`` or a dict), None without any."""
    if isinstance(fields, list) and len(fields) == 2:
        name, value = fields
        if name == INGEST_FIELD:
            return [value]
        if name == INGEST_MANY_FIELD:
            return split(value)
    many = _field(fields, INGEST_MANY_FIELD)
    if many is not None:
        return split(many)
    one = _field(fields, INGEST_FIELD)
    return None if one is None else [one]


def seq_spec(seqs: Sequence[int]) -> bytes:
    """The ``s`` field of an entry holding events with these (increasing) seqs."""
    first = seqs[0]
    if seqs[-1] - first == len(seqs) - 1:
        return b"%d+%d" % (first, len(seqs))
    return b",".join([b"%d" % seq for seq in seqs])


def entry_args(events: Sequence[Event], encoded: Sequence[bytes]) -> list[bytes]:
    """The ``APPEND`` script's entry arguments: ``seqs, lines`` per entry of at most
    :data:`ENTRY_EVENTS` events."""
    if len(events) != len(encoded):
        raise ValueError(f"{len(events)} events, {len(encoded)} encoded")
    count = len(events)
    if 0 < count <= ENTRY_EVENTS:  # (most appends: one entry)
        first = events[0].seq
        # increasing seqs: contiguous exactly when the last is first + count - 1
        spec = (b"%d+%d" % (first, count) if events[-1].seq - first == count - 1
                else seq_spec(list(map(_SEQ, events))))
        return [spec, join_lines(encoded)]
    args: list[bytes] = []
    for start in range(0, count, ENTRY_EVENTS):
        chunk = events[start:start + ENTRY_EVENTS]
        args += (seq_spec(list(map(_SEQ, chunk))),
                 join_lines(encoded, start, start + ENTRY_EVENTS))
    return args


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def seq_of(entry_id: bytes | str) -> int:
    """The seq of an entry's last event (its id's first part)."""
    return int(_text(entry_id).split("-", 1)[0])


def _seqs(spec: bytes) -> list[int]:
    first, plus, count = spec.partition(b"+")
    if plus:
        start = int(first)
        return list(range(start, start + int(count)))
    return [int(seq) for seq in spec.split(b",")]


def _field(fields: Any, name: bytes) -> bytes | None:
    if isinstance(fields, dict):
        value = fields.get(name)
    else:  # a raw [name, value, …] reply
        value = dict(zip(fields[::2], fields[1::2], strict=True)).get(name)
    return None if value is None else bytes(value)


def first_seq(entry_id: bytes | str, fields: Any) -> int:
    """The seq of an entry's first event."""
    spec = _field(fields, b"s")
    if spec is None:
        return seq_of(entry_id)
    first, plus, _ = spec.partition(b"+")
    return int(first) if plus else int(spec.split(b",", 1)[0])


def lines_after(entries: Iterable[tuple[Any, Any]], after: int) -> list[bytes]:
    """The encoded events with seq > ``after`` of entries as ``XRANGE`` returns them, in order."""
    out: list[bytes] = []
    for entry_id, fields in entries:
        data = _field(fields, b"e")
        if data is None:
            continue
        spec = _field(fields, b"s")
        if spec is None:  # one event, seq = the id's
            if seq_of(entry_id) > after:
                out.append(data)
            continue
        lines = data.split(b"\n")
        seqs = _seqs(spec)
        if seqs[0] > after:
            out += lines
        else:
            out += [line for seq, line in zip(seqs, lines, strict=True) if seq > after]
    return out


def decode_stored(lines: Sequence[bytes]) -> list[Event]:
    """Events the workers stored (canonical JSON, so one msgspec call decodes a batch).

    Without the nesting limit: the workers checked these at ingest, and an
    older release accepted deeper payloads, which the edge still serves.
    """
    events = decode_many(lines, max_depth=None)
    for event in events:
        if isinstance(event, ProtocolError):
            raise event
    return events  # type: ignore[return-value]


def ends_run(events: Sequence[Event]) -> bool:
    """Whether one stream's append holds the stream's own terminal ``run.lifecycle`` (a
    child's, fanned into a parent stream, carries ``child_id`` and ends only the child)."""
    if RunLifecycle not in set(map(type, events)):  # (most appends: one C-level pass)
        return False
    for event in reversed(events):
        if type(event) is RunLifecycle and event.child_id is None and is_terminal(event):
            return True
    return False
