"""A consumer-group member on the Redis ingest shards.

Shard ownership (so one root run has one serial owner while consumers scale
out): members heartbeat into a sorted set; member *i* of *n* (by name) wants
the shards ``s`` with ``s % n == i`` and holds each with a lease key
(``SET NX PX``), renewed by a background task while the process lives and
released on close. When a member dies its heartbeat and leases expire after
``lease_ms`` and the survivors take its shards over. All of that is one Lua
script on the group's hash-tagged keys.

``fetch`` returns, in order:

1. on every shard it (re)acquires, this consumer's own pending entries
   (``XREADGROUP … 0``: what it held before a restart, e.g. when a worker
   comes back under the same name), all of them before any new entry of
   that shard — a shard acquired only at a later fetch gets the same;
2. on a newly acquired shard, the previous owner's pending entries once they
   have been idle ``claim_idle_ms`` (``XAUTOCLAIM``) — and no new entry of
   that shard is read until none of them is left, so per-run order holds
   across the handover; on every owned shard, every ``claim_idle_ms / 2``,
   entries (its own included) left unacked longer than ``claim_idle_ms``;
3. new entries (``XREADGROUP … >``).

Delivery counts come from Redis (``XPENDING``). The consumer dead-letters an
entry itself once it was delivered more than ``max_deliveries`` times, so an
entry that crashes the worker (which then cannot dead-letter it) still stops
looping; a worker that recognises a bad entry calls ``dead_letter`` at once.

A missing group (``NOGROUP``: Redis lost its state) is recreated with a
warning, never swallowed.

Just over ~400 lines: one consumer, whose fetch steps (own pending entries,
claims, new entries, each with a Cluster variant) share its lease state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.exceptions as rexc

from ...core.errors import BusUnavailable
from .. import keys
from ..base import Consumer, Delivery, Entry, Fetched, each_event, event_count
from ..ingest_entries import INGEST_ENTRY_EVENTS, OpenEntries
from ..options import BusOptions
from .entries import ingest_entry
from .link import MEMBERSHIP, RedisLink, retriable_bus_errors, text
from .trim import IngestTrimmer

log = logging.getLogger(__name__)
T = TypeVar("T")
StreamEntry = tuple[bytes, dict[bytes, bytes] | list[bytes] | None]


class RedisConsumer(Consumer):
    """See the module docstring."""

    def __init__(
        self, link: RedisLink, options: BusOptions, group: str, name: str, *, claim_idle_ms: int
    ) -> None:
        self.link = link
        self.options = options
        self.group = group
        self.name = name
        self.claim_idle_ms = claim_idle_ms
        self.lease_ms = options.lease_ms
        self._owned: set[int] = set()
        self._clear: set[int] = set()
        """Owned shards on which no other consumer has pending entries."""
        self._started = False
        self._own_pending_cursor: dict[int, str] = {}
        """Owned shards whose own pending entries are being re-read → last entry id read."""
        self._own_pending_done: set[int] = set()
        """Owned shards whose own pending entries have all been re-read."""
        self._renewer: asyncio.Task[None] | None = None
        self._next_rebalance = 0.0
        self._life = ""
        self._next_sweep = 0.0
        self._closed = False
        self._open: OpenEntries[tuple[int, str]] = OpenEntries()
        """Entries of several events handed out, by (shard, id): ids are per shard."""
        self._trimmer = IngestTrimmer(link, options.prefix, group, options.ttl)
        self._full: set[str] = set()
        """The shards (keys) a read of the fetch under way filled the share of: they may hold more,
        and the fetch's next read asks only them."""
        self._reread: set[str] = set()
        """The shards the read under way asks (empty: every clear shard)."""
        self._per_entry = float(INGEST_ENTRY_EVENTS)
        """Events per entry in the last fetch (at first the most an entry holds), so that a
        fetch of ``max_count`` events asks for ``max_count / _per_entry`` entries."""

    def owned_shards(self) -> frozenset[int]:
        return frozenset(self._owned)

    def redeliver(self) -> None:
        self._own_pending_done.clear()
        self._own_pending_cursor.clear()

    def _key(self, shard: int) -> str:
        return keys.ingest_key(self.options.prefix, shard)

    # ---- group and membership -----------------------------------------------
    async def _create_groups(self) -> None:
        pipe = self.link.redis.pipeline(transaction=False)
        for shard in range(self.options.shards):
            pipe.xgroup_create(self._key(shard), self.group, id="0", mkstream=True)
        for result in await pipe.execute(raise_on_error=False):
            if isinstance(result, Exception) and "BUSYGROUP" not in str(result):
                raise result

    async def _membership(self, mode: str) -> set[int]:
        lease_keys = [keys.lease_key(self.options.prefix, self.group, s)
                      for s in range(self.options.shards)]
        call_keys = [keys.members_key(self.options.prefix, self.group), *lease_keys]
        (held,) = await self.link.run_scripts([(MEMBERSHIP, call_keys,
                                               [self.name, self.lease_ms, mode])])
        return {int(s) for s in held}

    async def _renew_forever(self) -> None:
        """Heartbeat and lease renewal while this process lives."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.renew_leases()
            except (BusUnavailable, rexc.RedisError) as exc:
                log.debug("lease renewal of %s/%s failed: %s", self.group, self.name, exc)
                continue
            await self._check_life()

    async def renew_leases(self) -> None:
        before = set(self._owned)  # a rebalance may acquire shards meanwhile
        held = await self._membership("renew")
        lost = before - held
        if lost:  # expired while this process stalled: stop reading them at once
            log.warning("%s/%s lost the leases of shards %s", self.group, self.name, sorted(lost))
            self._owned -= lost
            self._clear -= lost
            self.shard_losses += 1

    async def _check_life(self) -> None:
        """Count a loss of Redis's state (:attr:`state_losses`) the group's life marker shows:
        a random token the first member sets; a Redis that lost its data lost it too. (A
        group recreated after ``NOGROUP`` counts too, but only the member that recreates it
        meets that.)"""
        key = f"{keys.group_tag(self.options.prefix, self.group)}:life"
        try:
            await self.link.redis.set(key, os.urandom(8).hex(), nx=True)
            life = text(await self.link.redis.get(key) or b"")
        except (BusUnavailable, rexc.RedisError) as exc:
            log.debug("life check of %s/%s failed: %s", self.group, self.name, exc)
            return
        if self._life and life != self._life:
            self.state_losses += 1
        self._life = life

    async def _rebalance(self) -> None:
        now = time.monotonic()
        if self._owned and now < self._next_rebalance:
            return
        self._next_rebalance = now + self.lease_ms / 3000
        owned = await self._membership("rebalance")
        if self._owned - owned:
            self.shard_losses += 1
        self._clear &= owned
        self._own_pending_done &= owned
        self._own_pending_cursor = {s: c for s, c in self._own_pending_cursor.items() if s in owned}
        self._owned = owned

    # ---- fetch ---------------------------------------------------------------
    async def fetch(self, max_count: int = 512, block_ms: int = 1000, *, whole: bool = False) -> Sequence[Fetched]:
        """See :meth:`_fetch_entries`; one delivery per event unless ``whole``."""
        got = await self._fetch_entries(max_count, block_ms)
        return got if whole else each_event(got)

    async def _fetch_entries(self, max_count: int, block_ms: int) -> list[Fetched]:
        """``max_count`` events while more are ready, fewer only when none are (a runtime
        takes that as caught up). Entries hold several events, so this reads about as many
        entries as the events wanted need, again while a read came back full; an entry is
        handed out whole, so the last one may take a fetch past ``max_count``. Shards are
        read in fair shares, so a fetch reads again, from the shards that filled their share,
        while one did."""
        if self._closed:
            raise RuntimeError("consumer is closed")
        out: list[Fetched] = []
        events = 0
        with retriable_bus_errors(f"fetch {self.group}/{self.name}"):
            if not self._started:
                await self._create_groups()
                await self._check_life()
                self._renewer = asyncio.create_task(self._renew_forever())
                self._started = True
            await self._rebalance()
            self._full = set()
            while True:
                asked = max(1, -(-(max_count - events) // round(self._per_entry)))
                self._reread, self._full = self._full, set()
                wait = 0 if out else block_ms
                got = await self._recreating_group(lambda: self._collect(asked, wait))  # noqa: B023
                got = await self._screen(got)
                out += got
                events += event_count(got)
                if events >= max_count or not self._full or not got:
                    return out

    async def _recreating_group(self, step: Callable[[], Awaitable[T]]) -> T:
        try:
            return await step()
        except rexc.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        log.warning(
            "consumer group %r is missing on the ingest streams of %s (Redis lost its state: "
            "restarted without persistence, failed over or flushed); recreating it from the "
            "start of each stream — entries pending before the loss are not redelivered",
            self.group, self.link.url,
        )
        self.state_losses += 1
        await self._create_groups()
        self._clear.clear()
        return await step()

    async def _collect(self, max_count: int, block_ms: int) -> list[Fetched]:
        out: list[Fetched] = []
        out += await self._read_own_pending(max_count)
        if len(out) < max_count:
            out += await self._claim_idle(max_count - len(out))
        await self._update_clear()
        if out:
            return out
        if not self._clear:
            await asyncio.sleep(min(block_ms, 100) / 1000)
            return []
        return await self._read_new(max_count, block_ms)

    async def _read_own_pending(self, max_count: int) -> list[Fetched]:
        """This consumer's pending entries on owned shards not yet re-read, in id order.

        A shard counts as done when a read returns fewer entries than asked
        for; until then no new entry of it is read (``_update_clear``), so a
        restarted worker never processes newer entries before its older ones.
        """
        shards = sorted(self._owned - self._own_pending_done)
        if not shards:
            return []
        per_shard = max(1, -(-max_count // len(shards)))
        streams = {self._key(s): self._own_pending_cursor.get(s, "0") for s in shards}
        replies = await self._xreadgroup(streams, per_shard, None)
        got: dict[int, list[StreamEntry]] = {}
        for name, entries in replies:
            got[int(text(name).rsplit(":", 1)[1].rstrip("}"))] = list(entries or [])
        for shard in shards:
            entries = got.get(shard, [])
            if len(entries) < per_shard:
                self._own_pending_done.add(shard)
                self._own_pending_cursor.pop(shard, None)
            else:
                self._own_pending_cursor[shard] = text(entries[-1][0])
        return await self._with_counts(replies)

    async def _claim_idle(self, max_count: int) -> list[Fetched]:
        now = time.monotonic()
        if now >= self._next_sweep:
            shards = sorted(self._owned)
            self._next_sweep = now + max(self.claim_idle_ms / 2000, 0.05)
        else:
            shards = sorted(self._owned - self._clear)
        if not shards or max_count <= 0:
            return []
        per_shard = max(1, -(-max_count // len(shards)))
        pipe = self.link.redis.pipeline(transaction=False)
        for shard in shards:
            pipe.xautoclaim(self._key(shard), self.group, self.name, self.claim_idle_ms,
                            "0-0", count=per_shard)
        replies: list[tuple[str, list[StreamEntry]]] = []
        for shard, (_cursor, entries, deleted) in zip(shards, await pipe.execute(), strict=True):
            if len(entries) >= per_shard:
                self._full.add(self._key(shard))
            if deleted:
                log.warning("%d pending entries of shard %d were trimmed before group %r "
                            "processed them (raise ingest_maxlen): %s", len(deleted), shard,
                            self.group, [text(d) for d in deleted])
            if entries:
                replies.append((self._key(shard), entries))
        return await self._with_counts(replies)

    async def _update_clear(self) -> None:
        """Mark owned shards clear once no other consumer has entries pending on them."""
        unknown = sorted((self._owned & self._own_pending_done) - self._clear)
        if not unknown:
            return
        pipe = self.link.redis.pipeline(transaction=False)
        for shard in unknown:
            pipe.xpending(self._key(shard), self.group)
        for shard, summary in zip(unknown, await pipe.execute(), strict=True):
            others = [c for c in summary["consumers"] or [] if text(c["name"]) != self.name]
            if not others:
                self._clear.add(shard)

    async def _read_new(self, max_count: int, block_ms: int) -> list[Fetched]:
        shards = sorted(self._clear)
        if self._reread:  # the fetch's earlier read filled these shards' shares: only they may have more
            shards = [shard for shard in shards if self._key(shard) in self._reread] or shards
        per_shard = max(1, -(-max_count // len(shards)))
        if self.link.cluster and len(shards) > 1:
            return await self._read_new_cluster(shards, per_shard, block_ms)
        replies = await self._xreadgroup({self._key(s): ">" for s in shards}, per_shard,
                                         block_ms if block_ms > 0 else None)
        return self._deliveries(replies, {})

    async def _read_new_cluster(
        self, shards: list[int], per_shard: int, block_ms: int
    ) -> list[Fetched]:
        """Shards live in different slots: one non-blocking read per shard, pipelined
        (the client runs each node's commands concurrently), polled until ``block_ms``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_ms / 1000
        while True:
            pipe = self.link.redis.pipeline(transaction=False)
            for shard in shards:
                pipe.xreadgroup(self.group, self.name, {self._key(shard): ">"}, count=per_shard)
            replies = [item for reply in await pipe.execute() for item in reply or []]
            self._filled(replies, per_shard)
            remaining = deadline - loop.time()
            if replies or remaining <= 0:
                return self._deliveries(replies, {})
            await asyncio.sleep(min(remaining, self.options.tail_poll_ms / 1000))

    async def _xreadgroup(
        self, streams: dict[str, str], count: int, block_ms: int | None
    ) -> list[Any]:
        if self.link.cluster and len(streams) > 1:
            pipe = self.link.redis.pipeline(transaction=False)
            for name, position in streams.items():
                pipe.xreadgroup(self.group, self.name, {name: position}, count=count)
            return self._filled([item for reply in await pipe.execute() for item in reply or []], count)
        if self.link.cluster:
            replies: Any = await self.link.redis.xreadgroup(
                self.group, self.name, streams, count=count, block=block_ms)  # type: ignore[arg-type]
            return self._filled(list(replies or []), count)
        # a standalone server: the reply is parsed here (see RedisLink.raw_commands)
        command: list[bytes | str | int] = [b"XREADGROUP", b"GROUP", self.group, self.name,
                                            b"COUNT", count]
        if block_ms is not None:
            command += (b"BLOCK", block_ms)
        command += (b"STREAMS", *streams, *streams.values())
        (reply,) = await self.link.raw_commands([command])
        if isinstance(reply, dict):  # RESP3
            reply = reply.items()
        return self._filled([(name, entries) for name, entries in reply or []], count)  # fields stay raw

    def _filled(self, replies: list[Any], count: int) -> list[Any]:
        """``replies`` of a read of ``count`` entries per shard, noting whether one came back full."""
        self._full.update(text(name) for name, entries in replies if len(entries or ()) >= count)
        return replies

    async def _with_counts(self, replies: Sequence[Any]) -> list[Fetched]:
        """Deliveries of re-read / claimed entries, with Redis's delivery counters."""
        replies = [(name, entries) for name, entries in replies if entries]
        if not replies:
            return []
        pipe = self.link.redis.pipeline(transaction=False)
        for name, entries in replies:
            for entry_id, _fields in entries:
                pipe.xpending_range(name, self.group, entry_id, entry_id, 1)
        counts: dict[bytes, int] = {}
        for rows in await pipe.execute():
            counts.update({row["message_id"]: int(row["times_delivered"]) for row in rows})
        return self._deliveries(replies, counts)

    def _deliveries(self, replies: Sequence[Any], counts: dict[bytes, int]) -> list[Fetched]:
        """One delivery per entry: an entry of several events comes whole (an :class:`Entry`)."""
        out: list[Fetched] = []
        entries_seen = events = 0
        for name, entries in replies:
            shard = int(text(name).rsplit(":", 1)[1].rstrip("}"))
            entries_seen += len(entries)
            if not counts and all(type(f) is list and f[0] == b"e" for _, f in entries):
                # new single-event entries as read raw, each with the one field "e"
                out += [Delivery(entry_id=entry_id.decode(), shard=shard, data=fields[1])
                        for entry_id, fields in entries]
                events += len(entries)
                continue
            for entry_id, fields in entries:
                if fields is None:  # trimmed while pending: nothing left to deliver
                    log.warning("pending entry %s of shard %d was trimmed", text(entry_id), shard)
                    continue
                ident, times = text(entry_id), counts.get(entry_id, 1)
                data, count = ingest_entry(fields) or (b"", 1)  # no event field: poison
                if count > 1:
                    self._open.hand_out((shard, ident), count)
                out.append(Entry(ident, shard, data, count, times) if count > 1 else Delivery(ident, shard, data, times))
                events += count
        if entries_seen:
            self._per_entry = max(1.0, events / entries_seen)
        return out

    async def _screen(self, deliveries: list[Fetched]) -> list[Fetched]:
        """Dead-letter entries delivered more than ``max_deliveries`` times (each event of one)."""
        limit = self.options.max_deliveries
        poison = [d for d in deliveries if d.deliveries > limit]
        for delivery in each_event(poison):
            await self.dead_letter(delivery, f"delivered {delivery.deliveries} times without "
                                             f"an ack (max_deliveries={limit})")
        return [d for d in deliveries if d.deliveries <= limit] if poison else deliveries

    # ---- ack, dead letters, leaving --------------------------------------------
    async def ack(self, deliveries: Sequence[Fetched]) -> None:
        """XACK the entries of ``deliveries``; an entry of several events once each of them
        was acked or dead-lettered (a worker acks them together, after one write)."""
        if not deliveries:
            return
        by_shard: dict[int, list[str]] = {}
        for delivery in deliveries:
            if self._settle(delivery):
                by_shard.setdefault(delivery.shard, []).append(delivery.entry_id)
        if not by_shard:
            return
        with retriable_bus_errors(f"ack {self.group}/{self.name}"):
            if not self.link.cluster:
                await self.link.raw_commands([[b"XACK", self._key(shard), self.group, *ids]
                                             for shard, ids in by_shard.items()])
            else:
                pipe = self.link.redis.pipeline(transaction=False)
                for shard, ids in by_shard.items():
                    pipe.xack(self._key(shard), self.group, *ids)
                await pipe.execute()
        try:  # what every group acked leaves the shard (trim.py); the ack stands anyway
            await self._trimmer.maybe_trim(self._owned)
        except (BusUnavailable, rexc.RedisError) as exc:
            log.debug("trimming the ingest shards of %s failed: %s", self.group, exc)

    async def dead_letter(self, delivery: Fetched, reason: str) -> None:
        """XADD to the dead-letter stream and XACK the entry (one round trip); an entry
        holding other events too is acked once each of them is acked or dead-lettered."""
        fields: dict[str, bytes | str | int] = {
            "e": delivery.data, "reason": reason, "group": self.group,
            "deliveries": delivery.deliveries, "shard": delivery.shard,
            "entry_id": delivery.entry_id,
        }
        with retriable_bus_errors("dead-letter"):
            pipe = self.link.redis.pipeline(transaction=False)
            pipe.xadd(keys.dead_letter_key(self.options.prefix), fields,  # type: ignore[arg-type]
                      maxlen=self.options.dead_letter_maxlen, approximate=True)
            if self._settle(delivery):
                pipe.xack(self._key(delivery.shard), self.group, delivery.entry_id)
            await pipe.execute()
        log.warning("dead-lettered entry %s of shard %d in group %s after %d deliveries: %s",
                    delivery.entry_id, delivery.shard, self.group, delivery.deliveries, reason)

    def _settle(self, delivery: Fetched) -> bool:
        """Mark one event (or a whole entry) done; True when its entry has no event left open."""
        if type(delivery) is Delivery:
            return self._open.settle((delivery.shard, delivery.entry_id), delivery.part)
        return self._open.settle_all((delivery.shard, delivery.entry_id))

    async def close(self) -> None:
        """Release leases and leave; unacked entries stay pending for a successor."""
        if self._closed:
            return
        self._closed = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._started and self.link.connected:
            try:
                await self._membership("leave")
            except BusUnavailable as exc:
                log.warning("could not leave group %s cleanly (%s); leases expire in %d ms",
                            self.group, exc, self.lease_ms)
        self._owned.clear()
