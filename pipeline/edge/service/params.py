"""Strict request parameters and bounded bodies: every refusal a ``RequestError`` with its code.

* numbers are canonical decimal integers only — ``5``, never ``05``, ``+5``,
  `` 5``, ``5_0`` or ``5.0`` (Python's ``int()`` takes all of those, and two
  spellings of one cursor are two cache keys and a parser difference
  between runwire and whatever sits in front of it);
* a choice names one of its values exactly;
* a body is read up to its endpoint's limit (``413 KAI-STREAM-REQ-0002``
  past it, before anything is buffered beyond the limit) and within a
  deadline (``408 KAI-STREAM-REQ-0004``), and JSON bodies nest at most
  :data:`runwire.core.envelope.MAX_DEPTH` levels (``400 KAI-STREAM-REQ-0003``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request

from ...core.envelope import MAX_DEPTH
from ...core.errors import REQ_BAD_BODY, REQ_SLOW_BODY, BodyTooLarge, RequestError

MAX_SEQ = 2**63 - 1
_CANONICAL = re.compile(r"0|[1-9][0-9]*")


def canonical_int(raw: str, name: str, *, low: int = 0, high: int = MAX_SEQ) -> int:
    """``raw`` as an integer in ``[low, high]``, written canonically; RequestError otherwise."""
    if raw.startswith("-") and raw[1:].isdigit():
        raise RequestError(f"bad {name} {raw!r}: must not be negative")
    if len(raw) > 19 or not _CANONICAL.fullmatch(raw):
        raise RequestError(f"bad {name} {raw!r}: a decimal integer without sign, spaces, underscores or leading zeros")
    value = int(raw)
    if not low <= value <= high:
        raise RequestError(f"bad {name} {raw!r}: must be between {low} and {high}")
    return value


def choice(value: str, allowed: Iterable[str], name: str) -> str:
    """``value`` when it is one of ``allowed``; RequestError naming them otherwise."""
    options = sorted(allowed)
    if value not in options:
        raise RequestError(f"unknown {name} {value!r}; use one of {', '.join(options)}")
    return value


def cursor(query: dict[str, str], last_event_id: str | None) -> tuple[int, bool]:
    """The resume cursor (``Last-Event-ID`` header, else ``?after=``): ``(seq, live)``."""
    raw = last_event_id if last_event_id is not None else query.get("after", "0")
    if raw == "live":
        return 0, True
    return canonical_int(raw or "0", "cursor (Last-Event-ID / after: a seq or 'live')"), False


def list_limit(raw: str | None, *, default: int = 100, most: int = 1000) -> int:
    """``?limit=`` of a listing: 1 … ``most``."""
    return default if raw is None else canonical_int(raw, "limit", low=1, high=most)


def moment(raw: str | None, name: str) -> datetime | None:
    """An RFC 3339 / ISO 8601 time parameter (UTC when it has no offset)."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(f"bad {name} {raw!r}: an RFC 3339 time such as 2026-01-01T00:00:00Z") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def bounded_body(request: Request, limit: int, *, timeout_s: float, what: str) -> bytes:
    """The request body, refused past ``limit`` bytes (413) or after ``timeout_s`` (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"{what} body of {declared} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"{what} body over the {limit}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise SlowBody(f"{what} body not received within {timeout_s:g} s") from None
    return b"".join(chunks)


class SlowBody(RequestError):
    """A body that did not arrive within its deadline (408)."""

    code = REQ_SLOW_BODY
    status = 408
    grpc = "DEADLINE_EXCEEDED"


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """RequestError when decoded JSON nests deeper than ``limit`` levels (iterative, no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if children and level > limit:
            raise RequestError(f"{what} nests deeper than {limit} levels", code=REQ_BAD_BODY)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
