"""A member of a consumer group of a ``memory://`` bus (see :mod:`runwire.bus.memory.bus`).

It works on the bus's :class:`~runwire.bus.memory.state.MemoryState`
directly: shard leases split fairly among the live members, claims of
entries idle longer than ``claim_idle_ms``, dead letters past
``max_deliveries``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

from ..base import Consumer, DeadLetter, Delivery, Entry, Fetched
from .state import MemoryState, now_ms

log = logging.getLogger("runwire.bus.memory.bus")


class MemoryConsumer(Consumer):
    """A member of a consumer group of a memory bus (see the module docstring)."""

    def __init__(
        self, state: MemoryState, group: str, name: str, *, claim_idle_ms: int, max_deliveries: int
    ) -> None:
        self.state = state
        self.group = group
        self.name = name
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self._group = state.group(group)
        self._owned: set[int] = set()
        self._joined = False
        self._closed = False
        self._own_pending: dict[int, deque[int]] = {}
        """Owned shard → its entries pending for this name when first owned, not yet re-read."""
        self._own_pending_done: set[int] = set()

    def owned_shards(self) -> frozenset[int]:
        return frozenset(self._owned)

    def _join(self) -> None:
        if not self._joined:
            self._group.members[self.name] = self._group.members.get(self.name, 0) + 1
            self._joined = True
            self.state.ingest_changed.notify()

    def _rebalance(self) -> None:
        group, shards = self._group, len(self.state.shards)
        desired = group.desired(self.name, shards)
        for shard in list(self._owned - desired):
            if group.leases.get(shard) == self.name:
                del group.leases[shard]
            self._owned.discard(shard)
            self._own_pending.pop(shard, None)
            self._own_pending_done.discard(shard)
        for shard in desired:
            holder = group.leases.get(shard)
            if holder is None or holder not in group.members or holder == self.name:
                group.leases[shard] = self.name
                self._owned.add(shard)

    async def fetch(self, max_count: int = 512, block_ms: int = 1000, *, whole: bool = False) -> Sequence[Fetched]:
        """``whole``: the new entries a shard hands out at once come as one delivery (their
        lines joined, ``count`` of them, ``entry_id`` the first's; an event's
        :meth:`~runwire.bus.Delivery.events` part is its offset from it)."""
        if self._closed:
            raise RuntimeError("consumer is closed")
        self._join()
        deadline = now_ms() + block_ms
        while True:
            self._rebalance()
            out = self._take_own_pending(max_count)
            out += self._take_idle(max_count - len(out))
            out += self._take_new(max_count - len(out), whole)
            remaining = deadline - now_ms()
            if out or remaining <= 0:
                return out
            wait = min(remaining, self._next_claim_in())
            await self.state.ingest_changed.wait(max(wait, 1) / 1000)

    def _take_own_pending(self, limit: int) -> list[Fetched]:
        """Entries pending for this name (a restart under it) on owned shards, in id order.

        A shard's are listed once, when it is first owned (one pass over its
        pending entries); until they are all re-read no newer entry of the
        shard is handed out, so a restarted worker never processes newer
        entries before its older ones.
        """
        out: list[Fetched] = []
        shards = self._owned - self._own_pending_done
        if not shards:
            return out
        now = now_ms()
        for shard in sorted(shards):
            queue = self._own_pending.get(shard)
            group_shard = self._group.shards[shard]
            if queue is None:
                queue = self._own_pending[shard] = deque(sorted(
                    entry_id for entry_id, pending in group_shard.pending.items()
                    if pending.consumer == self.name))
            while queue and len(out) < limit:
                entry_id = queue.popleft()
                pending = group_shard.pending.get(entry_id)
                if pending is None or pending.consumer != self.name:
                    continue  # acked or claimed meanwhile
                delivery = self._redeliver(shard, entry_id, now)
                if delivery is not None:
                    out.append(delivery)
            if queue:
                break
            del self._own_pending[shard]
            self._own_pending_done.add(shard)
        return out

    def _take_idle(self, limit: int) -> list[Fetched]:
        """Entries idle past ``claim_idle_ms`` on owned shards, claimed in id order.

        Pending entries are kept in delivery order, so a shard with nothing
        idle costs one look at its oldest entry.
        """
        out: list[Fetched] = []
        if limit <= 0:
            return out
        now = now_ms()
        idle_before = now - self.claim_idle_ms
        for shard in sorted(self._owned):
            group_shard = self._group.shards[shard]
            oldest = group_shard.oldest()
            if oldest is None or oldest.delivered_ms > idle_before:
                continue
            idle: list[int] = []
            for entry_id, pending in group_shard.pending.items():
                if pending.delivered_ms > idle_before:
                    break
                idle.append(entry_id)
            for entry_id in sorted(idle):
                if len(out) >= limit:
                    return out
                delivery = self._redeliver(shard, entry_id, now)
                if delivery is not None:
                    out.append(delivery)
        return out

    def _redeliver(self, shard: int, entry_id: int, now: float) -> Delivery | None:
        group_shard = self._group.shards[shard]
        pending = group_shard.move(entry_id, group_shard.pending[entry_id], self.name, now)
        data = self.state.shards[shard].get(entry_id)
        if data is None:  # cannot happen while unacked; drop the stale reference
            group_shard.release([entry_id])
            return None
        delivery = Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data,
                            deliveries=pending.count)
        if pending.count > self.max_deliveries:
            self._dead_letter_now(delivery, f"delivered {pending.count} times without an ack "
                                  f"(max_deliveries={self.max_deliveries})")
            return None
        return delivery

    def _take_new(self, limit: int, whole: bool = False) -> list[Fetched]:
        """New entries of owned shards, up to ``limit``: a fair share of each shard first (a
        busy shard can't starve the rest), then what is left of ``limit`` from the shards
        that had more — fewer than ``limit`` only when no owned shard has more (a runtime
        takes a short fetch as caught up)."""
        out: list[Fetched] = []
        if limit <= 0 or not self._owned:
            return out
        now = now_ms()
        name = self.name
        shards = [shard for shard in sorted(self._owned) if shard in self._own_pending_done
                  and not self._group.shards[shard].held_by_others(name)]
        taken = 0
        while shards and taken < limit:  # (older pending entries come first: per-run order)
            per_shard = -(-(limit - taken) // len(shards))
            more: list[int] = []
            for shard in shards:
                room = min(per_shard, limit - taken)
                if room <= 0:
                    break
                group_shard = self._group.shards[shard]
                first, entries = self.state.shards[shard].after(group_shard.last_delivered, room)
                if not entries:
                    continue
                group_shard.hold(first, len(entries), name, now)
                taken += len(entries)
                joined = b"\n".join(entries) if whole and len(entries) > 1 else None
                if joined is not None and joined.count(b"\n") == len(entries) - 1:  # one line each
                    out.append(Entry(f"{first}-0", shard, joined, len(entries)))
                else:
                    out += [Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data)
                            for entry_id, data in enumerate(entries, first)]
                if len(entries) == room:
                    more.append(shard)
            shards = more
        return out

    def _next_claim_in(self) -> float:
        """Milliseconds until some pending entry on an owned shard becomes claimable."""
        now, soonest = now_ms(), float("inf")
        for shard in self._owned:
            oldest = self._group.shards[shard].oldest()
            if oldest is not None:
                soonest = min(soonest, oldest.delivered_ms + self.claim_idle_ms - now)
        return soonest

    async def ack(self, deliveries: Sequence[Fetched]) -> None:
        by_shard: dict[int, list[int]] = {}
        for delivery in deliveries:
            entry_id = _entry_id(delivery)
            if type(delivery) is Delivery:
                by_shard.setdefault(delivery.shard, []).append(entry_id)
            else:
                by_shard.setdefault(delivery.shard, []).extend(
                    range(entry_id, entry_id + delivery.count))
        shards, touched = self._group.shards, False
        for shard, entry_ids in by_shard.items():
            if shards[shard].release(entry_ids):
                touched = True
                self.state.trim(shard)
        if touched:
            self.state.ingest_changed.notify()

    def _dead_letter_now(self, delivery: Fetched, reason: str) -> None:
        if type(delivery) is Entry:  # (each entry of it)
            for event in delivery.events():
                self._dead_letter_now(event, reason)
            return
        entry_id = _entry_id(delivery)
        self.state.dead.append(DeadLetter(
            entry_id=f"{entry_id}-0", shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.group,
        ))
        log.warning("dead-lettered entry %d-0 of shard %d in group %s: %s",
                    entry_id, delivery.shard, self.group, reason)
        self._group.shards[delivery.shard].release([entry_id])
        self.state.trim(delivery.shard)

    async def dead_letter(self, delivery: Fetched, reason: str) -> None:
        self._dead_letter_now(delivery, reason)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        group = self._group
        if self._joined:
            left = group.members.get(self.name, 1) - 1
            if left <= 0:
                group.members.pop(self.name, None)
                for shard in self._owned:
                    if group.leases.get(shard) == self.name:
                        del group.leases[shard]
            else:
                group.members[self.name] = left
        self._owned.clear()
        self.state.ingest_changed.notify()


def _entry_id(delivery: Fetched) -> int:
    """The shard entry a delivery names (an event of one handed out whole: its ``part``-th; a
    whole one: its first)."""
    first = int(delivery.entry_id.partition("-")[0])
    return first + delivery.part if type(delivery) is Delivery else first
