"""A stream's events encoded at once, as canonical JSON lines (a worker's write).

Delivery entries (Redis) and replay-log segments (SQLite) store a stream's
events as their canonical JSON lines joined by ``\\n``. A worker encodes each
stream's events of a write with one encoder call (:func:`encode_lines`) and
hands the joined lines on as they are (:func:`join_lines`); a writer that
wants each event's bytes indexes :class:`Lines`, which splits them once.
Canonical JSON never holds a raw newline (strings escape it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .envelope import Event, _encoder


class Lines(Sequence[bytes]):
    """Events encoded by :func:`encode_lines`: ``joined`` is their lines joined by ``\\n``."""

    __slots__ = ("_count", "_split", "joined")

    def __init__(self, joined: bytes, count: int) -> None:
        self.joined = joined
        self._count = count
        self._split: list[bytes] | None = None

    def __len__(self) -> int:
        return self._count

    def _lines(self) -> list[bytes]:
        if self._split is None:
            self._split = self.joined.split(b"\n") if self._count else []
        return self._split

    def __getitem__(self, index: Any) -> Any:
        return self._lines()[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._lines())


def encode_lines(events: Sequence[Event]) -> Lines:
    """Encode events as :class:`Lines`: one encoder call, equal to
    ``b"\\n".join(map(envelope.encode, events))``."""
    return Lines(_encoder.encode_lines(events)[:-1], len(events))


def join_lines(encoded: Sequence[bytes], start: int = 0, stop: int | None = None) -> bytes:
    """``b"\\n".join(encoded[start:stop])``, without splitting and joining again when
    ``encoded`` is :class:`Lines` and the slice is all of it."""
    if type(encoded) is Lines and not start and (stop is None or stop >= len(encoded)):
        return encoded.joined
    return b"\n".join(encoded[start:stop])
