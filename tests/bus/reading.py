"""Reading what reached a bus's ingest, as a test checks it."""

from __future__ import annotations

import time

from runwire.bus import open_bus
from runwire.core.envelope import Event, decode


async def consume(url: str, want: int, within: float = 30.0, *, then_nothing: bool = False) -> list[Event]:
    """Every ingest entry (up to ``want``) as events, read by a fresh consumer group; with
    ``then_nothing``, whatever one more read finds after them too (a caller expects none)."""
    got: list[Event] = []
    async with open_bus(url) as bus, bus.consumer("check", "c") as consumer:
        deadline = time.monotonic() + within
        while len(got) < want and time.monotonic() < deadline:
            batch = await consumer.fetch(max_count=1000, block_ms=200)
            got += [decode(d.data) for d in batch]
            await consumer.ack(batch)
        if then_nothing:
            got += [decode(d.data) for d in await consumer.fetch(block_ms=300)]
    return got
