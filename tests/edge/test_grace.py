"""Invariant 7 (bounded by live work): a finished run's hot keys (raw and shaped delivery
streams, control stream, and the writer checkpoints beside them) expire ``grace`` seconds after
its terminal event — what still arrives for it then is dropped, not started anew — and every resume
after that — from seq 0 or mid-run, SSE or NDJSON, full or shaped — is served whole from the
replay log (Koder agent stream §7 T3). A run still streaming keeps its hot tier."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from runwire.bus import ControlCommand, keys
from runwire.core.envelope import Event, make
from tests.e2e_harness import decoded, ndjson, pipeline, same_shard, sse, unique, wait_for_terminal

GRACE_S = 1


async def keys_gone(redis: Redis, names: list[str], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while True:
            if await redis.exists(*names) == 0:
                return
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_finished_runs_hot_keys_expire_after_the_grace_and_resumes_come_from_the_log(
    redis_url: str, tmp_path: Any
) -> None:
    finished, live = unique("graced"), unique("live")
    async with pipeline(redis_url, f"sqlite:///{tmp_path}/r.db", workers=1,
                        bus_options=f"grace={GRACE_S}") as pipe, \
            httpx.AsyncClient(timeout=30) as http:
        prefix = pipe.bus.prefix  # type: ignore[attr-defined]
        run = pipe.publisher.run(finished)
        child = pipe.publisher.run(f"{finished}-child", parent=run)
        published: list[Event] = [await run.emit("run.lifecycle", {"state": "running"})]
        await pipe.bus.send_control(ControlCommand(command="pause", run_id=finished, id="c1"))
        for index in range(40):
            published.append(await run.emit("text.delta", {"text": f"{index} "}))
            if index % 10 == 0:
                await child.emit("reasoning.delta", {"text": "thinking"})
        await child.finish("done")
        published.append(await run.finish("done"))
        other = pipe.publisher.run(live)
        await other.emit("run.lifecycle", {"state": "running"})
        await pipe.publisher.flush()
        await wait_for_terminal(pipe.store, finished)
        logged = await pipe.store.read(finished)
        assert len(logged) > len(published)  # the child's events are fanned in

        redis = Redis.from_url(redis_url)
        try:
            hot = [keys.delivery_key(prefix, finished, "raw"), keys.delivery_key(prefix, finished, "shaped"),
                   keys.meta_key(prefix, finished, "raw"), keys.meta_key(prefix, finished, "shaped"),
                   keys.control_key(prefix, finished),
                   keys.delivery_key(prefix, f"{finished}-child", "raw"),
                   keys.meta_key(prefix, f"{finished}-child", "raw")]
            await keys_gone(redis, hot)  # the writer checkpoints (meta) too: nothing of it is left
            assert await redis.exists(keys.delivery_key(prefix, live, "raw")) == 1
            assert await redis.pttl(keys.delivery_key(prefix, live, "raw")) > 3_600_000
            assert await redis.pttl(keys.meta_key(prefix, live, "raw")) > 3_600_000

            # what still comes for the finished run (an entry redelivered after a long outage, an
            # event sent after its end) is dropped: not a new run from seq 1, no hot key again
            late = make("text.delta", {"text": "late"}, id=f"{finished}-late",
                        ts=published[-1].ts, run_id=finished, seq=published[-1].seq + 1)
            await pipe.bus.publish([published[5], late])
            # a marker on the same ingest shard, after them: once it is written, they were handled
            marker = pipe.publisher.run(same_shard(pipe.bus, finished))
            await marker.finish("done")
            await pipe.publisher.flush()
            await wait_for_terminal(pipe.store, marker.run_id)
            assert await redis.exists(*hot) == 0
            assert await pipe.store.read(finished) == logged
        finally:
            await redis.aclose()

        base = f"{pipe.edge.url}/v1/runs/{finished}/stream"
        middle = logged[len(logged) // 2].seq
        full_from_0 = decoded(await sse(http, f"{base}?detail=full"))
        full_from_middle = decoded(await sse(http, f"{base}?detail=full",
                                             headers={"Last-Event-ID": str(middle)}))
        shaped_from_0 = decoded(await sse(http, base))
        lines_from_0 = await ndjson(http, f"{base}?detail=full")
        lines_from_middle = await ndjson(http, f"{base}?detail=full&after={middle}")
        metrics = (await http.get(f"{pipe.edge.url}/metrics")).text

    ids = [e.id for e in logged]
    assert [e["id"] for e in full_from_0] == ids
    assert [e["id"] for e in full_from_middle] == ids[middle:]
    assert [e["id"] for e in lines_from_0] == ids
    assert [e["id"] for e in lines_from_middle] == ids[middle:]
    assert [e["seq"] for e in full_from_0] == list(range(1, len(ids) + 1))
    assert shaped_from_0[-1]["type"] == "run.lifecycle" and shaped_from_0[-1]["payload"]["state"] == "done"
    texts = "".join(e["payload"].get("text", "") for e in shaped_from_0
                    if e["type"] == "text.delta" and not e.get("child_id"))
    assert texts == "".join(f"{index} " for index in range(40))
    assert 'runwire_edge_resumes_total{source="log"}' in metrics
