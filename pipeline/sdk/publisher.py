"""The publisher SDK agents embed.

::

    async with Publisher.connect("redis://localhost:6379/0") as pub:
        run = pub.run("run_123", tenant="acme", thread="chat_9")
        await run.emit("text.delta", {"text": "hi"})
        await run.finish("done")

What it guarantees:

* **Ids, seq and time are assigned here.** ``seq`` counts from 1 per run; ids
  are monotonic ULIDs (``evt_…``) from one generator per publisher, so they
  increase within every run; ``ts`` is the emit time (RFC 3339, ms).
* **Batching.** Events wait at most ``linger_ms`` (or until ``max_batch``
  are queued, or a ``flush``) and go out in one ``Bus.publish`` call. One batch is in flight
  at a time, so per-run order is the emit order. A run's deltas queued back to back
  (``Run.delta_nowait``) are one delta of their texts while they wait (``join_deltas``).
* **Bounded memory.** At most ``max_pending`` events and ``max_pending_bytes``
  encoded bytes are queued, plus the one batch in flight (≤ ``max_batch``);
  past that ``emit`` waits. Nothing is dropped silently. The queue refills
  while a batch is on its way, so building events overlaps the bus's work.
* **Retries.** A batch that fails with :class:`~runwire.core.errors.BusUnavailable`
  (the bus unreachable, or :class:`~runwire.core.errors.BusFull`: Redis refusing
  writes at ``maxmemory``) is retried with exponential backoff and full jitter (redis-py's
  ``FullJitterBackoff``) until ``delivery_timeout`` seconds have passed since
  its first failure. Then every queued event is given up and
  :class:`~runwire.core.errors.DeliveryTimeout` names each ``(run_id, seq)`` that
  was not delivered; it is raised from the emits that were waiting, else from
  the next ``emit``/``flush``/``close``. The publisher stays usable: once the
  bus answers again, new events flow (the lost seqs show up as a gap, Koder agent stream §7 T2).
  A pause is logged once when it starts and once when it ends (logger
  ``runwire.sdk.publisher``); ``outage.retried`` counts the retried errors.
* **Graceful close.** Leaving the ``async with`` block flushes what is queued.
* **Requests.** ``async for request in pub.requests(): run = pub.run_for(request)``
  answers the chat turns clients send through the edge (see
  :mod:`runwire.bus.requests`); ``async for task in pub.tasks("agent")`` the
  A2A tasks (see :mod:`runwire.sdk.tasks`).
* **Child runs.** ``pub.run(child_id, parent=run)`` puts ``parent_id`` and
  ``root_id`` on every event of the child, so workers fan it into its parent
  and one worker owns the whole tree (ingest is partitioned by root run id).
  A parent named by id gets its root from the runs this publisher started;
  across services, ``run.context()`` is a token that carries the tree
  (``pub.run(child_id, context=token)``, see :mod:`runwire.sdk.runcontext`).

Longer than ~400 lines: the queue, its bounds, the flusher and the give-up
report are one piece of state that every emit and the flusher share.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from typing import Any, cast

import msgspec
from redis.backoff import FullJitterBackoff

from ..bus import Bus, ControlCommand, open_bus
from ..bus.requests import DEFAULT_CHANNEL, DEFAULT_TTL_S, AgentRequest, consume_requests
from ..core import envelope
from ..core.envelope import Event, TextPayload
from ..core.errors import BusUnavailable, DeliveryTimeout, MalformedFrame
from ..core.lifecycle import AsyncResource
from ..core.retry import Outage, Retry
from ..core.ulid import PAIRS, MonotonicULID
from .runcontext import RunContext
from .tasks import A2ATask, consume_tasks

__all__ = ["Publisher", "Run"]

log = logging.getLogger("runwire.sdk.publisher")

_encoder = msgspec.json.Encoder()
MAX_KNOWN_RUNS = 100_000
"""Runs a publisher remembers the root of (for ``parent=`` given as an id); the oldest go first."""


class _Clock(MonotonicULID):
    """Monotonic ULID (``evt_…``) and RFC 3339 timestamp from one reading of the clock.

    The timestamp's date and time are formatted once per second, its milliseconds taken from a
    table; ids are :class:`runwire.core.ulid.MonotonicULID`'s, the common ones (no reseed, no
    carry past the random part's last two characters) made here, inline, as ``new`` makes them.
    """

    __slots__ = ("_second", "_second_of", "_ts")

    def __init__(self) -> None:
        super().__init__("evt_")
        self._second_of = -1
        self._ts = self._second = ""

    def stamp(self) -> tuple[str, str]:
        ms = time.time_ns() // 1_000_000
        if ms == self._last_ms:
            self._rand = rand = self._rand + 1
            if rand & 1023:
                return self._stem + PAIRS[rand & 1023], self._ts
            self._rand = rand - 1  # a carry: MonotonicULID.new counts it
        elif ms > self._last_ms:
            second = ms // 1000
            if second != self._second_of:
                self._second_of = second
                self._second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._ts = ts = self._second + _MILLIS[ms % 1000]
            rand = self._rand + 1
            if ms >> 10 == self._high_of and rand & 1023:  # a new millisecond, the same second
                self._last_ms, self._rand = ms, rand
                self._time = self._high + PAIRS[ms & 1023]
                self._stem = stem = self._time + self._stem[-14:]
                return stem + PAIRS[rand & 1023], ts
        return self.new(ms), self._ts  # the ts of the last millisecond if the clock went back


_MILLIS = [f".{ms:03d}Z" for ms in range(1000)]
"""A timestamp's last characters, by millisecond."""


def _payload_type(cls: type[msgspec.Struct]) -> Any:
    return next(f.type for f in msgspec.structs.fields(cls) if f.name == "payload")


_TYPED: dict[str, tuple[Any, Any]] = {
    name: (cls, _payload_type(cls)) for name, cls in envelope.EVENT_CLASSES.items()
}
"""type name → (event class, payload class), for building events without ``make``'s checks."""


class _Seq(msgspec.Struct):
    seq: int


_seq_of = msgspec.json.Decoder(_Seq).decode
"""The seq of an event queued as its bytes only (for a give-up report)."""

_MARK_TEXT, _MARK_ID, _MARK_TS, _MARK_SEQ = "\x01text", "\x01id", "\x01ts", 7_036_874_417_766_401
"""Values a sample event carries where a delta's own go: cut out of its encoding, the rest is
the run's canonical bytes around them (:meth:`Run._template`)."""

_Template = tuple[bytes, str, str, str, str]
"""A run's text delta as the parts around its text, id, ts and seq."""

JOIN_BYTES = 16 << 10
"""The most text (JSON-encoded) one joined delta carries: past it the next delta is an event of
its own (well under ``DELTA_CHARS`` and the frame limit)."""


class _Join:
    """A run's delta still in the queue, and the deltas that followed it while nothing else was
    queued (their texts joined: :meth:`Run.delta_nowait`): its bytes are made when the flusher
    takes it."""

    __slots__ = ("head", "rest", "room", "seq", "texts", "type")

    def __init__(self, type: str, head: bytes, text: str, rest: bytes, room: int, seq: int) -> None:
        self.type = type
        self.head = head
        self.texts = [text]
        self.rest = rest
        self.room = room
        """Encoded text it may still take (of :data:`JOIN_BYTES`)."""
        self.seq = seq

    def seal(self) -> bytes:
        """Its bytes: one delta of the texts joined (each one encoded already: so are they)."""
        return b"".join((self.head, _encoder.encode("".join(self.texts)), self.rest))


class Run:
    """One run's publishing handle: assigns seq, id and ts, and enqueues on the publisher."""

    def __init__(
        self,
        publisher: Publisher,
        run_id: str,
        *,
        tenant: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        thread_id: str | None = None,
        agent: str | None = None,
    ) -> None:
        self.publisher = publisher
        self.run_id = run_id
        self.tenant = tenant
        self.parent_id = parent_id
        self.root_id = root_id
        self.thread_id = thread_id
        self.agent = agent
        """The agent's name, said on the run's first event (``ext.agent.name``): spans name it."""
        self.seq = 0
        """The seq of the last event emitted (0 before the first)."""
        self._fields: dict[str, Any] = {
            k: v
            for k, v in (("parent_id", parent_id), ("root_id", root_id), ("tenant", tenant),
                         ("thread_id", thread_id))
            if v is not None
        }
        self._templates: dict[str, _Template | None] = {}
        self._join: _Join | None = None
        """Its last delta queued with room for more text (:meth:`delta_nowait`)."""

    def event(self, type: str, payload: Mapping[str, Any] | msgspec.Struct,
              ext: dict[str, Any] | None = None) -> Event:
        """Build (and validate) the run's next event without publishing it (``ext``: the
        envelope's extension object)."""
        event_id, ts = self.publisher._clock.stamp()
        typed = _TYPED.get(type)
        if self.seq == 0 and self.agent is not None:
            ext = {**(ext or {}), "agent": {"name": self.agent}}
        fields = self._fields if ext is None else {**self._fields, "ext": ext}
        event: Event
        try:
            if typed is None:
                raise msgspec.ValidationError  # x.* or unknown: make() checks and says which
            cls, payload_cls = typed
            if not isinstance(payload, payload_cls):
                payload = msgspec.convert(payload, payload_cls)
            event = (cls(id=event_id, ts=ts, run_id=self.run_id, seq=self.seq + 1,
                         payload=payload, **fields) if fields else
                     cls(id=event_id, ts=ts, run_id=self.run_id, seq=self.seq + 1, payload=payload))
        except msgspec.ValidationError:
            event = envelope.make(type, payload, id=event_id, ts=ts, run_id=self.run_id,
                                  seq=self.seq + 1, **fields)
        self.seq += 1
        return event

    async def emit(self, type: str, payload: Mapping[str, Any] | msgspec.Struct,
                   ext: dict[str, Any] | None = None, *, room_timeout: float | None = None) -> Event:
        """Publish one event of any canonical (or ``x.*``) type; returns it.

        Raises ``MalformedFrame``/``UnknownEventType`` for an invalid payload
        or type, or one a worker could not carry (over 1 MiB encoded, nested
        deeper than 64 levels; nothing is published, seq is not used up), and
        ``DeliveryTimeout`` when the publisher gave up on earlier events.
        ``room_timeout`` bounds the wait for room in a full queue (default: no bound;
        0: none at all): past it ``DeliveryTimeout`` names this event, which is not
        published and whose seq is used up, so the workers report the gap (T2).
        """
        event = self.event(type, payload, ext)
        publisher = self.publisher
        try:
            data = publisher._put(event)  # the common case, room to spare, awaits nothing
            if data is not None or publisher._queued % publisher._yield_every == 0:
                await publisher._settle(event, data, room_timeout)
        except MalformedFrame:  # refused before anything awaited: the seq is not used up
            self.seq -= 1
            raise
        return event

    def emit_nowait(self, type: str, payload: Mapping[str, Any] | msgspec.Struct,
                    ext: dict[str, Any] | None = None) -> Event | None:
        """:meth:`emit` when the publisher has room now, without a coroutine; None when it has
        none (nothing is published, no seq is used up: call :meth:`emit` to wait for room).
        Raises what :meth:`emit` raises. It never yields to the loop, so a caller that never
        awaits anything else should use :meth:`emit`."""
        event = self.event(type, payload, ext)
        try:
            if self.publisher._put(event) is None:
                return event
        except MalformedFrame:
            self.seq -= 1
            raise
        self.seq -= 1
        return None

    def delta_nowait(self, type: str, text: str) -> bool:
        """A ``text.delta`` or ``reasoning.delta`` queued as :meth:`emit_nowait` would (the same
        bytes), without an event object: its text, id, ts and seq are spliced into the run's
        canonical bytes around them. While the run's last delta of ``type`` is still the last
        thing queued (the flusher has not taken it, nothing else was queued since), ``text`` is
        joined to it instead (``Publisher(join_deltas=False)``: never). False when the publisher
        has no room now (nothing is published, no seq is used up). Raises what
        :meth:`emit_nowait` raises."""
        try:
            template = self._templates[type]
        except KeyError:
            template = self._templates[type] = self._template(type)
        if template is None or not isinstance(text, str) or (self.seq == 0 and self.agent is not None):
            return self.emit_nowait(type, TextPayload(text=text)) is not None
        publisher = self.publisher
        if publisher._failure is not None:
            publisher._raise_failure()
        try:
            text_json = _encoder.encode(text)
        except UnicodeEncodeError as exc:
            raise _not_unicode(exc) from None
        join = self._join
        if join is not None and join.type == type:
            encoded = publisher._encoded
            if encoded and encoded[-1] is join:
                added = len(text_json) - 2  # the bytes it adds: JSON escapes char by char
                if added <= join.room and publisher._queued_bytes + added <= publisher.max_pending_bytes:
                    join.texts.append(text)
                    join.room -= added
                    publisher._queued_bytes += added
                    return True
        head, after_text, after_id, after_ts, tail = template
        clock = publisher._clock  # _Clock.stamp's common case inline: a call and a tuple less
        rand = clock._rand + 1
        if time.time_ns() // 1_000_000 == clock._last_ms and rand & 1023:
            clock._rand = rand
            event_id, ts = clock._stem + PAIRS[rand & 1023], clock._ts
        else:
            event_id, ts = clock.stamp()
        seq = self.seq + 1
        rest = f"{after_text}{event_id}{after_id}{ts}{after_ts}{seq}{tail}".encode()
        size = len(head) + len(text_json) + len(rest)
        if size > envelope.MAX_FRAME_BYTES:
            raise MalformedFrame(f"event is {size} bytes encoded, over the "
                                 f"{envelope.MAX_FRAME_BYTES}-byte limit")
        if publisher.join_deltas and len(text_json) <= JOIN_BYTES:
            join = _Join(type, head, text, rest, JOIN_BYTES - len(text_json), seq)
            if not publisher._offer(self, join, size):  # the run routes the bytes (bus.base.Routed)
                return False
            publisher._joins += 1
            self._join = join
        elif not publisher._offer(self, b"".join((head, text_json, rest)), size):
            return False
        self.seq = seq
        return True

    def _template(self, type: str) -> _Template | None:
        """The run's ``type`` delta (text.delta, reasoning.delta) as the parts around its text,
        id, ts and seq, cut from the encoding of a sample event; None for another type, or
        when the run's own fields would make the cut ambiguous (then events take the slow path)."""
        if type not in ("text.delta", "reasoning.delta"):
            return None
        cls, payload_cls = _TYPED[type]
        sample = _encoder.encode(cls(id=_MARK_ID, ts=_MARK_TS, run_id=self.run_id, seq=_MARK_SEQ,
                                     payload=payload_cls(text=_MARK_TEXT), **self._fields)).decode()
        marks = [_encoder.encode(_MARK_TEXT).decode(), _encoder.encode(_MARK_ID).decode()[1:-1],
                 _encoder.encode(_MARK_TS).decode()[1:-1], str(_MARK_SEQ)]
        if any(sample.count(mark) != 1 for mark in marks):
            return None
        at = [sample.index(mark) for mark in marks]
        if at != sorted(at):
            return None
        parts, start = [], 0
        for mark, index in zip(marks, at, strict=True):
            parts.append(sample[start:index])
            start = index + len(mark)
        parts.append(sample[start:])
        return parts[0].encode(), parts[1], parts[2], parts[3], parts[4]

    async def finish(self, state: str = "done", reason: str | None = None) -> Event:
        """Publish the terminal ``run.lifecycle`` event (done, aborted or error)."""
        if state not in envelope.TERMINAL_STATES:
            raise ValueError(f"finish state must be one of {sorted(envelope.TERMINAL_STATES)}")
        payload: dict[str, Any] = {"state": state}
        if reason is not None:
            payload["reason"] = reason
        return await self.emit("run.lifecycle", payload)

    def context(self) -> str:
        """A token naming this run and its tree, for a sub-agent in another service.

        ``pub.run(child_id, context=token)`` there (or the ``Runwire-Run-Context``
        header on HTTP ingest) makes the child a child of this run with this
        run's root, so its events reach every ancestor's stream.
        """
        return RunContext(run=self.run_id, root=self.root_id, tenant=self.tenant).token()

    def controls(self, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """The run's control channel (cancel, pause, approve …), live from now by default."""
        return self.publisher.bus.controls(self.run_id, after=after)


class Publisher(AsyncResource):
    """Batches, bounds and retries events on their way onto a bus. See the module docs."""

    def __init__(
        self,
        bus: Bus,
        *,
        linger_ms: float = 3.0,
        max_batch: int = 2000,
        max_pending: int = 20_000,
        max_pending_bytes: int = 16 << 20,
        delivery_timeout: float = 30.0,
        backoff_cap: float = 1.0,
        backoff_base: float = 0.01,
        own_bus: bool = False,
        join_deltas: bool = True,
    ) -> None:
        self.bus = bus
        self.join_deltas = join_deltas
        """A run's text or reasoning deltas queued back to back (``Run.delta_nowait``, every
        integration's token path) go as one delta of their texts, where the linger would have
        sent them in one batch anyway; False: one event per delta."""
        self.linger = linger_ms / 1000
        self.max_batch = max_batch
        self._yield_every = max(1, max_batch // 4)
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.delivery_timeout = delivery_timeout
        backoff = FullJitterBackoff(cap=backoff_cap, base=backoff_base)
        self._backoff = backoff
        self._connect_retry = Retry(backoff, deadline_s=delivery_timeout)
        self._deliver_retry = Retry(
            backoff, deadline_s=delivery_timeout,
            retry_on=(BusUnavailable, TimeoutError), retriable=lambda _: True,
        )
        self.outage = Outage(log)
        """This publisher's pauses: the retried bus errors by state (``{"bus full": 3}``)."""
        self._own_bus = own_bus
        self._clock = _Clock()
        self._roots: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        """Runs this publisher started: run id → (its root, its tenant), newest last (bounded)."""
        self._queue: deque[Event | Run] = deque()
        self._encoded: deque[bytes | _Join] = deque()
        """Each queued event's canonical JSON (a joined delta's made when it is taken): its size
        is what the byte bound counts, and a bus sends these bytes (``Bus.publish``'s ``data``)
        instead of encoding again."""
        self._joins = 0
        """Joined deltas in :attr:`_encoded`, their bytes still to make."""
        self._count = 0
        """Events queued or in flight."""
        self._queued = 0
        """Events queued (not yet in flight): what ``max_pending`` bounds."""
        self._queued_bytes = 0
        self._in_flight: list[Event | Run] = []
        """The batch on its way: each event, or the run of one queued as bytes only."""
        self._in_flight_data: list[bytes | _Join] = []
        self._in_flight_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asleep = False
        """The flusher waits for a first event (on :attr:`_lingering`): the event that arrives
        starts the linger, on the same future, without waking the flusher twice."""
        self._timer: asyncio.TimerHandle | None = None
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: DeliveryTimeout | None = None
        """A give-up not yet reported to any caller."""
        self._last_failure: DeliveryTimeout | None = None
        self._failure_epoch = 0
        self._flusher: asyncio.Task[None] | None = None
        self._lingering: asyncio.Future[None] | None = None
        """The flusher's wait, for a first event or for more to batch (:meth:`_linger`)."""
        self._hurried = 0
        """Flushes waiting: while any does, the flusher sends without lingering."""
        self._closing = False
        self.published = 0
        """Events the bus has accepted so far."""
        self.batches = 0
        """``Bus.publish`` calls that succeeded (events / batches = the batching achieved)."""

    # ---- lifecycle ---------------------------------------------------
    @classmethod
    def connect(cls, url: str, **options: Any) -> Publisher:
        """A publisher on the bus at ``url``; use as ``async with Publisher.connect(url) as pub``."""
        bus_options = options.pop("bus_options", {})
        return cls(open_bus(url, **bus_options), own_bus=True, **options)

    async def start(self) -> None:
        """Connect the bus (if this publisher opened it) and start the flusher."""
        if self._own_bus:
            await self._connect()
        self._loop = asyncio.get_running_loop()
        self._flusher = asyncio.create_task(self._flush_loop(), name="runwire-publisher")
        self._flusher.add_done_callback(self._flusher_stopped)

    def _flusher_stopped(self, task: asyncio.Task[None]) -> None:
        """Wake every waiter so none waits on a flusher that is gone (they raise instead)."""
        self._space.set()
        self._idle.set()

    async def _connect(self) -> None:
        """Connect, retrying an unreachable bus with backoff for up to ``delivery_timeout``."""
        await self._connect_retry.call(self.bus.connect)

    async def _enter(self) -> None:
        await self.start()

    async def close(self) -> None:
        """Flush what is queued (up to the delivery deadline), stop, and close the bus."""
        try:
            if self._flusher is not None and not self._flusher.done():
                await self.flush()
        finally:
            self._closing = True
            if self._flusher is not None:
                self._flusher.cancel()
                await asyncio.gather(self._flusher, return_exceptions=True)
                self._flusher = None
            if self._own_bus:
                await self.bus.close()

    # ---- publishing --------------------------------------------------
    def run(
        self,
        run_id: str,
        tenant: str | None = None,
        parent: Run | str | None = None,
        *,
        root: str | None = None,
        thread: str | None = None,
        context: str | RunContext | None = None,
        agent: str | None = None,
    ) -> Run:
        """A handle for publishing run ``run_id`` (seq from 1).

        ``parent`` (a :class:`Run` or a run id) makes it a child run. Its root
        is the parent's root: taken from the Run, from ``root`` if given, else
        from the runs this publisher started (so ``parent="child-id"`` of a
        child it started still reaches the tree's root); a parent id it has
        never seen is taken as a root. ``context`` — a token from
        :meth:`Run.context` in another service — states parent, root and
        tenant at once. ``thread`` is the chat/thread the run
        answers (the AI SDK's ``chatId``): every event of the run carries it
        as ``thread_id``, and the edge serves a thread's active run at
        ``/v1/threads/{thread}/stream``. A child run is not given its
        parent's thread: a thread's runs are the turns a chat shows. ``agent`` names the
        agent that runs it (its first event says it as ``ext.agent.name``; exported spans
        are then ``invoke_agent {agent}``, docs/observability.md).
        """
        parent_id: str | None = None
        root_id: str | None = None
        if context is not None:
            known = context if isinstance(context, RunContext) else RunContext.parse(context)
            parent_id, root_id = known.run, known.root_id
            tenant = tenant if tenant is not None else known.tenant
        elif isinstance(parent, Run):
            parent_id = parent.run_id
            root_id = parent.root_id or parent.run_id
            tenant = tenant if tenant is not None else parent.tenant
        elif parent is not None:
            parent_id = parent
            seen = self._roots.get(parent)
            root_id = root or (seen[0] if seen else parent)
            if tenant is None and seen is not None:
                tenant = seen[1]
        self._remember(run_id, root_id or run_id, tenant)
        return Run(self, run_id, tenant=tenant, parent_id=parent_id, root_id=root_id,
                   thread_id=thread, agent=agent)

    def _remember(self, run_id: str, root_id: str, tenant: str | None) -> None:
        roots = self._roots
        roots[run_id] = (root_id, tenant)
        roots.move_to_end(run_id)
        if len(roots) > MAX_KNOWN_RUNS:
            roots.popitem(last=False)

    def requests(
        self, channel: str = DEFAULT_CHANNEL, *, ttl_s: float = DEFAULT_TTL_S
    ) -> AsyncIterator[AgentRequest]:
        """Requests that an agent start a run (AI SDK chat turns sent over the edge's WebSocket).

        ``async for request in pub.requests("default"): run = pub.run_for(request)``.
        While iterating, this consumer announces itself on the channel (a heartbeat every
        ``ttl_s / 3``); with none alive the edge refuses a client's turn at once. See
        :mod:`runwire.bus.requests`.
        """
        return consume_requests(self.bus, channel, ttl_s=ttl_s)

    def tasks(self, agent: str = DEFAULT_CHANNEL, *, ttl_s: float = DEFAULT_TTL_S) -> AsyncIterator[A2ATask]:
        """Tasks A2A clients send ``agent`` through the edge, each with its run open:
        ``async for task in pub.tasks("agent")`` (see :mod:`runwire.sdk.tasks`)."""
        return consume_tasks(self, agent, ttl_s=ttl_s)

    def run_for(self, request: AgentRequest) -> Run:
        """The run answering ``request``: its run id, tenant and thread (the client is streaming it)."""
        return self.run(request.run_id, tenant=request.tenant, thread=request.thread_id)

    async def publish_events(self, events: Iterable[Event]) -> int:
        """Enqueue pre-built envelopes as they are (ids and seqs kept); returns how many."""
        count = 0
        for event in events:
            await self._enqueue(event)
            count += 1
        return count

    async def flush(self) -> None:
        """Wait until everything queued so far is on the bus (or raise DeliveryTimeout)."""
        self._raise_failure()
        self._hurried += 1  # what is queued goes now, not after the linger
        if self._lingering is not None:
            _wake(self._lingering)
        try:
            while self._count:
                self._idle.clear()
                if self._flusher is None or self._flusher.done():
                    raise RuntimeError("publisher is not running (use `async with`)")
                await self._idle.wait()
                self._raise_failure()
        finally:
            self._hurried -= 1
        self._raise_failure()

    @property
    def pending(self) -> int:
        """Events queued or in flight, not yet accepted by the bus."""
        return self._count

    @property
    def pending_bytes(self) -> int:
        """Encoded bytes queued or in flight."""
        return self._queued_bytes + self._in_flight_bytes

    async def _enqueue(self, event: Event, room_timeout: float | None = None) -> None:
        await self._settle(event, self._put(event), room_timeout)

    async def _settle(self, event: Event, data: bytes | None, room_timeout: float | None) -> None:
        """After :meth:`_put`: wait for room and queue ``event`` when it found none (``data``:
        its bytes), and yield to the loop every ``max_batch / 4`` events."""
        if data is not None:
            await self._wait_for_room(event, len(data), room_timeout)
            self._offer(event, data, len(data), room=True)
        if self._queued % self._yield_every == 0:
            # A caller emitting in a tight loop never yields while there is room: let
            # the flusher send a full batch and the loop take the bus's replies.
            await asyncio.sleep(0)

    def _put(self, event: Event) -> bytes | None:
        """Encode, check and queue ``event`` when there is room (None); else its bytes, not
        queued. Synchronous: an emit with room to spare awaits nothing but this."""
        if self._failure is not None:
            self._raise_failure()
        try:
            data = _encoder.encode(event)
        except RecursionError:
            raise MalformedFrame(f"event is nested deeper than {envelope.MAX_DEPTH} levels") from None
        except UnicodeEncodeError as exc:
            raise _not_unicode(exc) from None
        size = len(data)
        if size > envelope.MAX_FRAME_BYTES or event.ext is not None or type(event) in envelope.FREE_FORM:
            envelope.check_encoded(event, data)  # what a worker would dead-letter is refused here
        return None if self._offer(event, data, size) else data

    def _offer(self, item: Event | Run, data: bytes | _Join, size: int, *, room: bool = False) -> bool:
        """Queue ``data`` (``size`` bytes), routed by ``item``, when the bounds leave room for it
        (or ``room``: the caller waited for it); False, queuing nothing, when they don't."""
        queued = self._queued
        if not room and queued and (queued >= self.max_pending
                                    or self._queued_bytes + size > self.max_pending_bytes):
            return False
        self._queue.append(item)
        self._encoded.append(data)
        self._count += 1
        self._queued = queued = queued + 1
        self._queued_bytes += size
        if queued == 1 or queued >= self.max_batch:
            self._arrived(queued)
        return True

    async def _wait_for_room(self, event: Event, size: int, patience: float | None = None) -> None:
        """Wait until ``event`` fits the bound (one event always fits an empty queue), at most
        ``patience`` seconds when given (then DeliveryTimeout names it)."""
        epoch = self._failure_epoch
        deadline = None if patience is None else time.monotonic() + patience
        while self._queued and (
            self._queued >= self.max_pending or self._queued_bytes + size > self.max_pending_bytes
        ):
            self._space.clear()
            if self._flusher is None or self._flusher.done():
                raise RuntimeError("publisher is not running (use `async with`)")
            if deadline is None:
                await self._space.wait()
            elif not await _within(self._space.wait(), deadline - time.monotonic()):
                raise DeliveryTimeout(
                    f"no room in the publisher within {patience:g}s for {event.run_id} seq "
                    f"{event.seq} (the bus is slow or down)", [(event.run_id, event.seq)])
            failure = self._last_failure
            if self._failure_epoch != epoch and failure is not None:
                self._failure = None  # reported here
                raise DeliveryTimeout(
                    f"{failure}; nor was {event.run_id} seq {event.seq}, which waited for room",
                    [*failure.undelivered, (event.run_id, event.seq)],
                )

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    # ---- the flusher -------------------------------------------------
    def _arrived(self, queued: int) -> None:
        """A first event queued (``queued`` 1) or a full batch: the flusher waiting for one starts
        its linger (one timer on the future it waits on), a full batch ends the linger."""
        waiting = self._lingering
        if waiting is None:
            return  # a batch in flight (the flusher looks at the queue next) or no flusher yet
        if queued >= self.max_batch or self._hurried or self._closing or self.linger <= 0:
            _wake(waiting)
        elif self._asleep and self._loop is not None:
            self._asleep = False
            self._timer = self._loop.call_later(self.linger, _wake, waiting)

    async def _flush_loop(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                await self._linger(idle=True)  # the first event's arrival starts the linger
                if not self._queue:
                    continue
            elif (len(self._queue) < self.max_batch and self.linger > 0 and not self._closing
                    and not self._hurried):
                await self._linger()
            take = min(len(self._queue), self.max_batch)
            queue, encoded = self._queue, self._encoded
            if take == len(queue):  # the common case: all of it, copied at C speed
                self._in_flight, self._in_flight_data = list(queue), list(encoded)
                queue.clear()
                encoded.clear()
            else:
                self._in_flight = [queue.popleft() for _ in range(take)]
                self._in_flight_data = [encoded.popleft() for _ in range(take)]
            if self._joins:
                self._in_flight_data = [item if item.__class__ is bytes else item.seal()  # type: ignore[union-attr]
                                        for item in self._in_flight_data]
                self._joins = sum(item.__class__ is _Join for item in encoded) if encoded else 0
            data = cast(list[bytes], self._in_flight_data)
            self._in_flight_bytes = sum(map(len, data))
            self._queued -= take
            self._queued_bytes -= self._in_flight_bytes
            self._space.set()  # the queue has room again while this batch is on its way
            await self._deliver(self._in_flight, data)

    async def _linger(self, *, idle: bool = False) -> None:
        """Wait ``linger`` for more events to batch, or until :meth:`flush` or a full batch asks
        for them now (``asyncio.sleep``'s own two steps, with the future kept where flush finds
        it). ``idle``: first wait for an event; its arrival starts the linger (:meth:`_arrived`),
        so a batch wakes the flusher once."""
        loop = self._loop or asyncio.get_running_loop()
        self._lingering = waiting = loop.create_future()
        if idle:
            self._asleep = True
        else:
            self._timer = loop.call_later(self.linger, _wake, waiting)
        try:
            await waiting
        finally:
            timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
            self._lingering = None
            self._asleep = False

    async def _deliver(self, events: list[Event | Run], data: list[bytes]) -> None:
        async def attempt() -> None:
            async with asyncio.timeout(self.delivery_timeout):
                await self.bus.publish(events, data)

        if self.outage.state is None:  # a healthy bus: one attempt, none of the retries' steps
            try:
                async with asyncio.timeout(self.delivery_timeout):  # attempt(), one coroutine less
                    await self.bus.publish(events, data)
            except (BusUnavailable, TimeoutError):  # retried below (which logs the pause), after
                await asyncio.sleep(self._backoff.compute(1))  # the backoff a first retry waits
            except Exception as exc:  # not retriable: report it rather than loop
                self._give_up(f"the bus refused the batch ({exc!r})")
                return
            else:
                self._done(events)
                return
        try:
            await self.outage.call(self._deliver_retry, attempt)
        except (BusUnavailable, TimeoutError) as exc:
            self._give_up(f"gave up after {self.delivery_timeout:g}s of bus errors ({exc!r})")
            return
        except Exception as exc:  # not retriable: report it rather than loop
            self._give_up(f"the bus refused the batch ({exc!r})")
            return
        self._done(events)

    def _done(self, events: list[Event | Run]) -> None:
        self.published += len(events)
        self.batches += 1
        self._count -= len(events)
        self._in_flight, self._in_flight_data = [], []
        self._in_flight_bytes = 0
        self._space.set()
        if not self._queue:
            self._idle.set()

    def _give_up(self, why: str) -> None:
        lost = [(item.run_id, item.seq if not isinstance(item, Run) else
                 data.seq if isinstance(data, _Join) else _seq_of(data).seq)
                for item, data in zip([*self._in_flight, *self._queue],
                                      [*self._in_flight_data, *self._encoded], strict=True)]
        self._queue.clear()
        self._encoded.clear()
        self._joins = 0
        self._in_flight, self._in_flight_data = [], []
        self._count = self._queued = self._queued_bytes = self._in_flight_bytes = 0
        undelivered = lost
        self._failure = self._last_failure = DeliveryTimeout(
            f"{why}; {len(undelivered)} event(s) not delivered: {_describe(undelivered)}",
            undelivered,
        )
        self._failure_epoch += 1
        self._space.set()
        self._idle.set()


def _not_unicode(exc: UnicodeEncodeError) -> MalformedFrame:
    """An event with a string no UTF-8 encodes (a lone surrogate such as ``"\\ud800"``): refused
    before it takes a seq, as any event no worker could carry."""
    bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode()
    return MalformedFrame(f"event has a string that is not valid Unicode ({exc.reason}: {bad}); "
                          "nothing was published")


def _wake(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)


async def _within(waiting: Coroutine[Any, Any, Any], seconds: float) -> bool:
    """Whether ``waiting`` finished within ``seconds`` (it is cancelled if not)."""
    if seconds <= 0:
        waiting.close()
        return False
    try:
        async with asyncio.timeout(seconds):
            await waiting
    except TimeoutError:
        return False
    return True


def _describe(undelivered: list[tuple[str, int]]) -> str:
    """``run_a seq 3..7, run_b seq 1`` — consecutive seqs of a run folded into ranges."""
    parts: list[str] = []
    for run_id, first, last in _ranges(undelivered):
        parts.append(f"{run_id} seq {first}" if first == last else f"{run_id} seq {first}..{last}")
    if len(parts) > 20:
        parts = [*parts[:20], f"… {len(parts) - 20} more"]
    return ", ".join(parts)


def _ranges(pairs: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    for run_id, seq in pairs:
        if out and out[-1][0] == run_id and out[-1][2] + 1 == seq:
            out[-1] = (run_id, out[-1][1], seq)
        else:
            out.append((run_id, seq, seq))
    return out

