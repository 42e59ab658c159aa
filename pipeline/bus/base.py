"""The bus interface every backend implements with the same semantics.

Three things travel on the bus:

* **ingest** — envelopes published by agents, partitioned by the run's *root*
  run id (``root_id or run_id``) into N shards (Redis: N streams; Kafka:
  partitions of one topic), so one root run — parent and children — lives in
  one shard and has one serial owner. Consumed in named consumer groups with
  explicit ack after processing (at-least-once).
* **delivery** — per-run streams written by workers: view ``raw`` (every
  event) and ``shaped`` (deltas coalesced, Koder agent stream §4 R1). Appends are idempotent on
  ``(run_id, view, seq)``; readers read after a seq and tail live. Bounded by
  length and age; older history is in the replay log.
* **control** — per-run commands from clients to the agent (cancel, pause …).

Heavy clients load only when their scheme is used (see ``open_bus``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, lt
from typing import Any, ClassVar, Literal, Protocol, cast

import msgspec

from ..core.envelope import Event, RunLifecycle, encode, is_terminal
from ..core.lifecycle import AsyncResource
from ..core.native import load
from .ingest_entries import split
from .keys import shard_for

View = Literal["raw", "shaped"]
StreamKey = tuple[str, View]
"""A delivery stream: ``(run_id, view)``."""
Append = tuple[StreamKey, Sequence[Event], Sequence[bytes] | None, bytes | None]
"""``(key, events, encoded, state)``: one stream's append for :meth:`Bus.append_many`;
``encoded``, when the writer has it, is each event's canonical JSON (``encoded[i]`` is
``envelope.encode(events[i])``: a worker encoded them for the replay log already), else None."""



class Routed(Protocol):
    """What routes a published event to its ingest shard (and names it): an :data:`Event`, or
    the publisher's record of one it queued as bytes only (its text deltas)."""

    @property
    def run_id(self) -> str: ...

    @property
    def root_id(self) -> str | None: ...

    @property
    def seq(self) -> int: ...


DEFAULT_SHARDS = 16


class Delivery(msgspec.Struct, gc=False):
    """One event of an ingest entry handed to a consumer; ack it after the work is durable.

    Not tracked by the garbage collector (``gc=False``): it holds only strings, ints
    and bytes, so it is never part of a reference cycle, and one is made per event
    (by a bus's fetch, with positional arguments and ``map``: ~25 % less than keywords).
    """

    entry_id: str
    """The backend's position (Redis entry id; Kafka ``partition:offset``)."""
    shard: int
    data: bytes
    """The canonical JSON of one envelope (decode it; it may be poison)."""
    deliveries: int = 1
    """How many times this entry has been handed out, this time included."""
    part: int = 0
    """This event's place in its entry, when an entry holds several events (Redis ingest):
    they share ``entry_id``, and the entry is acked once each of them is acked or
    dead-lettered."""
    count: ClassVar[int] = 1
    """One event (an :class:`Entry` holds several)."""


class Entry(msgspec.Struct, gc=False):
    """A whole ingest entry of several events handed to a consumer at once
    (:meth:`Consumer.fetch` with ``whole``): acked at once, each of its events dead-lettered
    as its own :class:`Delivery` (:meth:`events`)."""

    entry_id: str
    """The backend's position of its first entry (the in-process bus hands out consecutive
    entries of a shard as one: an event's ``part`` then counts from this one)."""
    shard: int
    data: bytes
    """Its events' canonical JSON lines, joined by newlines."""
    count: int
    """How many events ``data`` holds (more than one)."""
    deliveries: int = 1
    """How many times this entry has been handed out, this time included."""

    def events(self) -> list[Delivery]:
        """One delivery per event of this entry."""
        count = self.count
        return list(map(Delivery, repeat(self.entry_id, count), repeat(self.shard, count),
                        split(self.data), repeat(self.deliveries, count), range(count)))


Fetched = Delivery | Entry
"""What a fetch hands out: one event, or (with ``whole``) a whole entry."""


_COUNT = attrgetter("count")


def event_count(deliveries: Sequence[Fetched]) -> int:
    """How many events ``deliveries`` hold (whole entries count each of theirs)."""
    return sum(map(_COUNT, deliveries))


def ends_run(events: Sequence[Event]) -> bool:
    """Whether one stream's append holds the stream's own terminal ``run.lifecycle`` (a
    child's, fanned into a parent stream, carries ``child_id`` and ends only the child)."""
    if RunLifecycle not in set(map(type, events)):  # (most appends: one C-level pass)
        return False
    for event in reversed(events):
        if type(event) is RunLifecycle and event.child_id is None and is_terminal(event):
            return True
    return False


_SEQ = attrgetter("seq")
_NATIVE = load("core._native", "append's order check")
_INT64 = 1 << 63


def ascending_past(events: Sequence[Event], last: int) -> bool:
    """Whether every one of ``events`` is past ``last`` in ascending seq order (a writer's usual
    append: each is new, in order), so that a caller skips its per-event work (its bytes indexed
    one by one, each event checked for a run's end). A list is checked in C where built
    (``runwire.core._native.ascending_past``, each seq read in its slot: 2.6 ns an event where
    reading them with ``attrgetter`` took 31); ``tests/bus/test_kafka_hot.py`` checks the two."""
    if _NATIVE is not None and type(events) is list and -_INT64 <= last < _INT64:
        return _NATIVE.ascending_past(events, last)  # type: ignore[no-any-return]
    return _ascending_past(events, last)


def _ascending_past(events: Sequence[Event], last: int) -> bool:
    if not events or events[0].seq <= last:
        return False
    seqs = list(map(_SEQ, events))
    return all(map(lt, seqs, seqs[1:]))


def encoded(events: Sequence[Routed], data: Sequence[bytes] | None) -> Sequence[bytes]:
    """``data`` when given, else each of ``events`` (events, then) as canonical JSON: what
    :meth:`Bus.publish` sends."""
    return data if data is not None else [encode(cast(Event, event)) for event in events]


def each_event(deliveries: Sequence[Fetched]) -> list[Delivery]:
    """``deliveries`` with every whole entry handed out as one delivery per event."""
    out: list[Delivery] = []
    for delivery in deliveries:
        if type(delivery) is Delivery:
            out.append(delivery)
        else:
            out += cast(Entry, delivery).events()
    return out


class ControlCommand(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A client → agent command on a run's control channel."""

    command: str
    """cancel, pause, resume, redirect, approve, deny, answer, … (validated by the edge)."""
    run_id: str
    id: str = ""
    ts: str = ""
    args: dict[str, Any] = {}
    by: str | None = None


class DeadLetter(msgspec.Struct, kw_only=True):
    entry_id: str
    shard: int
    data: bytes
    reason: str
    deliveries: int
    group: str


class Consumer(AsyncResource):
    """A member of a consumer group on the ingest shards.

    ``fetch`` returns, in this order: this consumer's own unacked entries
    (after a restart), entries of dead consumers idle longer than
    ``claim_idle_ms`` on shards it owns, then new entries. Entries of one
    shard come back in shard order; a shard is owned by one live consumer
    of the group at a time (Redis: leases; Kafka: group assignment).

    An entry not acked within ``claim_idle_ms`` is handed out again with its
    ``deliveries`` count raised; once that count passes the bus's
    ``max_deliveries`` the consumer dead-letters the entry itself (reason
    ``delivered N times without an ack …``) instead of returning it, so an
    entry that crashes its worker cannot loop forever.
    """

    group: str
    name: str

    @abstractmethod
    async def fetch(self, max_count: int = 512, block_ms: int = 1000, *, whole: bool = False) -> Sequence[Fetched]:
        """Up to ``max_count`` entries, waiting up to ``block_ms`` when none are ready.

        Fewer than ``max_count`` only when no more are ready (runtimes take that as
        caught up). Where an entry holds several events (Redis ingest), one delivery
        per event, ``max_count`` counts events, and an entry comes whole, so the last
        one may take a fetch past ``max_count``.

        ``whole``: where an entry holds several events it may come as one delivery whose
        ``count`` says how many (a worker decodes and acks an entry at once rather than event
        by event; ``max_count`` still counts events). Acking such a delivery acks every event
        of the entry not dead-lettered before; a single event of it is dead-lettered as its own
        delivery (:meth:`Delivery.events`). A backend whose entries hold one event each hands
        out the same either way."""

    @abstractmethod
    async def ack(self, deliveries: Sequence[Fetched]) -> None:
        """Mark entries done. Call only after their effects are durable."""

    @abstractmethod
    async def dead_letter(self, delivery: Fetched, reason: str) -> None:
        """Move a poison entry to the dead-letter stream/topic with the reason, and ack it."""

    @abstractmethod
    def owned_shards(self) -> frozenset[int]:
        """Shards this consumer currently owns (changes on rebalance)."""

    state_losses: int = 0
    """How often the consumer found the bus had lost its state (Redis restarted without
    persistence or flushed: the group was gone) — its checkpoints and delivery streams too."""

    shard_losses: int = 0
    """How often shards left :meth:`owned_shards` (a lease expired, e.g. while the network to
    the bus was cut, or a rebalance gave them away). A shard lost and taken back between two
    looks at :meth:`owned_shards` was another member's meanwhile: what a worker holds in
    memory for it may be behind what that member wrote."""

    def redeliver(self) -> None:
        """Hand this consumer's own unacked entries out again, from the first, at the next
        fetches (a worker dropped what it had fetched and not written: shards left it)."""

    async def renew_leases(self) -> None:
        """Renew this consumer's hold on its shards now; one that lapsed leaves
        :meth:`owned_shards` (counted in :attr:`shard_losses`). A backend whose ownership does
        not lapse in a pause (Kafka's group assignment): nothing to do."""

    @abstractmethod
    async def close(self) -> None:
        """Leave the group; unacked entries stay pending for a successor."""



class Bus(AsyncResource):
    """One bus, selected by URL. Use as ``async with open_bus(url) as bus``.

    Each backend implements the three channels (:mod:`runwire.bus.ports`: ``IngestLog``,
    ``DeliveryStreams``, ``ControlChannel``) and the connection's lifecycle; a caller depends
    on the channel it uses, and only what opens a bus and hands it on holds the whole of it
    (``tests/test_layout.py`` checks this)."""

    url: str
    shards: int = DEFAULT_SHARDS
    max_deliveries: int = 5
    """Past this many deliveries an entry is poison: dead-letter it."""
    claim_idle_ms: int = 30_000
    """Default idle time before a pending entry is claimed by another consumer."""
    checkpoint_grace_s: float | None = None
    """How long a finished run's stored checkpoints outlive its end (None: as long as a live
    run's). A worker that finds no checkpoint for a run the replay log ended longer ago than
    this retires the run instead of starting it anew (``Stages._load_states``)."""

    async def _enter(self) -> None:
        await self.connect()

    @abstractmethod
    async def connect(self) -> None:
        """Connect (and create streams/topics/groups as needed). Raises BusUnavailable."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ping(self) -> None:
        """Raise BusUnavailable unless the bus answers."""

    async def ingest_lost(self) -> dict[str, int]:
        """Ingest entries each consumer group lost to the ingest cap before reading them, by
        group (Redis: see :mod:`runwire.bus.redis.trim`; other buses lose none)."""
        return {}

    def shard_of(self, event: Routed) -> int:
        """The ingest shard of an event: by its root run id."""
        return shard_for(event.root_id or event.run_id, self.shards)

    # ---- ingest -------------------------------------------------------
    @abstractmethod
    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None:
        """Append envelopes to their ingest shards, keeping the given order per run.

        ``data``, when the caller has it, is each event's canonical JSON (``data[i]`` is
        ``envelope.encode(events[i])``, e.g. the publisher's), sent as it is; ``events[i]`` is
        then the event or only what routes it (:class:`Routed`: the publisher queues its text
        deltas as bytes). Without it every one of ``events`` is an event, encoded here
        (:func:`encoded`).

        All-or-error: on failure raise BusUnavailable; the caller retries the
        whole batch (workers dedupe on ``(run_id, seq)``).
        """

    @abstractmethod
    def consumer(
        self, group: str, name: str, *, claim_idle_ms: int | None = None
    ) -> Consumer:
        """Join consumer group ``group`` (created if missing) as ``name``.

        ``claim_idle_ms`` defaults to the bus's ``claim_idle_ms`` (URL option).
        """

    @abstractmethod
    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead-lettered entries, for operators and tests."""

    # ---- delivery ----------------------------------------------------
    @abstractmethod
    async def append(
        self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None
    ) -> int:
        """Append events (their ``seq`` already set, increasing) to a delivery stream.

        Idempotent on seq: events whose seq is not above the stream's last
        seq are skipped. ``state`` (the writer's checkpoint for this stream,
        e.g. the sequencer's counters) is stored atomically with the events.
        Returns how many were appended. Applies the stream's length/age bound.
        """

    async def append_many(self, appends: Sequence[Append]) -> list[int]:
        """Several :meth:`append` calls (:data:`Append`: ``(key, events, encoded, state)``),
        applied in the given order.

        Same semantics as calling :meth:`append` for each; a backend may send
        them in one round trip (Redis pipelines them). Backends that store
        bytes use the given ``encoded``; others ignore it. Returns each count.
        """
        return [await self.append(key, events, state=state) for key, events, _, state in appends]

    async def drop_views(self, run_id: str) -> None:
        """Delete a run's delivery streams and checkpoints, for a worker to rebuild them whole
        from the replay log after the bus lost them (Redis: restarted empty, with appends made
        since). A backend that can't lose them keeps them."""

    @abstractmethod
    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]:
        """The state last stored with :meth:`append` for each stream (None for a stream without
        one), in order; a worker restoring many streams at once asks for all of them together
        (a backend that can: in one round trip)."""

    @abstractmethod
    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        """Events with seq > ``after``, ascending, from the hot tier (may be trimmed)."""

    @abstractmethod
    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        """``(first_seq, last_seq)`` still in the hot tier, or None when empty."""

    @abstractmethod
    async def tail(
        self, cursors: Mapping[StreamKey, int], block_ms: int = 1000
    ) -> list[tuple[StreamKey, Event]]:
        """One multiplexed live read: new events after each cursor, for many streams at once.

        Returns as soon as any stream has events (or after ``block_ms`` with
        none). One call serves every client of an edge process.
        """

    # ---- control -----------------------------------------------------
    @abstractmethod
    async def send_control(self, command: ControlCommand) -> None: ...

    @abstractmethod
    def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """Commands for one run, live (``after="0"`` from the start of the channel)."""
