"""Ingest entries that hold several events: one encoding for every bus that batches them.

An ingest entry (a Redis stream entry, a Kafka record) holds either

* **one event**, its canonical JSON — what a hand-written producer sends, and the
  only format before multi-event entries; or
* **several events** published together (on Redis: of one shard; on Kafka: of one
  root run, so the record's key stays the root run id), their canonical JSON one
  per line (canonical JSON never holds a raw newline), marked as such by the
  backend: Redis field ``m`` instead of ``e``, Kafka header ``n`` = how many events.

An entry holds at most :data:`INGEST_ENTRY_EVENTS` events and about
:data:`INGEST_ENTRY_BYTES` bytes of them (a larger event is an entry on its own);
see :func:`chunks`. An entry is one unit of a consumer's fetch, claim, commit and
ack: the consumer hands out one delivery per event (their ``part`` numbers them)
and acks the entry once each of them is acked or dead-lettered
(:class:`OpenEntries`), so a poison event is dead-lettered on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

INGEST_ENTRY_EVENTS = 64
"""At most this many events per ingest entry (an entry is one unit of a consumer's fetch,
claim and ack)."""
INGEST_ENTRY_BYTES = 256 * 1024
"""An entry of several events holds at most this many bytes of them (Kafka's default record
limit is 1 MiB)."""

K = TypeVar("K", bound=Hashable)


def chunks(frames: Sequence[bytes]) -> list[Sequence[bytes]]:
    """``frames`` (encoded events, in order) cut into the consecutive runs one entry each holds."""
    if len(frames) <= INGEST_ENTRY_EVENTS and sum(map(len, frames)) <= INGEST_ENTRY_BYTES:
        return [frames]
    return [frames[start:end] for start, end in cuts(frames, INGEST_ENTRY_EVENTS, INGEST_ENTRY_BYTES)]


def cuts(frames: Sequence[bytes], most_events: int, most_bytes: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each consecutive run of ``frames`` that one entry or record holds:
    at most ``most_events`` frames and ``most_bytes`` of them joined by newlines (a larger frame
    is a run of its own)."""
    out: list[tuple[int, int]] = []
    start = 0
    while start < len(frames):
        end, size = start, 0
        while end < len(frames) and end - start < most_events and (
            end == start or size + len(frames[end]) <= most_bytes
        ):
            size += len(frames[end]) + 1
            end += 1
        out.append((start, end))
        start = end
    return out


def join(chunk: Sequence[bytes]) -> bytes:
    """The value of an entry of several events."""
    return b"\n".join(chunk)


def split(value: bytes) -> list[bytes]:
    """The events of an entry of several events."""
    return value.split(b"\n")


class OpenEntries(Generic[K]):
    """Entries of several events handed out, and which of their events are still open
    (neither acked nor dead-lettered); keyed by the backend's entry position."""

    def __init__(self) -> None:
        self._left: dict[K, set[int]] = {}

    def __len__(self) -> int:
        return len(self._left)

    def hand_out(self, key: K, count: int) -> None:
        """An entry of ``count`` events was handed out (again: what was settled stays so)."""
        if count > 1:
            self._left.setdefault(key, set(range(count)))

    def open_parts(self, key: K) -> set[int] | None:
        """The parts of an entry still open; None for an entry of one event or not handed out."""
        return self._left.get(key)

    def settle_all(self, key: K) -> bool:
        """Mark every event of an entry done (it was handed out whole); True."""
        self._left.pop(key, None)
        return True

    def settle(self, key: K, part: int) -> bool:
        """Mark one event done; True when its entry has no other event left open."""
        left = self._left.get(key)
        if left is None:
            return True
        left.discard(part)
        if left:
            return False
        del self._left[key]
        return True
