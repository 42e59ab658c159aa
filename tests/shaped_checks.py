"""What a client of the shaped view checks, written as a client would (events as decoded JSON).

* :func:`t2_problems` — Koder agent stream §7 T2 on the shaped view: every event's
  ``span[0]`` (its ``seq`` when it has no span) is the previous event's seq + 1, and
  ``span[1]`` is its own seq; a resume after seq N starts at or before N + 1.
* :func:`r1_excess` — §4 R1: between two control events, at most 10 shaped deltas of one
  (child, type) in any second of their ``ts``.
* :func:`texts` — every character once: the text of each (child, type), concatenated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from runwire.core.envelope import Event

DELTAS = ("reasoning.delta", "text.delta")


def as_dicts(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Events as a client decodes them from the wire (the canonical JSON)."""
    return [msgspec.json.decode(msgspec.json.encode(e)) for e in events]


def t2_problems(events: Sequence[dict[str, Any]], after: int = 0) -> list[str]:
    """Where the shaped stream breaks T2 (empty when a client sees no gap and no overlap)."""
    problems: list[str] = []
    cursor = after
    for index, event in enumerate(events):
        seq = event["seq"]
        first, last = event.get("span") or (seq, seq)
        if last != seq:
            problems.append(f"seq {seq}: span {event.get('span')} does not end at its seq")
        if index == 0 and after and first <= after + 1 <= seq:
            pass  # a resume from a cursor inside this event's stretch
        elif first > cursor + 1:
            problems.append(f"seq {seq}: span starts at {first}, after {cursor}: seqs "
                            f"{cursor + 1}..{first - 1} are missing")
        elif first <= cursor:
            problems.append(f"seq {seq}: span starts at {first}, at or before {cursor}: overlap")
        cursor = max(cursor, seq)
    return problems


def _millis(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000 + 0.5)


def r1_excess(events: Sequence[dict[str, Any]], limit: int = 10) -> list[str]:
    """Seconds in which one (child, type) had more than ``limit`` shaped deltas between control events."""
    problems: list[str] = []
    stretch: dict[tuple[Any, str], list[int]] = defaultdict(list)

    def check() -> None:
        for key, stamps in stretch.items():
            stamps.sort()
            start = 0
            for end, stamp in enumerate(stamps):
                while stamp - stamps[start] >= 1000:
                    start += 1
                if end - start + 1 > limit:
                    problems.append(f"{key}: {end - start + 1} shaped deltas within 1 s from ts "
                                    f"{stamps[start]} ms")
                    break
        stretch.clear()

    for event in events:
        if event["type"] in DELTAS:
            stretch[(event.get("child_id"), event["type"])].append(_millis(event["ts"]))
        else:
            check()
    check()
    return problems


def max_per_second(events: Sequence[dict[str, Any]]) -> int:
    """The most shaped deltas of one (child, type) within any second between control events."""
    for limit in range(1, 10_000):
        if not r1_excess(events, limit):
            return limit
    raise AssertionError("unbounded")


def texts(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, str], str]:
    """Each (child, type)'s deltas concatenated, in stream order."""
    out: dict[tuple[Any, str], str] = defaultdict(str)
    for event in events:
        if event["type"] in DELTAS:
            out[(event.get("child_id"), event["type"])] += event["payload"]["text"]
    return dict(out)
