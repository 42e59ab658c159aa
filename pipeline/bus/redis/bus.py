"""``redis://``, ``rediss://`` and ``redis+cluster://`` — the bus on Redis Streams.

Layout (every key is built in :mod:`runwire.bus.keys`):

* ingest: ``shards`` streams; an entry holds one event (field ``e`` =
  canonical JSON) or several of one publish (field ``m``, one per line,
  see :mod:`runwire.bus.redis.entries`); a batch is one ``XADD`` per shard
  and 64 events, all in one pipeline — one round trip per batch;
* consumer groups created at id ``0`` on every shard (a group created after
  publishing still sees what is in the streams), consumed by
  :class:`~runwire.bus.redis.consumer.RedisConsumer`;
* delivery streams of entries holding up to 512 events, entry id ``<last
  seq>-0`` (reading after a seq is an O(log n) ``XRANGE``; a duplicate id is
  impossible; see :mod:`runwire.bus.redis.entries`), appended by one Lua
  script together with the writer's state, bounded by ``MINID ~`` (the last
  ``maxlen`` seqs) and by a TTL refreshed on every append;
* a control stream per run; a dead-letter stream.

The connection, the scripts and the RESP packing are
:mod:`runwire.bus.redis.link`'s: connection errors become
:class:`~runwire.core.errors.BusUnavailable` after redis-py's own ``Retry``
(exponential backoff with jitter) gave up; the next call reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialWithJitterBackoff
from redis.crc import key_slot

from ...core.envelope import Event, encode
from ...core.errors import BusFull
from ...core.retry import Retry
from .. import base, keys
from ..base import Append, Bus, Consumer, ControlCommand, DeadLetter, StreamKey, ends_run
from ..options import split_url
from .consumer import RedisConsumer
from .entries import (
    EncodedAppend,
    FramedKeys,
    decode_stored,
    entry_args,
    first_seq,
    frame_ints,
    ingest_entries,
    lines_after,
    pack_append_many,
    seq_of,
)
from .link import (
    APPEND,
    APPEND_MANY,
    RedisLink,
    ScriptCall,
    at_maxmemory,
    retriable_bus_errors,
    text,
)
from .retain import Kept
from .trim import lost_key

log = logging.getLogger(__name__)

ACCEPTED_OPTIONS = (
    "shards", "maxlen", "ttl", "grace", "claim_idle_ms", "lease_ms", "max_deliveries",
    "ingest_maxlen", "dead_letter_maxlen", "prefix", "tail_poll_ms", "retain_bytes", "close_wait_ms",
)
PASSTHROUGH_OPTIONS = (
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "health_check_interval",
    "client_name", "max_connections", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile",
    "ssl_keyfile", "ssl_check_hostname",
)
CONTROL_MAXLEN = 1000
SLOT_POLL_COST_S = 20e-6
"""Poll-interval share of one watched slot in a Cluster ``tail`` (see ``_tail_cluster``)."""
CONTROL_RETRY = Retry(ExponentialWithJitterBackoff(cap=2.0, base=0.05))
"""A control channel's reader rides out connection blips for as long as it is read."""
_control_decoder = msgspec.json.Decoder(ControlCommand)
_encoder = msgspec.json.Encoder()


class RedisBus(Bus):
    """The bus on Redis Streams, standalone or Cluster (see the module docstring)."""

    def __init__(self, url: str, **_: Any) -> None:
        scheme = url.split("://", 1)[0]
        self.url = url
        self.cluster = scheme == "redis+cluster"
        options, bare, _kept = split_url(url, ACCEPTED_OPTIONS, PASSTHROUGH_OPTIONS)
        self.options = options
        self.connect_url = "redis://" + bare.split("://", 1)[1] if self.cluster else bare
        self.shards = options.shards
        self.max_deliveries = options.max_deliveries
        self.claim_idle_ms = options.claim_idle_ms
        self.checkpoint_grace_s = float(options.grace)
        self.prefix = options.prefix
        self.link = RedisLink(url, self.connect_url, cluster=self.cluster)
        self._framed_keys = FramedKeys(self._append_keys)
        self._append_many_head: bytes | None = None
        self._consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        self.kept = Kept(options.retain_bytes, self._ingest_scripts)

    # ---- connection ---------------------------------------------------
    @property
    def redis(self) -> Redis | RedisCluster:
        return self.link.redis

    async def run_scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """EVALSHA each call, all in one pipeline (see :meth:`RedisLink.run_scripts`)."""
        return await self.link.run_scripts(calls)

    async def connect(self) -> None:
        self.link.open()
        with retriable_bus_errors(f"connect to {self.url}"):
            await self.redis.ping()

    async def close(self) -> None:
        """Wait (``close_wait_ms``) for the groups to read what this process published, close
        open consumers (releasing their leases), then the connections."""
        if self.link.connected:
            await self.kept.drain(self.options.close_wait_ms / 1000)
        await self.kept.close()
        for consumer in list(self._consumers):
            await consumer.close()
        await self.link.close()

    async def ping(self) -> None:
        """The server answers and takes writes: at ``maxmemory`` with nothing it may evict
        (policy ``noeviction``) it refuses them, and this raises :class:`BusFull`."""
        with retriable_bus_errors(f"ping {self.url}"):
            if self.cluster:
                await self.redis.ping()
                return
            memory: Any = await self.redis.info("memory")
        if at_maxmemory(memory):
            raise BusFull(f"ping {self.url}: Redis is at maxmemory "
                          f"({memory.get('used_memory')} of {memory.get('maxmemory')} bytes used)")

    # ---- ingest -------------------------------------------------------
    async def publish(self, events: Sequence[base.Routed], data: Sequence[bytes] | None = None) -> None:
        """One round trip per batch: the entries of each shard (an entry holds up to
        :data:`~runwire.bus.ingest_entries.INGEST_ENTRY_EVENTS` events), each shard's in one
        ``INGEST_ADD`` script call, pipelined (``data[i]`` is ``encode(events[i])``).

        All-or-error: an error raises and the caller retries the whole batch
        (shards that made it get duplicates, which the workers drop on
        ``(run_id, seq)``). Each shard's entries land all or none: Redis
        checks ``maxmemory`` before a script's first write only, whereas
        separate ``XADD``s at ``maxmemory`` could land a later entry after an
        earlier one was refused; the retry would then bring a run's earlier
        events after its later ones, and a worker would drop them as
        duplicates. The script also checks that Redis still has what this
        process published before, and the entries are kept until every group
        read them (:mod:`runwire.bus.redis.retain`).
        """
        if not events:
            return
        data = base.encoded(events, data)
        by_shard: dict[int, list[bytes]] = {}
        of_root: dict[str, list[bytes]] = {}  # each root's shard found once a batch
        for event, encoded in zip(events, data, strict=True):
            root = event.root_id or event.run_id
            lines = of_root.get(root)
            if lines is None:
                lines = of_root[root] = by_shard.setdefault(keys.shard_for(root, self.shards), [])
            lines.append(encoded)
        maxlen = self.options.ingest_maxlen
        shards = [(keys.ingest_key(self.prefix, shard), ingest_entries(batch, maxlen))
                  for shard, batch in by_shard.items()]
        replies = await self._ingest_scripts(self.kept.add_calls(shards))
        await self.kept.published_all(shards, replies)

    async def _ingest_scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        return await (self.link.run_scripts(calls) if self.cluster else self.link.run_packed(calls))

    async def ingest_lost(self) -> dict[str, int]:
        with retriable_bus_errors("ingest losses"):
            pipe = self.redis.pipeline(transaction=False)
            for shard in range(self.shards):
                pipe.hgetall(lost_key(self.prefix, shard))
            totals: dict[str, int] = {}
            for counts in await pipe.execute():
                for group, lost in (counts or {}).items():
                    totals[text(group)] = totals.get(text(group), 0) + int(lost)
        return totals

    def consumer(
        self, group: str, name: str, *, claim_idle_ms: int | None = None
    ) -> Consumer:
        idle = self.claim_idle_ms if claim_idle_ms is None else claim_idle_ms
        consumer = RedisConsumer(self.link, self.options, group, name, claim_idle_ms=idle)
        self._consumers.add(consumer)
        return consumer

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        with retriable_bus_errors("read dead letters"):
            entries: Any = await self.redis.xrevrange(
                keys.dead_letter_key(self.prefix), "+", "-", count=limit)
        return [
            DeadLetter(
                entry_id=text(f[b"entry_id"]), shard=int(f[b"shard"]), data=f[b"e"],
                reason=text(f[b"reason"]), deliveries=int(f[b"deliveries"]),
                group=text(f[b"group"]),
            )
            for _id, f in entries
        ]

    # ---- delivery ----------------------------------------------------
    def _stream_key(self, key: StreamKey) -> str:
        return keys.delivery_key(self.prefix, key[0], key[1])

    async def append(
        self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None
    ) -> int:
        if not events and state is None:
            return 0
        encoded = [encode(event) for event in events]
        (appended,) = await self.run_scripts([self._append_call(key, events, encoded, state)])
        return int(appended)

    async def append_many(self, appends: Sequence[Append]) -> list[int]:
        """All appends in one script call (one round trip; a Cluster's: one per node)."""
        return await self._append_encoded([
            (key, events, encoded if encoded is not None else [encode(event) for event in events], state)
            for key, events, encoded, state in appends])

    async def _append_encoded(self, appends: Sequence[EncodedAppend]) -> list[int]:
        wanted = [i for i, (_, events, _, state) in enumerate(appends) if events or state is not None]
        counts = [0] * len(appends)
        if wanted:
            if self.cluster or len(wanted) == 1:  # a Cluster's keys of one call share a slot
                results = await self.run_scripts([self._append_call(*appends[i]) for i in wanted])
            else:  # one script call for every stream: the per-call costs are paid once
                chosen = [appends[i] for i in wanted]
                (results,) = await self.link.run_prepacked(
                    self._append_many_packed(chosen), 1, lambda: [self._append_many_call(chosen)])
            for index, result in zip(wanted, results, strict=True):
                counts[index] = int(result)
        return counts

    def _append_many_call(self, appends: Sequence[EncodedAppend]) -> ScriptCall:
        """The ``APPEND_MANY`` call of several streams' appends (see :mod:`.scripts`)."""
        options = self.options
        call_keys: list[str] = []
        args: list[Any] = [b"%d" % options.maxlen, b"%d" % (options.ttl * 1000),
                           b"%d" % (options.grace * 1000)]
        for key, events, encoded, state in appends:
            call_keys += self._append_keys(key)
            entries = entry_args(events, encoded)
            args += (b"0" if state is None else b"1", state or b"",
                     b"1" if ends_run(events) else b"0", b"%d" % (len(entries) // 2), *entries)
        return (APPEND_MANY, call_keys, args)

    def _append_many_packed(self, appends: Sequence[EncodedAppend]) -> bytes:
        """:meth:`_append_many_call` as RESP, built directly (:func:`.entries.pack_append_many`)."""
        head = self._append_many_head
        if head is None:
            options = self.options
            head = self._append_many_head = frame_ints(options.maxlen, options.ttl * 1000,
                                                       options.grace * 1000)
        return pack_append_many(APPEND_MANY.sha, head, appends, self._framed_keys)

    def _append_keys(self, key: StreamKey) -> tuple[str, str, str]:
        """A stream's keys as the ``APPEND`` scripts take them: stream, meta hash, control."""
        return (self._stream_key(key), keys.meta_key(self.prefix, key[0], key[1]),
                keys.control_key(self.prefix, key[0]))

    def _append_call(
        self, key: StreamKey, events: Sequence[Event], encoded: Sequence[bytes], state: bytes | None
    ) -> ScriptCall:
        args: list[Any] = [self.options.maxlen, self.options.ttl * 1000,
                           "0" if state is None else "1", state or b"",
                           self.options.grace * 1000, "1" if ends_run(events) else "0",
                           *entry_args(events, encoded)]
        return (APPEND, self._append_keys(key), args)

    async def load_states(self, streams: Sequence[StreamKey]) -> list[bytes | None]:
        """One ``HGET`` per stream, all in one round trip (per node)."""
        if not streams:
            return []
        with retriable_bus_errors("load delivery state"):
            states = await self.link.commands([("HGET", keys.meta_key(self.prefix, run_id, view),
                                                "state") for run_id, view in streams])
        return [None if state is None else bytes(state) for state in states]

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        """``XRANGE`` from the entry holding seq ``after + 1``; entries hold several events,
        so each read asks for about as many entries as the events still wanted need."""
        name = self._stream_key(key)
        lines: list[bytes] = []
        start, count, seen = f"{after + 1}-0", min(limit, 64), 0
        with retriable_bus_errors("read delivery stream"):
            while len(lines) < limit:
                entries: Any = await self.redis.xrange(name, start, "+", count=count)
                lines += lines_after(entries, after)
                seen += len(entries)
                if len(entries) < count:
                    break
                start = f"{seq_of(entries[-1][0]) + 1}-0"
                per_entry = max(1.0, len(lines) / seen)
                count = max(8, min(limit, int((limit - len(lines)) / per_entry) + 1))
        return decode_stored(lines[:limit])

    async def drop_views(self, run_id: str) -> None:
        with retriable_bus_errors("drop delivery streams"):
            await self.redis.delete(*(name for view in ("raw", "shaped")
                                      for name in self._append_keys((run_id, view))[:2]))

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        name = self._stream_key(key)
        with retriable_bus_errors("delivery stream bounds"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.xrange(name, "-", "+", count=1)
            pipe.xrevrange(name, "+", "-", count=1)
            first, last = await pipe.execute()
        if not first or not last:
            return None
        return first_seq(*first[0]), seq_of(last[0][0])

    async def tail(
        self, cursors: Mapping[StreamKey, int], block_ms: int = 1000
    ) -> list[tuple[StreamKey, Event]]:
        """One ``XREAD BLOCK`` over every stream (Cluster: per slot, see ``_tail_cluster``)."""
        if not cursors:
            await asyncio.sleep(block_ms / 1000)
            return []
        by_name = {self._stream_key(key): key for key in cursors}
        streams = {name: f"{cursors[key]}-0" for name, key in by_name.items()}
        replies: Any
        with retriable_bus_errors("tail delivery streams"):
            if self.cluster and len({key_slot(n.encode()) for n in streams}) > 1:
                replies = await self._tail_cluster(streams, block_ms)
            else:
                replies = await self.redis.xread(
                    streams, count=1000, block=block_ms if block_ms > 0 else None)  # type: ignore[arg-type]
        keys_of: list[StreamKey] = []
        lines: list[bytes] = []
        for name, entries in replies or []:
            key = by_name[text(name)]
            got = lines_after(entries, cursors[key])
            keys_of += [key] * len(got)
            lines += got
        return list(zip(keys_of, decode_stored(lines), strict=True))

    async def _tail_cluster(self, streams: dict[str, str], block_ms: int) -> list[Any]:
        """Streams of many slots: a multi-key XREAD must stay in one slot, so read each
        slot's streams in one pipelined, non-blocking pass (the client runs each node's
        commands concurrently) and poll until ``block_ms``.

        A pass costs the cluster ~1–2 µs per slot, so the interval stretches with
        the number of slots (``tail_poll_ms``, or 20 µs per slot if longer: 10 000
        watched runs → a pass every 200 ms) to keep idle polling near 1 % of a node.
        """
        by_slot: dict[int, dict[str, str]] = {}
        for name, cursor in streams.items():
            by_slot.setdefault(key_slot(name.encode()), {})[name] = cursor
        interval = max(self.options.tail_poll_ms / 1000, len(by_slot) * SLOT_POLL_COST_S)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_ms / 1000
        while True:
            pipe = self.redis.pipeline(transaction=False)
            for group in by_slot.values():
                pipe.xread(group, count=1000)  # type: ignore[arg-type]
            replies = [item for reply in await pipe.execute() for item in reply or []]
            remaining = deadline - loop.time()
            if replies or remaining <= 0:
                return replies
            await asyncio.sleep(min(remaining, interval))

    # ---- control -----------------------------------------------------
    async def send_control(self, command: ControlCommand) -> None:
        name = keys.control_key(self.prefix, command.run_id)
        with retriable_bus_errors("send control"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(name, {"c": _encoder.encode(command)}, maxlen=CONTROL_MAXLEN,
                      approximate=True)
            pipe.pexpire(name, self.options.ttl * 1000)
            await pipe.execute()

    async def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """Live commands of one run; rides out connection blips with backoff + jitter."""
        name = keys.control_key(self.prefix, run_id)
        position = after

        async def read() -> Any:
            nonlocal position
            with retriable_bus_errors("read control"):
                if position == "$":
                    last: Any = await self.redis.xrevrange(name, "+", "-", count=1)
                    position = text(last[0][0]) if last else "0-0"
                return await self.redis.xread({name: position}, count=100, block=1000)

        def report(exc: Exception, _pause: float) -> None:
            log.warning("control channel of %s unavailable (%s); retrying", run_id, exc)

        while True:
            replies = await CONTROL_RETRY.call(read, on_retry=report)
            for _name, entries in replies or []:
                for entry_id, fields in entries:
                    position = text(entry_id)
                    yield _control_decoder.decode(fields[b"c"])
