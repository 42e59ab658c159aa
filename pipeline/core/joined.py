"""Canonical JSON lines joined by newlines (a batch as one buffer), read without splitting them.

A worker decodes a fetched batch's lines in one msgspec call
(:func:`runwire.core.envelope.decode_joined`); what it still needs of the lines
themselves — that they are as many as the events, and which of the few that can
nest deeply have the brackets to — is :func:`deep_candidates` (which events can
nest: a tool call, an extension, one with ``ext``) and :func:`deep_lines`, one
pass over the buffer that copies no line (compiled where built:
``runwire.core._native``; ``tests/test_joined_native.py`` checks each against its
twin).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from operator import attrgetter
from typing import Any

from .native import load

_EXT = attrgetter("ext")


def may_be_deep(frame: bytes | str, limit: int) -> bool:
    """False when a frame has too few brackets to nest deeper than ``limit`` (C speed)."""
    if isinstance(frame, str):
        return frame.count("{") + frame.count("[") > limit
    return frame.count(b"{") + frame.count(b"[") > limit


def _deep_lines(joined: bytes, count: int, indexes: list[int], limit: int) -> list[int] | None:
    lines = joined.split(b"\n")
    if len(lines) != count:
        return None
    return [index for index in indexes if may_be_deep(lines[index], limit)]


def _deep_candidates(events: list[Any], free_form: tuple[type, ...]) -> list[int]:
    indexes = range(len(events))
    found = list(compress(indexes, map(frozenset(free_form).__contains__, map(type, events))))
    if any(map(_EXT, events)):  # rare: an ingest codec's leftovers
        found = sorted({*found, *compress(indexes, map(_EXT, events))})
    return found


_NATIVE = load("core._native", "batch's line check")
deep_candidates: Callable[[list[Any], tuple[type, ...]], list[int]] = (
    _deep_candidates if _NATIVE is None else _NATIVE.deep_candidates)
"""The indexes of the decoded ``events`` that may nest deeply: of a type in ``free_form``, or
with an ``ext`` (one pass in C where built, reading ``ext`` in its slot)."""
deep_lines: Callable[[bytes, int, list[int], int], list[int] | None] = (
    _deep_lines if _NATIVE is None else _NATIVE.deep_lines)
"""Of ``joined``'s lines (split at each ``\\n``), those at ``indexes`` (ascending, below
``count``) that :func:`may_be_deep` under ``limit``; None when ``joined`` is not ``count``
lines."""
