"""A consumer process for the SIGKILL scenario of the bus contract.

``python -m tests.bus.consumer_proc URL GROUP NAME COUNT`` joins the group,
fetches until it holds ``COUNT`` entries (or a few seconds passed with some),
prints their entry ids as one JSON line, and then hangs without acking until
it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from runwire.bus import open_bus


async def main(url: str, group: str, name: str, count: int) -> None:
    async with open_bus(url) as bus:
        consumer = bus.consumer(group, name)
        held: list[str] = []
        deadline = time.monotonic() + 30
        while len(held) < count and time.monotonic() < deadline:
            batch = await consumer.fetch(max_count=count - len(held), block_ms=200)
            held += [d.entry_id for d in batch]
        print(json.dumps(held), flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    url, group, name, count = sys.argv[1:5]
    asyncio.run(main(url, group, name, int(count)))
