"""A member of a consumer group of a ``memory://`` bus (see :mod:`runwire.bus.memory`).

It works on the bus's :class:`~runwire.bus.memory_state.MemoryState`
directly: shard leases split fairly among the live members, claims of
entries idle longer than ``claim_idle_ms``, dead letters past
``max_deliveries``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .base import Consumer, DeadLetter, Delivery
from .memory_state import MemoryState, Pending, now_ms

log = logging.getLogger("runwire.bus.memory")


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
        self._own_pending_read = False

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
        for shard in desired:
            holder = group.leases.get(shard)
            if holder is None or holder not in group.members or holder == self.name:
                group.leases[shard] = self.name
                self._owned.add(shard)

    async def fetch(self, max_count: int = 512, block_ms: int = 1000) -> list[Delivery]:
        if self._closed:
            raise RuntimeError("consumer is closed")
        self._join()
        deadline = now_ms() + block_ms
        while True:
            self._rebalance()
            out = self._collect(max_count)
            remaining = deadline - now_ms()
            if out or remaining <= 0:
                return out
            wait = min(remaining, self._next_claim_in())
            await self.state.ingest_changed.wait(max(wait, 1) / 1000)

    def _collect(self, max_count: int) -> list[Delivery]:
        out: list[Delivery] = []
        if not self._own_pending_read and self._owned:
            self._own_pending_read = True
            out += self._take_pending(max_count, mine_only=True)
        out += self._take_pending(max_count - len(out), mine_only=False)
        out += self._take_new(max_count - len(out))
        return out

    def _take_pending(self, limit: int, *, mine_only: bool) -> list[Delivery]:
        """Own pending entries (after a restart) or entries idle past ``claim_idle_ms``."""
        out: list[Delivery] = []
        now = now_ms()
        for shard in sorted(self._owned):
            group_shard = self._group.shards[shard]
            for entry_id in sorted(group_shard.pending):
                if len(out) >= limit:
                    return out
                pending = group_shard.pending[entry_id]
                if mine_only:
                    if pending.consumer != self.name:
                        continue
                elif now - pending.delivered_ms < self.claim_idle_ms:
                    continue
                delivery = self._redeliver(shard, entry_id, pending, now)
                if delivery is not None:
                    out.append(delivery)
        return out

    def _redeliver(self, shard: int, entry_id: int, pending: Pending, now: float) -> Delivery | None:
        pending.consumer, pending.delivered_ms = self.name, now
        pending.count += 1
        data = self.state.shards[shard].get(entry_id)
        if data is None:  # cannot happen while unacked; drop the stale reference
            del self._group.shards[shard].pending[entry_id]
            return None
        delivery = Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data,
                            deliveries=pending.count)
        if pending.count > self.max_deliveries:
            self._dead_letter_now(delivery, f"delivered {pending.count} times without an ack "
                                  f"(max_deliveries={self.max_deliveries})")
            return None
        return delivery

    def _take_new(self, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        if limit <= 0 or not self._owned:
            return out
        now = now_ms()
        per_shard = -(-limit // len(self._owned))  # fair: a busy shard can't starve the rest
        for shard in sorted(self._owned):
            group_shard = self._group.shards[shard]
            if limit - len(out) <= 0:
                break
            if any(p.consumer != self.name for p in group_shard.pending.values()):
                continue  # a previous owner's entries come first (per-run order)
            for entry_id, data in self.state.shards[shard].after(
                group_shard.last_delivered, min(per_shard, limit - len(out))
            ):
                group_shard.pending[entry_id] = Pending(self.name, now, 1)
                group_shard.last_delivered = entry_id
                out.append(Delivery(entry_id=f"{entry_id}-0", shard=shard, data=data))
        return out

    def _next_claim_in(self) -> float:
        """Milliseconds until some pending entry on an owned shard becomes claimable."""
        now, soonest = now_ms(), float("inf")
        for shard in self._owned:
            for pending in self._group.shards[shard].pending.values():
                soonest = min(soonest, pending.delivered_ms + self.claim_idle_ms - now)
        return soonest

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        touched: set[int] = set()
        for delivery in deliveries:
            entry_id = int(delivery.entry_id.split("-", 1)[0])
            if self._group.shards[delivery.shard].pending.pop(entry_id, None) is not None:
                touched.add(delivery.shard)
        for shard in touched:
            self.state.trim(shard)
        if touched:
            self.state.ingest_changed.notify()

    def _dead_letter_now(self, delivery: Delivery, reason: str) -> None:
        self.state.dead.append(DeadLetter(
            entry_id=delivery.entry_id, shard=delivery.shard, data=delivery.data,
            reason=reason, deliveries=delivery.deliveries, group=self.group,
        ))
        log.warning("dead-lettered entry %s of shard %d in group %s: %s",
                    delivery.entry_id, delivery.shard, self.group, reason)
        entry_id = int(delivery.entry_id.split("-", 1)[0])
        self._group.shards[delivery.shard].pending.pop(entry_id, None)
        self.state.trim(delivery.shard)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
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
