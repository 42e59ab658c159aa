"""What a publishing process keeps until a worker has acked it: Redis losing it is not the end.

Redis acknowledges an ``XADD`` from memory. Restarted without persistence or
flushed, restarted with AOF ``appendfsync everysec`` (up to a second of writes,
as its persistence docs say), or failed over to a replica that had not yet
received them, it no longer has entries it acknowledged — and a worker that
had not read them never will. So a process that publishes (the SDK, an edge,
a worker re-routing an event) keeps each ingest entry it published, with the
id Redis gave it, until every consumer group of the shard has read and acked
it: a worker acks an entry once it is in the replay log.

**Detection.** Each shard has a *life* marker (``{<prefix>:ingest:<n>}:life``,
a random token the first writer sets); a Redis that lost its data lost the
marker too, and the next writer sets a new one. Atomically with every publish
to a shard, the ``INGEST_ADD`` script looks up the newest entry this process
keeps for that shard: in the stream, or trimmed (trimming removes a prefix: an
id before the stream's first entry, in the same life), all is well; else Redis
lost it, the script writes nothing and says so, and the process publishes
again, in one script call, the kept entries Redis no longer has followed by
the new ones — a run's events stay in order. A task does the same check every
:data:`~runwire.bus.confirming.CONFIRM_INTERVAL_S` while anything is kept (for a publisher whose run
sent its last event) and releases what every group has read and acked (each
group's oldest pending entry, or its ``last-delivered-id`` with none pending,
asked in the same script after the loss check, so an entry lost and then
passed by other publishers' newer entries is never taken for read). Read is
not enough: a worker that loses a shard's lease drops what it fetched, for
the next owner to claim from a pending list Redis may have lost too; a worker
acks only after its replay-log write. Workers drop an event they already had by its publisher seq
(``docs/workers.md`` § Stages).

**Bounds.** At most ``retain_bytes`` of entries per process (bus URL option,
default 64 MiB; 0 keeps nothing): past it the oldest are released unconfirmed,
counted in :attr:`Kept.unprotected` with one warning. What the groups acked is
released within :data:`~runwire.bus.confirming.CONFIRM_INTERVAL_S`, so with workers keeping up a
process keeps about half a second of what it publishes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..confirming import Confirming
from .entries import IngestEntry
from .link import INGEST_ADD, INGEST_CONFIRM, ScriptCall, text

log = logging.getLogger(__name__)

MAX_REPUBLISH = 3
"""An entry published again this many times and still lost is let go (a MAXLEN cap keeps
trimming it, say), with a warning: never a loop."""

WARN_EVERY_S = 10.0
"""Warnings about entries published again are at most this often (each one says how many)."""

StreamId = tuple[int, int]


def stream_id(value: bytes | str) -> StreamId:
    ms, _, seq = text(value).partition("-")
    return int(ms), int(seq or 0)


def life_key(ingest_key: str) -> str:
    """The life marker of an ingest shard (same hash slot as the shard)."""
    return f"{ingest_key}:life"


@dataclass(slots=True)
class Entry:
    id: str
    entry: IngestEntry
    republished: int = 0

    @property
    def size(self) -> int:
        return len(self.entry[2]) + 64


@dataclass(slots=True)
class Shard:
    """One ingest shard's kept entries, in the order published, and its life as last seen."""

    entries: deque[Entry] = field(default_factory=deque)
    life: str = ""
    unread: bool = False
    """No consumer group reads the shard (as last confirmed): closing does not wait for it."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    top: StreamId = (0, 0)
    """The newest kept entry's id (kept up to date, not searched for at every publish)."""
    top_id: str = ""

    def newest(self) -> str:
        return self.top_id if self.entries else ""

    def note(self, entry_id: str) -> None:
        parsed = stream_id(entry_id)
        if parsed > self.top or not self.top_id:
            self.top, self.top_id = parsed, entry_id

    def recount(self) -> None:
        """Find the newest again (after ids changed or entries were let go)."""
        self.top, self.top_id = (0, 0), ""
        for entry in self.entries:
            self.note(entry.id)


Scripts = Callable[[Sequence[ScriptCall]], Awaitable[list[Any]]]
"""Runs script calls in one round trip, their replies in order (the bus's)."""


class Kept(Confirming):
    """The entries a process published that some group has not acked yet, per ingest shard."""

    def __init__(self, limit_bytes: int, scripts: Scripts) -> None:
        super().__init__()
        self.limit = limit_bytes
        self.scripts = scripts
        self.shards: dict[str, Shard] = {}
        self.bytes = 0
        self.unprotected = 0
        """Entries released unconfirmed: over ``retain_bytes``, or lost again and again."""
        self.republished = 0
        """Entries Redis lost and this process published again."""
        self._said_at = -WARN_EVERY_S
        self._unsaid = 0
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def shard(self, key: str) -> Shard:
        shard = self.shards.get(key)
        if shard is None:
            shard = self.shards[key] = Shard()
        return shard

    def add_calls(self, shards: Sequence[tuple[str, Sequence[IngestEntry]]]) -> list[ScriptCall]:
        """The ``INGEST_ADD`` call publishing each ``(ingest key, entries)``."""
        return [(INGEST_ADD, [key, life_key(key)], self.add_args(key, entries)) for key, entries in shards]

    async def published_all(self, shards: Sequence[tuple[str, Sequence[IngestEntry]]],
                            replies: Sequence[Any]) -> None:
        """Record the replies of :meth:`add_calls`; publish again where Redis lost kept entries."""
        for (key, entries), reply in zip(shards, replies, strict=True):
            if reply[0] == 1:
                self.published(key, reply, entries)
            else:
                await self.republish(key, entries)

    async def republish(self, key: str, entries: Sequence[IngestEntry]) -> None:
        """Redis lost entries this process published on ``key``: publish them again, then
        ``entries``, in one script call (so a run's events stay in order)."""
        async with self.shard(key).lock:
            kept = list(self.shard(key).entries)  # as sent: others may add or let go meanwhile
            [reply] = await self.scripts(
                [(INGEST_ADD, [key, life_key(key)], self.republish_args(key, kept, entries))])
            self.published(key, reply, entries, republished=kept)

    async def confirm(self) -> None:
        """One round of checks over the shards with kept entries: publish again what Redis
        lost, let go of what every group read and acked."""
        shards = [(key, shard) for key, shard in self.shards.items() if shard.entries]
        if not shards:
            return
        replies = await self.scripts([(INGEST_CONFIRM, [key, life_key(key)], self.confirm_args(key))
                                      for key, _ in shards])
        for (key, _shard), reply in zip(shards, replies, strict=True):
            if reply[0] == 1:
                self.release(key, text(reply[1]), text(reply[2]), inclusive=reply[3] == 1)
            else:
                await self.republish(key, [])

    def add_args(self, key: str, entries: Sequence[IngestEntry]) -> list[Any]:
        """``INGEST_ADD``'s ARGV for publishing ``entries`` to ``key``, checking the newest kept."""
        shard = self.shard(key)
        args: list[Any] = [shard.life, os.urandom(8).hex(), shard.newest()]
        for entry in entries:
            args += ("", *entry)
        return args

    def confirm_args(self, key: str) -> list[Any]:
        """``INGEST_CONFIRM``'s ARGV for ``key``."""
        shard = self.shard(key)
        return [shard.life, os.urandom(8).hex(), shard.newest()]

    def republish_args(self, key: str, kept: Sequence[Entry], entries: Sequence[IngestEntry]) -> list[Any]:
        """ARGV publishing those of ``kept`` Redis lost, then ``entries``, without the check."""
        args: list[Any] = [self.shard(key).life, os.urandom(8).hex(), ""]
        for old in kept:
            args += (old.id, *old.entry)
        for entry in entries:
            args += ("", *entry)
        return args

    def published(self, key: str, reply: list[Any], entries: Sequence[IngestEntry], *,
                  republished: Sequence[Entry] = ()) -> int:
        """Record a successful ``INGEST_ADD`` reply ``[1, life, ids…]`` for ``republished``
        (kept entries sent again) then ``entries``; returns how many were published again."""
        shard = self.shard(key)
        ids = [text(value) for value in reply[2:]]
        again = 0
        if republished:
            for kept, new_id in zip(republished, ids, strict=False):
                if kept.id != new_id:
                    kept.id = new_id
                    kept.republished += 1
                    again += 1
            self.republished += again
            self._say_republished(again)
            ids = ids[len(republished):]
            self._let_go_lost_again(shard)
            shard.recount()
        shard.life = text(reply[1])
        if not self.enabled:
            return again
        for entry_id, entry in zip(ids, entries, strict=True):
            kept = Entry(entry_id, entry)
            shard.entries.append(kept)
            shard.note(entry_id)
            self.bytes += kept.size
        self._bound()
        self._start()
        return again

    def release(self, key: str, life: str, point: str, *, inclusive: bool) -> None:
        """Let go of what every group of the shard has read and acked (the entries before
        ``point``, the groups' oldest safe point; ``point`` itself too if ``inclusive``), if
        the reply is of the life the entries were published in."""
        shard = self.shard(key)
        shard.unread = not point
        if not point or life != shard.life:
            return
        upto = stream_id(point)
        keep = [e for e in shard.entries
                if stream_id(e.id) > upto or (not inclusive and stream_id(e.id) == upto)]
        self.bytes -= sum(e.size for e in shard.entries) - sum(e.size for e in keep)
        shard.entries = deque(keep)
        if not keep:
            shard.recount()

    def _say_republished(self, count: int) -> None:
        """One warning per loss (at most one per :data:`WARN_EVERY_S`, with the count since)."""
        self._unsaid += count
        now = time.monotonic()
        if self._unsaid and now - self._said_at >= WARN_EVERY_S:
            log.warning("Redis lost %d ingest entries this process had published and no worker had "
                        "read (restarted without persistence, flushed or failed over): published them "
                        "again", self._unsaid)
            self._said_at, self._unsaid = now, 0

    def _let_go_lost_again(self, shard: Shard) -> None:
        again = [e for e in shard.entries if e.republished >= MAX_REPUBLISH]
        if again:
            log.warning("%d ingest entries were lost %d times each; no longer kept", len(again),
                        MAX_REPUBLISH)
            self.unprotected += len(again)
            self.bytes -= sum(e.size for e in again)
            shard.entries = deque(e for e in shard.entries if e.republished < MAX_REPUBLISH)

    def _bound(self) -> None:
        while self.bytes > self.limit:
            oldest = min((s for s in self.shards.values() if s.entries),
                         key=lambda s: stream_id(s.entries[0].id))
            dropped = oldest.entries.popleft()
            if not oldest.entries:
                oldest.recount()
            self.bytes -= dropped.size
            self.unprotected += 1
            if not self._warned:
                self._warned = True
                log.warning("more than %d bytes published that the workers have not acked yet: the oldest "
                            "are no longer kept, and only Redis's own persistence protects them "
                            "(retain_bytes in the bus URL)", self.limit)

    def awaited(self) -> bool:
        return any(shard.entries and not shard.unread for shard in self.shards.values())
