"""A quiet run's last shaping window closes even when its worker dropped what it held.

A worker that loses its shards (a lease expired under load, another member joined) drops its
in-memory streams and meets a run again at the run's next event. A run that went quiet with
deltas in an open window has no next event for a while, yet its last words must reach the
shaped view within the quiet time once its shard is owned again (``docs/workers.md`` § Clocks).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis

from runwire.bus import keys, open_bus
from runwire.processing.processor import Processor
from runwire.processing.stages import Stages
from runwire.processing.worker_loop import ConsumerLoop
from runwire.store import open_store
from tests.events import event
from tests.services import RedisServer
from tests.waiting import until
from tests.workers.checks import read_all
from tests.workers.test_logic import texts


async def test_a_quiet_runs_open_window_closes_after_its_worker_loses_and_retakes_its_shards(
    own_redis: RedisServer, admin: Redis, tmp_path: Path
) -> None:
    frozen: list[float | None] = [time.time()]
    # the worker's clock stands still until the shards are back: its tick cannot find the run
    # quiet before then, so the window is still open when the worker drops its streams
    processor = Processor(clock=lambda: frozen[0] or time.time())
    run_id = f"quiet{uuid.uuid4().hex[:6]}"
    said = [event(run_id, seq, text=f"w{seq} ", second=seq / 100) for seq in range(1, 4)]
    leases = [keys.lease_key("quiet", "g", shard) for shard in (0, 1)]
    async with open_bus(f"{own_redis.url}?shards=2&lease_ms=600&prefix=quiet") as bus, \
            open_store(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        consumer = bus.consumer("g", "w0")
        stop = asyncio.Event()
        stages = Stages(bus, store, processor, stop, dead_letter=consumer.dead_letter)
        worker = asyncio.create_task(ConsumerLoop(consumer, stages).loop(batch=64, tick_s=0.05, burst=False))

        async def raw_in() -> bool:
            return len(await read_all(bus, run_id)) == len(said)

        async def shaped_out() -> bool:
            return bool(await bus.read((run_id, "shaped"), 0, limit=100))

        try:
            await bus.publish(said)
            await until(raw_in, within=30, what="the deltas on the raw view")
            assert await bus.read((run_id, "shaped"), 0, limit=100) == []  # one open window
            for lease in leases:  # another member holds the shards (as after a late renewal)
                await admin.set(lease, "w1", px=60_000)
            await until(lambda: not processor.holds(run_id), within=30, what="the streams dropped")
            await admin.delete(*leases)
            await until(lambda: consumer.owned_shards() == {0, 1}, within=30, what="the shards back")
            frozen[0] = None
            await until(shaped_out, within=10, what="the quiet run's last window closed")
            assert texts(await bus.read((run_id, "shaped"), 0, limit=100)) == "w1 w2 w3 "
            assert not worker.done()
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
            await consumer.close()
