"""Waiting for a condition, never for a fixed time.

A test that sleeps a fixed time and then asserts passes or fails with the machine's speed. It
waits with ``until`` for what it needs instead (a reader connected, a row written, a marker
received), bounded by a deadline that only a broken system reaches. A negative assertion ("X was
not written") waits for a positive marker that comes after X would have (a later event written, a
witness entry redelivered) and then checks X is absent. ``tests/test_waiting.py`` counts the
fixed sleeps left.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02


async def until(
    condition: Callable[[], T | Awaitable[T]], *, within: float = 30.0, what: str = ""
) -> T:
    """Poll ``condition`` (a plain or an async function) until it returns something true; return it.

    Fails with ``what`` (or the condition's name) when ``within`` seconds pass first.
    """
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or getattr(condition, '__name__', 'condition')} "
                                 f"did not hold within {within} s")
        await asyncio.sleep(POLL_S)


async def until_received(
    receiving: Awaitable[T], send_marker: Callable[[], Awaitable[object]], *, within: float = 30.0
) -> T:
    """What a live subscription receives first, sending it markers until it does.

    A subscription that starts "from now" can't be seen starting from outside: a message sent a
    moment too early is not for it. So a test sends markers until one arrives, and then knows
    the subscription is live (later markers may still be on their way; the caller skips them).
    """
    task = asyncio.ensure_future(receiving)

    async def received() -> bool:
        if not task.done():
            await send_marker()
            await asyncio.wait([task], timeout=POLL_S * 5)
        return task.done()

    try:
        await until(received, within=within, what="a marker at the live subscription")
    finally:
        if not task.done():
            task.cancel()
    return task.result()
