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


PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
"""Two characters of base32 by their value (0–1023): the last two of a time part (``ms & 1023``)
and of a random part (``rand & 1023``)."""
_RESEED_MS_BITS = 10
"""The random part is drawn afresh when ``ms >> 10`` changes (about once a second)."""


class MonotonicULID:
    """Generates strictly increasing ULIDs, optionally prefixed (``evt_``).

    The time part's first eight characters change about once a second
    (``ms >> 10``) and are encoded then, with a fresh random part; a new
    millisecond within that second only swaps the time part's last two characters (a
    table of 1,024). The random part counts up by one from one id to the next: its
    last two characters come from the same table (``rand & 1023``) and the fourteen
    before them are encoded again only on a carry, one id in 1,024 — so an id is one
    string concatenation in every millisecond, which matters to an agent emitting a
    few events per millisecond or fewer.
    """

    __slots__ = ("_high", "_high_of", "_last_ms", "_prefix", "_rand", "_stem", "_time")

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._last_ms = -1
        self._high_of = -1
        self._rand = 0
        self._high = self._time = self._stem = ""

    def new(self, now_ms: int | None = None) -> str:
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms if now_ms > 0 else 0
        if ms > self._last_ms:
            self._last_ms = ms
            high = ms >> _RESEED_MS_BITS
            if high != self._high_of:
                self._high_of = high
                self._high = self._prefix + _encode(high, 8)
                self._rand = rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom
                self._time = self._high + PAIRS[ms & 1023]
                self._stem = self._time + _encode(rand >> 10, 14)
                return self._stem + PAIRS[rand & 1023]
            self._time = self._high + PAIRS[ms & 1023]
            self._stem = self._time + self._stem[-14:]
        self._rand = rand = self._rand + 1  # same millisecond, an earlier one, or a new one
        if rand & 1023:
            return self._stem + PAIRS[rand & 1023]
        if rand > _RANDOM_MAX:  # 2^79 ids in one second: borrow the next reseed
            self._last_ms = self._high_of = -1
            return self.new(((ms >> _RESEED_MS_BITS) + 1) << _RESEED_MS_BITS)
        self._stem = self._time + _encode(rand >> 10, 14)  # a carry past the last two characters
        return self._stem + PAIRS[0]


_default = MonotonicULID("evt_")


def new_event_id() -> str:
    """A new ``evt_``-prefixed monotonic ULID from the process-wide generator."""
    return _default.new()


def new_random_ulid(prefix: str = "") -> str:
    """A ULID with 80 fresh random bits: unguessable from any other id (run ids handed to clients)."""
    ms = int(time.time() * 1000)
    return prefix + _encode(ms, 10) + _encode(int.from_bytes(os.urandom(10), "big"), 16)
