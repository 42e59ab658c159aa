"""Stream entries on Redis that hold several events: ingest and delivery.

**Ingest.** A publish writes one entry per shard and up to
:data:`~runwire.bus.ingest_entries.INGEST_ENTRY_EVENTS` events (the encoding
shared with Kafka, :mod:`runwire.bus.ingest_entries`): field ``m``, the
events' canonical JSON one per line. A lone event is an entry with field
``e`` as before, which is also what a hand-written ``XADD`` sends; consumers
take both (:func:`ingest_entry`).

**Delivery streams.** Several events per entry, the seq ↔ entry mapping exact.

An append writes one entry per stream and up to :data:`ENTRY_EVENTS` events
(the ``APPEND`` script in :mod:`runwire.bus.redis.scripts`):

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

from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any

from ...core import native
from ...core.envelope import Event, RunLifecycle, decode_many
from ...core.errors import ProtocolError
from ...core.lines import Lines, join_lines
from ..base import StreamKey, ends_run
from ..ingest_entries import chunks, join

EncodedAppend = tuple[StreamKey, Sequence[Event], Sequence[bytes], bytes | None]
"""An append whose events' canonical JSON is there (the packed call sends it as it is)."""

_SEQ = attrgetter("seq")
ENTRY_EVENTS = 512
"""At most this many events per delivery entry (a reader resuming mid-entry skips the rest
undecoded)."""
INGEST_FIELD = b"e"
INGEST_MANY_FIELD = b"m"


IngestEntry = tuple[int, bytes, bytes]
"""One ingest entry to add: its ``MAXLEN ~`` (0: none), its field and its value."""


def ingest_entries(frames: Sequence[bytes], maxlen: int) -> list[IngestEntry]:
    """The entries that append ``frames`` to an ingest stream, in order.

    ``maxlen`` (events, 0 = unbounded) bounds the stream approximately: an entry of
    ``n`` events trims to ``maxlen // n`` entries.
    """
    return [
        (max(1, maxlen // len(chunk)) if maxlen else 0,
         INGEST_FIELD if len(chunk) == 1 else INGEST_MANY_FIELD,
         chunk[0] if len(chunk) == 1 else join(chunk))
        for chunk in chunks(frames)
    ]


def ingest_xadd(key: str, entry: IngestEntry) -> list[bytes | str | int]:
    """The ``XADD`` command that adds one ingest entry."""
    maxlen, field, value = entry
    command: list[bytes | str | int] = ["XADD", key]
    if maxlen:
        command += ("MAXLEN", "~", maxlen)
    command += ("*", field, value)
    return command


def ingest_entry(fields: Any) -> tuple[bytes, int] | None:
    """An ingest entry's events (raw ``[name, value, …]`` or a dict) as ``(data, count)``:
    their canonical JSON lines joined by newlines and how many there are; None without any."""
    if isinstance(fields, list) and len(fields) == 2:
        name, value = fields
        if name == INGEST_FIELD:
            return value, 1
        if name == INGEST_MANY_FIELD:
            return value, value.count(b"\n") + 1
    many = _field(fields, INGEST_MANY_FIELD)
    if many is not None:
        return many, many.count(b"\n") + 1
    one = _field(fields, INGEST_FIELD)
    return None if one is None else (one, 1)


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


FRAMED_KEYS = 4096
"""Streams whose ``APPEND`` keys a bus keeps framed (~0.2 KB each): a write's streams, and more."""
_CRLF = b"\r\n"


def _frame(data: bytes) -> bytes:
    """A RESP bulk string (for short arguments; long ones are framed without a copy)."""
    return b"$%d\r\n%b\r\n" % (len(data), data)


def frame_ints(*values: int) -> bytes:
    """Integers as RESP bulk strings."""
    return b"".join(_frame(b"%d" % value) for value in values)


_NO_STATE = _frame(b"0") + _frame(b"")
_STATE = _frame(b"1")
_ENDS, _GOES_ON = _frame(b"1"), _frame(b"0")


class FramedKeys:
    """Each stream's ``APPEND`` keys as RESP bulk strings, kept for its next writes
    (at most :data:`FRAMED_KEYS` streams: all are dropped when it is full)."""

    __slots__ = ("_framed", "_names")

    def __init__(self, names: Callable[[StreamKey], Sequence[str]]) -> None:
        self._names = names
        self._framed: dict[StreamKey, bytes] = {}

    def __len__(self) -> int:
        return len(self._framed)

    def __call__(self, key: StreamKey) -> bytes:
        framed = self._framed.get(key)
        if framed is None:
            if len(self._framed) >= FRAMED_KEYS:
                self._framed.clear()
            framed = self._framed[key] = b"".join(
                _frame(name.encode()) for name in self._names(key))
        return framed


def pack_append_many(
    sha: str, head: bytes, appends: Sequence[EncodedAppend], keys_of: FramedKeys
) -> bytes:
    """The ``EVALSHA`` of an ``APPEND_MANY`` call in RESP, built directly: byte for byte
    ``resp_evalsha`` of the call's keys and arguments (``head``: its first three, framed).

    A worker's write of a few events to each of hundreds of streams pays per stream
    here, not per event: each stream's keys come framed from ``keys_of`` and each
    argument is framed once (docs/workers.md § Throughput). Compiled where it was built
    (``runwire.core._native``), its twin :func:`pack_append_many_python`.
    """
    if _CORE is not None:
        return _CORE.pack_append_many(_frame(sha.encode()), head, appends, keys_of)  # type: ignore[no-any-return]
    return pack_append_many_python(sha, head, appends, keys_of)


def pack_append_many_python(
    sha: str, head: bytes, appends: Sequence[EncodedAppend], keys_of: Callable[[StreamKey], bytes]
) -> bytes:
    """:func:`pack_append_many`'s Python twin (``tests/bus/test_pack_native.py``)."""
    keys_out: list[bytes] = []
    args_out: list[bytes] = []
    arguments = 3  # maxlen, ttl, grace; then per stream: state given, state, ends, entries
    for key, events, encoded, state in appends:
        keys_out.append(keys_of(key))
        if state is None:
            args_out.append(_NO_STATE)
        else:
            args_out += (_STATE, b"$%d\r\n" % len(state), state, _CRLF)
        entries = entry_args(events, encoded)
        arguments += 4 + len(entries)
        args_out += (_ENDS if ends_run(events) else _GOES_ON, frame_ints(len(entries) // 2))
        for part in entries:
            args_out += (b"$%d\r\n" % len(part), part, _CRLF)
    count = len(keys_out) * 3
    return b"".join([b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + count + arguments),
                     _frame(sha.encode()), frame_ints(count), *keys_out, head, *args_out])


def _load_core() -> Any:
    core = native.load("core._native", "Redis write's packing")
    if core is not None:
        core.setup_pack(entry_args=entry_args, ends_run=ends_run, lines=Lines, run_lifecycle=RunLifecycle,
                        entry_events=ENTRY_EVENTS)
    return core


_CORE = _load_core()
