"""The requests channel on every bus: a client's chat turn reaches the agent that consumes it.

The edge refuses a turn at once when no agent consumes the channel, so presence must
be true while an agent iterates ``pub.requests()`` and false soon after it stops.
"""

from __future__ import annotations

import asyncio
import time

from runwire import Publisher
from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.bus.requests import AgentRequest, consumer_alive, send_request


async def until(bus: Bus, channel: str, alive: bool, within: float = 20.0) -> float:
    """Seconds until ``consumer_alive`` says ``alive``."""
    started = time.monotonic()
    while await consumer_alive(bus, channel) != alive:
        assert time.monotonic() - started < within, f"presence never became {alive}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_a_request_reaches_the_consuming_agent_with_everything_it_needs(sdk_url: str) -> None:
    request = AgentRequest(
        id="req-1", channel="support", run_id="run-answer", thread_id="chat-1", tenant="acme",
        messages=[{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        body={"model": "small"}, trigger="submit-message",
    )
    async with Publisher.connect(sdk_url) as pub, open_bus(sdk_url) as edge_side:
        assert not await consumer_alive(edge_side, "support")
        incoming = pub.requests("support")
        first = asyncio.ensure_future(anext(incoming))
        await until(edge_side, "support", True)
        await send_request(edge_side, AgentRequest(id="req-0", channel="elsewhere", run_id="run-other"))
        await send_request(edge_side, request)
        got = await asyncio.wait_for(first, 20)
        run = pub.run_for(got)
        await incoming.aclose()  # type: ignore[attr-defined]
    assert got == request
    assert (run.run_id, run.tenant, run.thread_id) == ("run-answer", "acme", "chat-1")


async def test_presence_ends_soon_after_the_agent_stops_consuming(sdk_url: str) -> None:
    """A consumer that stopped (or died) is not alive once its announced ttl has passed."""
    async with Publisher.connect(sdk_url) as pub, open_bus(sdk_url) as edge_side:
        incoming = pub.requests("ops", ttl_s=1.5)
        pending = asyncio.ensure_future(anext(incoming))
        await until(edge_side, "ops", True)
        await asyncio.sleep(2.0)  # heartbeats keep it alive past one ttl
        assert await consumer_alive(edge_side, "ops")
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await incoming.aclose()  # type: ignore[attr-defined]
        gone_after = await until(edge_side, "ops", False)
    assert gone_after <= 1.5 + 1.0
