"""Canonical JSON lines joined by newlines (a batch as one buffer), read without splitting them.

A worker decodes a fetched batch's lines in one msgspec call
(:func:`runwire.core.envelope.decode_joined`); what it still needs of the lines
themselves — that they are as many as the events, and which of the few that can
nest deeply have the brackets to — is :func:`deep_lines`, one pass over the
buffer that copies no line (compiled where built:
``runwire.core._native.deep_lines``; ``tests/test_joined_native.py`` checks the two
against each other).
"""

from __future__ import annotations

from collections.abc import Callable

from .native import load


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


_NATIVE = load("core._native", "batch's line check")
deep_lines: Callable[[bytes, int, list[int], int], list[int] | None] = (
    _deep_lines if _NATIVE is None else _NATIVE.deep_lines)
"""Of ``joined``'s lines (split at each ``\\n``), those at ``indexes`` (ascending, below
``count``) that :func:`may_be_deep` under ``limit``; None when ``joined`` is not ``count``
lines."""
