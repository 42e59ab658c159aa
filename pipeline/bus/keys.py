"""Key and topic names, in one place (Redis keys are hash-tagged by run)."""

from __future__ import annotations

import zlib


def shard_for(root_run_id: str, shards: int) -> int:
    """Stable shard of a root run: CRC32 of its id modulo the shard count."""
    return zlib.crc32(root_run_id.encode()) % shards
