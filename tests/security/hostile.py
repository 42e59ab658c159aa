"""Putting bytes on the bus the way a hostile or broken producer would (no SDK checks on the way)."""

from __future__ import annotations

from typing import Any

import msgspec

from runwire.bus import Bus
from runwire.bus.keys import shard_for

_json = msgspec.json.Encoder()


def frame(run_id: str, seq: int, type: str = "text.delta", payload: Any = None, **fields: Any) -> bytes:
    """A canonical-looking frame with any values at all (nothing validated)."""
    body: dict[str, Any] = {
        "id": f"evt_{run_id}_{seq}",
        "ts": "2026-05-14T19:42:13.000Z",
        "type": type,
        "run_id": run_id,
        "seq": seq,
        "payload": {"text": f"t{seq}"} if payload is None else payload,
        **fields,
    }
    return _json.encode(body)


def nested(depth: int) -> msgspec.Raw:
    """A JSON value nested ``depth`` levels deep (lists), as raw JSON to embed in a frame."""
    return msgspec.Raw(b"[" * depth + b"]" * depth)


async def publish_raw(bus: Bus, run_id: str, frames: list[bytes]) -> None:
    """Put frames on the run's ingest shard as they are."""
    shard = shard_for(run_id, bus.shards)
    if bus.url.startswith("memory"):
        state = bus.state  # type: ignore[attr-defined]
        for data in frames:
            state.shards[shard].append(data)
            state.backlog += 1
        state.ingest_changed.notify()
        return
    import redis.asyncio as aioredis

    from runwire.bus.keys import DATA_FIELD, ingest_key

    client = aioredis.Redis.from_url(bus.url.split("?", 1)[0])
    try:
        async with client.pipeline(transaction=False) as pipe:
            for data in frames:
                pipe.xadd(ingest_key(bus.options.prefix, shard), {DATA_FIELD: data})  # type: ignore[attr-defined]
            await pipe.execute()
    finally:
        await client.aclose()
