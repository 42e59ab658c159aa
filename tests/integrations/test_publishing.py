"""A slow or down bus never kills the agent (every integration publishes through
:class:`runwire.integrations.agentrun.AgentRun`): each emit waits at most ``publish_timeout``
for room, then ``on_publish_error="continue"`` counts what was not published and the agent goes
on, while ``"raise"`` raises :class:`PublishFailed`. Tested against a Redis of the test's own at
``maxmemory`` and stopped; what was not counted as unpublished reaches the bus exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from redis.asyncio import Redis

from runwire.core.errors import DeliveryTimeout
from runwire.integrations.agentrun import AgentRun, PublishFailed
from runwire.sdk.publisher import Publisher
from tests.bus.reading import consume
from tests.services import RedisServer

DELTAS = 400




def small_publisher(url: str, delivery_timeout: float) -> Publisher:
    """A publisher whose queue fills after 50 events, so a stuck bus shows within the test."""
    return Publisher.connect(url, max_pending=50, linger_ms=1.0, delivery_timeout=delivery_timeout)


async def test_at_maxmemory_the_agent_goes_on_and_what_it_did_not_count_arrives_once(
    own_redis: RedisServer, admin: Redis
) -> None:
    url = f"{own_redis.url}?shards=1"
    async with small_publisher(url, delivery_timeout=60) as pub:
        async with AgentRun(pub, "full-1", framework="test", publish_timeout=0.2) as run:
            await pub.flush()
            await admin.config_set("maxmemory", 1)  # every write refused: the publisher pauses
            started = time.monotonic()
            for index in range(DELTAS):
                await run.text(f"{index} ")
            elapsed = time.monotonic() - started
            await admin.config_set("maxmemory", 0)
            await pub.flush()  # what was queued goes out: the run's end then finds room at once
        await pub.flush()
    assert 0 < run.unpublished < DELTAS
    assert elapsed < 2, f"the agent waited {elapsed:.1f}s for a full bus"
    events = await consume(url, want=DELTAS + 2 - run.unpublished, then_nothing=True)
    texts = [e.payload.text for e in events if e.type == "text.delta"]  # type: ignore[union-attr]
    assert len(texts) == DELTAS - run.unpublished == len(set(texts))
    assert [e.payload.state for e in events if e.type == "run.lifecycle"] == ["running", "done"]  # type: ignore[union-attr]


async def test_a_stopped_redis_never_stops_the_agent(own_redis: RedisServer) -> None:
    async with small_publisher(own_redis.url, delivery_timeout=1.0) as pub:
        async with AgentRun(pub, "down-1", framework="test", publish_timeout=0.2) as run:
            await pub.flush()
            own_redis.stop()
            started = time.monotonic()
            for index in range(DELTAS):
                await run.text(f"{index} ")
            elapsed = time.monotonic() - started
        assert run.unpublished > 0
        assert elapsed < 10, f"the agent waited {elapsed:.1f}s for a stopped bus"
        # the run's end waited for the publisher to give up what it held (delivery_timeout),
        # which reported it to this run: nothing is left to report
        await pub.flush()
        assert run.unpublished > 100
        own_redis.start()
        async with AgentRun(pub, "down-2", framework="test") as after:
            await after.text("back")
        await pub.flush()
        assert after.unpublished == 0
    events = await consume(own_redis.url, want=4, then_nothing=True)
    # down-1's start, which the restart lost before any group read it, was kept and sent again
    assert [(e.run_id, e.type) for e in sorted(events, key=lambda e: e.run_id)] == [  # per run in order
        ("down-1", "run.lifecycle"),
        ("down-2", "run.lifecycle"), ("down-2", "text.delta"), ("down-2", "run.lifecycle")]


async def test_on_publish_error_raise_raises_within_the_timeout(own_redis: RedisServer) -> None:
    async with small_publisher(own_redis.url, delivery_timeout=1.0) as pub:
        with pytest.raises(PublishFailed, match="not published"):
            async with AgentRun(pub, "raise-1", framework="test", publish_timeout=0.2,
                                on_publish_error="raise") as run:
                await pub.flush()
                own_redis.stop()
                async with asyncio.timeout(10):
                    for index in range(DELTAS):
                        await run.text(f"{index} ")
        with contextlib.suppress(DeliveryTimeout):
            await pub.close()


async def test_a_run_that_cannot_start_leaves_no_control_listener_behind(own_redis: RedisServer) -> None:
    """``on_publish_error="raise"`` and a bus already down with the publisher's queue full:
    opening the run raises, and the task that listens to its control channel is stopped with
    it (no ``__aexit__`` follows a failed ``__aenter__``)."""
    pub = small_publisher(own_redis.url, delivery_timeout=1.5)  # gives up after the check
    await pub.start()
    try:
        own_redis.stop()
        filler = pub.run("filler")
        for _batch in range(2):  # a batch in flight, then a full queue: the bus takes neither
            for index in range(50):
                await filler.emit("text.delta", {"text": f"{index}"}, room_timeout=0)
            await asyncio.sleep(0.05)
        assert pub.pending == 100
        with pytest.raises(PublishFailed):
            async with AgentRun(pub, "never-1", framework="test", publish_timeout=0.2,
                                on_publish_error="raise"):
                pass
        listeners = [t for t in asyncio.all_tasks() if t.get_name().startswith("runwire-controls-")]
        assert listeners == []
    finally:
        with contextlib.suppress(DeliveryTimeout):
            await pub.close()
