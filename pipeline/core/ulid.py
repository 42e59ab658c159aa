"""Monotonic ULIDs.

A ULID is 48 bits of milliseconds and 80 random bits in Crockford base32.
Within one millisecond this generator increments the random part, so ids are
strictly increasing per generator (Koder agent stream §2: "ULID, monotonic per stream").
python-ulid has no monotonic factory; this one is hand-written because the
publisher makes one id per event on its hot path.
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_MAX = (1 << 80) - 1
_NEXT_CHAR = {c: _ALPHABET[i + 1] for i, c in enumerate(_ALPHABET[:-1])}


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def ulid_timestamp_ms(ulid: str) -> int:
    """The millisecond timestamp encoded in a ULID (prefix such as ``evt_`` allowed)."""
    body = ulid.rsplit("_", 1)[-1][:10]
    value = 0
    for ch in body:
        value = value * 32 + _ALPHABET.index(ch)
    return value


class MonotonicULID:
    """Generates strictly increasing ULIDs, optionally prefixed (``evt_``).

    The time part is encoded once per millisecond; within a millisecond the
    random part is incremented in its base32 form (one character changes,
    except on a carry), so most ids cost one string concatenation.
    """

    __slots__ = ("_head", "_last_ms", "_prefix", "_rand", "_tail")

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._last_ms = -1
        self._rand = 0
        self._head = self._tail = ""

    def new(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else max(0, now_ms)  # a source's pre-1970 time
        if ms > self._last_ms:
            self._last_ms = ms
            self._head = self._prefix + _encode(ms, 10)
            self._rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom for increments
            self._tail = _encode(self._rand, 16)
        else:  # same (or an earlier) millisecond: keep the time part, count up
            self._rand += 1
            if self._rand > _RANDOM_MAX:  # 2^79 ids in one ms: borrow the next ms
                return self.new(self._last_ms + 1)
            bumped = _NEXT_CHAR.get(self._tail[-1])
            self._tail = self._tail[:-1] + bumped if bumped else _encode(self._rand, 16)
        return self._head + self._tail


_default = MonotonicULID("evt_")


def new_event_id() -> str:
    """A new ``evt_``-prefixed monotonic ULID from the process-wide generator."""
    return _default.new()


def new_random_ulid(prefix: str = "") -> str:
    """A ULID with 80 fresh random bits: unguessable from any other id (run ids handed to clients)."""
    ms = int(time.time() * 1000)
    return prefix + _encode(ms, 10) + _encode(int.from_bytes(os.urandom(10), "big"), 16)
