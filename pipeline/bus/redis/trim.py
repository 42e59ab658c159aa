"""Ingest shards trimmed once every consumer group has acked: Redis holds live work only.

An entry of an ingest shard is needed while some group reading the shard
has not acked it. A group's **safe point** is its oldest pending entry, or,
with nothing pending, its last delivered entry: everything before it was
delivered and acked. ``XTRIM MINID ~ <oldest safe point of all groups>``
therefore drops only entries every group is done with (approximately:
Redis trims whole stream nodes, so a few more stay). The owner of a shard
in each group trims it every :data:`TRIM_INTERVAL_S` as it acks; trimming
is a deletion Redis allows at ``maxmemory``, so it frees memory during a
pause too.

``ingest_maxlen`` (``XADD … MAXLEN ~``) stays as the cap for a group that
lags: entries it loses to the cap are gone before it read them. A group
whose last delivered entry is older than the shard's first entry has lost
``entries-added − length − entries-read`` entries (every removed entry was
read by it or lost to it; Redis ≥ 7 keeps both counters). Each trim records
that total per group in ``{<prefix>:ingest:<shard>}:lost`` (raised, never
lowered), which the edge exports as ``runwire_ingest_lost_entries`` (each
entry held up to 64 events). It is seen while the group is behind: a group
that reads across the gap within :data:`TRIM_INTERVAL_S` of it opening
(no trim ran meanwhile) goes uncounted; the consumer's warning on claimed
entries trimmed while pending covers those it had already read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .. import keys
from .link import RedisLink, retriable_bus_errors, text

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 1.0
"""How often the owner of a shard trims it."""


def lost_key(prefix: str, shard: int) -> str:
    """The hash of entries each group lost to ``ingest_maxlen`` on one shard (its slot)."""
    return f"{keys.ingest_key(prefix, shard)}:lost"


def _id(value: Any) -> tuple[int, int]:
    ms, _, seq = text(value).partition("-")
    return int(ms), int(seq or 0)


def safe_point(group: dict[str, Any], oldest_pending: Any) -> tuple[int, int]:
    """The id before which a group has acked everything (see the module docstring)."""
    if int(group.get("pending") or 0) and oldest_pending is not None:
        return _id(oldest_pending)
    return _id(group.get("last-delivered-id") or "0-0")


class IngestTrimmer:
    """Trims the ingest shards one group's consumer owns and counts what each group lost."""

    def __init__(self, link: RedisLink, prefix: str, group: str, ttl_s: int) -> None:
        self.link = link
        self.prefix = prefix
        self.group = group
        self.ttl_ms = ttl_s * 1000
        self.trimmed = 0
        """Entries this trimmer removed."""
        self._next = 0.0
        self._warned: set[int] = set()

    async def maybe_trim(self, shards: Iterable[int]) -> None:
        """Trim ``shards`` when :data:`TRIM_INTERVAL_S` has passed since the last time."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + TRIM_INTERVAL_S
        owned = sorted(shards)
        if owned:
            await self.trim(owned)

    async def trim(self, shards: Sequence[int]) -> None:
        names = [keys.ingest_key(self.prefix, shard) for shard in shards]
        with retriable_bus_errors("trim ingest"):
            pipe = self.link.redis.pipeline(transaction=False)
            for name in names:
                pipe.xinfo_stream(name)
                pipe.xinfo_groups(name)
            replies = await pipe.execute(raise_on_error=False)
            infos = [(replies[2 * i], replies[2 * i + 1]) for i in range(len(names))]
            pipe = self.link.redis.pipeline(transaction=False)
            asked: list[tuple[int, str]] = []
            for index, (stream, groups) in enumerate(infos):
                if isinstance(stream, Exception) or isinstance(groups, Exception):
                    continue
                for group in groups:
                    if int(group.get("pending") or 0):
                        pipe.xpending(names[index], text(group["name"]))
                        asked.append((index, text(group["name"])))
            pending = dict(zip(asked, await pipe.execute(), strict=True)) if asked else {}
            pipe = self.link.redis.pipeline(transaction=False)
            trims: list[int] = []
            for index, (stream, groups) in enumerate(infos):
                if isinstance(stream, Exception) or isinstance(groups, Exception) or not groups:
                    continue
                points = [safe_point(g, (pending.get((index, text(g["name"]))) or {}).get("min"))
                          for g in groups]
                oldest = min(points)
                if oldest > (0, 0):
                    trims.append(len(pipe))
                    pipe.xtrim(names[index], minid=f"{oldest[0]}-{oldest[1]}", approximate=True)
                self._count_lost(pipe, shards[index], stream, groups)
            if not len(pipe):
                return
            results = await pipe.execute(raise_on_error=False)
        for position in trims:
            if isinstance(results[position], int):
                self.trimmed += results[position]
        for result in results:
            if isinstance(result, Exception):  # e.g. counting refused at maxmemory: next time
                log.debug("ingest trim step failed: %s", result)

    def _count_lost(self, pipe: Any, shard: int, stream: dict[str, Any],
                    groups: list[dict[str, Any]]) -> None:
        """Record the entries each group lost to ``ingest_maxlen`` on ``shard``, if any."""
        first = stream.get("first-entry")
        if not first:
            return
        name = lost_key(self.prefix, shard)
        for group in groups:
            position = _id(group.get("last-delivered-id") or "0-0")
            if position >= _id(first[0]):
                continue  # nothing it has not read was removed
            added, read = stream.get("entries-added"), group.get("entries-read")
            if read is None and position == (0, 0):  # a group that never read (Redis says nil)
                read = 0
            if added is None or read is None:  # Redis < 7: no counters, say it (once)
                if shard not in self._warned:
                    self._warned.add(shard)
                    log.warning("group %r lags behind the start of ingest shard %d: entries it "
                                "never read were trimmed by ingest_maxlen", text(group["name"]),
                                shard)
                continue
            lost = int(added) - int(stream.get("length") or 0) - int(read)
            if lost > 0:
                # a total, not an increment (every removed entry was read or lost), raised
                # monotonically, so the trimmers of several groups may all record it
                pipe.eval(_RAISE_TO, 1, name, text(group["name"]), lost)
                pipe.pexpire(name, self.ttl_ms)


_RAISE_TO = """
local now = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > now then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""
