"""An agent in a process of its own that A2A clients reach through the edge: the publisher SDK's
inbox (``pub.tasks``). ``python -m tests.edge.a2a_agent BUS_URL AGENT``.

Its answers, by the message's text: ``ask …`` asks "Which city?" (input-required) and books the
answer; ``wait`` streams until the task is cancelled; anything else is echoed word by word.
"""

from __future__ import annotations

import asyncio
import sys

from runwire.sdk.publisher import Publisher
from runwire.sdk.tasks import A2ATask


async def handle(task: A2ATask) -> None:
    text = task.text
    if text == "wait":
        while not task.cancelled.is_set():
            await task.run.emit("text.delta", {"text": "."})
            await asyncio.sleep(0.05)
        await task.finish("aborted", "cancelled by the client")
        return
    if text.startswith("ask"):
        city = await task.ask("Which city?")
        text = f"booked {city}"
    for word in f"echo: {text}".split():
        await task.run.emit("text.delta", {"text": word + " "})
    await task.finish()


async def main(url: str, agent: str) -> None:
    handlers: set[asyncio.Task[None]] = set()
    async with Publisher.connect(url, linger_ms=1.0) as publisher:
        async for task in publisher.tasks(agent, ttl_s=3.0):
            handler = asyncio.create_task(handle(task))
            handlers.add(handler)
            handler.add_done_callback(handlers.discard)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
