"""The hub: one multiplexed bus reader per process, one encoder per feed.

* A **stream** is a delivery stream ``(run_id, view)``. The hub reads every
  subscribed stream with **one** :meth:`Bus.tail` call per round (not a bus
  connection or read loop per client).
* A **feed** (:mod:`.feed`) is what a group of clients asked for on one stream:
  ``(format, profile, children)``. It owns one egress encoder, so each event
  is filtered and encoded once per feed and the same bytes go to every
  client (never encoded per client). Egress codecs are deterministic, so a feed created
  mid-run is primed with the stream's history and is then in the same state
  as one that streamed it live.
* Putting a frame in a client's queue never waits (see ``clients.py``), so a
  slow client can't slow the hub or other clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time

import msgspec

from ...bus.base import StreamKey
from ...bus.ports import DeliveryStreams
from ...core import envelope
from ...core.envelope import Event, RunLifecycle, RunLifecyclePayload
from ...core.redaction import redact_text
from ...core.ulid import new_event_id
from ...store.ports import RunHistory
from ..metrics import EdgeMetrics
from ..settings import EdgeSettings
from .clients import ClientQueue
from .feed import Feed, FeedKey, ends_stream, frame_or_skip, is_stateless
from .frames import Frame
from .resume import first_covered, history, probe

log = logging.getLogger(__name__)
KEEPALIVE_SLICE = 500
"""Keepalives the sweep writes (or wakes) before it lets other work run (~5 ms of them)."""
READ_RETRY_S = 0.5
"""Pause between failed reads of the bus."""
_json = msgspec.json.Encoder()


SILENCED_KEPT = 10_000
"""Silenced streams remembered (oldest forgotten first): a reconnect to one ends at once."""
HOLE_ATTEMPTS = 6
"""Reads of a trimmed hole before giving up (50 ms, 100 ms … apart: about a second)."""


def _state(event: Event) -> str | None:
    return event.payload.state if isinstance(event, RunLifecycle) else None


class Stream:
    """One subscribed delivery stream: its tail cursor and its feeds."""

    def __init__(self, key: StreamKey, cursor: int, idle_since: float) -> None:
        self.key = key
        self.cursor = cursor
        self.feeds: dict[FeedKey, Feed] = {}
        self.last_activity = idle_since
        self.ended = False
        self.terminal_seq: int | None = None
        """Seq of the run's own terminal ``run.lifecycle`` once this stream has it."""
        self.terminal_state: str | None = None
        self.silence: Event | None = None
        """The synthesized ``run.lifecycle`` error that ended a silent run (no delivery seq)."""
        self.published = asyncio.Event()
        """Set once the run has any event (in the hot tier, the replay log, or live)."""
        self.tenant: str | None = None

    def mark_ended(self, seq: int, state: str | None) -> None:
        self.ended = True
        self.terminal_seq = seq
        self.terminal_state = state

    @property
    def end_seq(self) -> int | None:
        """The last seq a client can get: the terminal event's, or the cursor of a silenced run."""
        if self.terminal_seq is not None:
            return self.terminal_seq
        return self.cursor if self.silence is not None else None


class Hub:
    """Serves every client of this process from one multiplexed bus reader."""

    def __init__(self, bus: DeliveryStreams, store: RunHistory, settings: EdgeSettings, metrics: EdgeMetrics) -> None:
        self.bus = bus
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.streams: dict[StreamKey, Stream] = {}
        self._reader: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._priming: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._silenced: dict[StreamKey, Event] = {}
        """Streams this process ended for silence, remembered after their last client left."""

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_loop(), name="runwire-edge-hub")
        self._watchdog = asyncio.create_task(self._silence_loop(), name="runwire-edge-silence")
        self._keepalive = asyncio.create_task(self._keepalive_loop(), name="runwire-edge-keepalive")

    async def stop(self) -> None:
        for task in (self._reader, self._watchdog, self._keepalive):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ---- subscriptions ------------------------------------------------
    async def feed(self, key: FeedKey) -> Feed:
        """The ready feed for ``key`` (created and primed when it is the first).

        The caller must :meth:`attach` to it before its next ``await``: the
        feed is then known to be registered and current.
        """
        while True:
            feed = await self._feed_once(key)
            stream = self.streams.get(key.stream)
            if stream is not None and stream.feeds.get(key) is feed:
                return feed
            # Its last client left while this one waited for it: take a fresh one.

    async def _feed_once(self, key: FeedKey) -> Feed:
        async with self._lock:
            stream = self.streams.get(key.stream)
            if stream is None:
                stream = await self._open_stream(key.stream)
            feed = stream.feeds.get(key)
            created = feed is None
            if feed is None:
                feed = stream.feeds[key] = Feed(key, stream.cursor)
        if created:
            # Primed by the hub, not by this client's task: if this client leaves
            # mid-way, the others waiting for the feed still get it.
            task = asyncio.create_task(self._prime(feed), name="runwire-edge-prime")
            self._priming.add(task)
            task.add_done_callback(self._priming.discard)
        await feed.ready.wait()
        if feed.failure is not None:
            raise feed.failure
        return feed

    def attach(self, feed: Feed, client: ClientQueue) -> int:
        """Start queueing ``feed``'s live frames for ``client``; returns the position it starts after."""
        feed.clients.add(client)
        self.metrics.connections.inc()
        return feed.position

    def detach(self, feed: Feed, client: ClientQueue) -> None:
        if client not in feed.clients:
            return
        feed.clients.discard(client)
        self.metrics.connections.dec()
        stream = self.streams.get(feed.key.stream)
        if feed.clients or stream is None:
            return
        stream.feeds.pop(feed.key, None)
        if not stream.feeds:
            self.streams.pop(stream.key, None)

    async def _open_stream(self, key: StreamKey) -> Stream:
        found = await probe(self.bus, self.store, key)
        stream = Stream(key, found.tail, time.monotonic() - found.idle_s)
        if found.end_seq is not None:
            stream.mark_ended(found.end_seq, found.end_state)
        else:
            silence = self._silenced.get(key)
            if silence is not None and silence.seq == found.tail:
                stream.ended, stream.silence = True, silence
        if found.published:
            stream.published.set()
        self.streams[key] = stream
        self._wake.set()
        return stream

    async def _prime(self, feed: Feed) -> None:
        try:
            if not is_stateless(feed.key.format) and feed.position > 0:
                async for _source, events in history(
                    self.bus, self.store, feed.key.stream, 0, feed.position, self.settings.history_batch
                ):
                    for event in events:
                        feed.encode(event)
        except Exception as exc:  # a failed priming is reported to every waiting client
            feed.failure = exc
            stream = self.streams.get(feed.key.stream)
            if stream is not None:
                stream.feeds.pop(feed.key, None)
            feed.ready.set()
            return
        feed.drain_backlog(self.metrics)

    # ---- the one reader -----------------------------------------------
    async def _read_loop(self) -> None:
        failing_since: float | None = None  # reads failing since (None: working); logged once per change
        while True:
            if not self.streams:
                self._wake.clear()
                await self._wake.wait()
                continue
            cursors = {key: stream.cursor for key, stream in self.streams.items()}
            try:
                batch = await self.bus.tail(cursors, block_ms=self.settings.tail_block_ms)
            except Exception as exc:  # the bus is retried; clients keep their connections meanwhile
                self.metrics.bus_errors.inc()
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning("edge hub: reading the bus failed (%s); retrying every %g s, clients stay "
                                "connected", redact_text(str(exc) or type(exc).__name__), READ_RETRY_S)
                await asyncio.sleep(READ_RETRY_S)
                continue
            if failing_since is not None:
                log.info("edge hub: reading the bus again after %.1f s", time.monotonic() - failing_since)
                failing_since = None
            batch = await self._fill_holes(batch)
            try:
                self.dispatch(batch)
            except Exception:  # one bad event must not stop every stream of the process
                log.exception("edge hub: dispatch failed; continuing")

    async def _fill_holes(self, batch: list[tuple[StreamKey, Event]]) -> list[tuple[StreamKey, Event]]:
        """Put back what a tail read skipped, so live clients never lose events silently (a gap is filled or reported, never skipped).

        A burst longer than the bus's ``maxlen`` between two reads trims the
        hot stream past the hub's cursor: the read then starts after a hole.
        An event's first covered seq (``span[0]`` of a shaped event) is its
        predecessor's seq + 1 in either view — the shaped view's spans tile
        (:mod:`runwire.processing.shaping`), however its windows interleave — so a hole
        is exactly ``span[0] > cursor + 1``. It is read like a resume (hot
        tier, else the replay log, just that stretch of the shaped view
        recomputed) and goes out before the rest of the batch.
        """
        checked: set[StreamKey] = set()
        filled: list[tuple[StreamKey, Event]] = []
        for key, event in batch:
            stream = self.streams.get(key)
            if key in checked or stream is None or event.seq <= stream.cursor:
                continue
            checked.add(key)
            start = first_covered(event)
            if start <= stream.cursor + 1:
                continue
            filled.extend((key, e) for e in await self._hole(key, stream.cursor, start - 1))
        return filled + batch if filled else batch

    async def _hole(self, key: StreamKey, after: int, upto: int) -> list[Event]:
        """Seqs ``after < seq <= upto`` of a stream, complete or not at all.

        Workers write the replay log and the shaped view concurrently, so the
        log may lag the hot tier for a moment; a read that does not reach
        ``upto`` (a shaped window cut short) is retried for up to a second.
        """
        for attempt in range(HOLE_ATTEMPTS):
            events: list[Event] = []
            with contextlib.suppress(Exception):
                async for _source, chunk in history(
                    self.bus, self.store, key, after, upto, self.settings.history_batch
                ):
                    events.extend(chunk)
            if events and events[-1].seq == upto:
                return events
            await asyncio.sleep(0.05 * (attempt + 1))
        log.error("edge hub: seqs %d..%d of %s were trimmed before the hub read them and "
                  "the replay log does not have them", after + 1, upto, key)
        return []

    def dispatch(self, batch: list[tuple[StreamKey, Event]]) -> None:
        """Hand one tail result to the feeds (synchronous: no client can slow it)."""
        now = time.monotonic()
        wall = time.time()
        pending: dict[Feed, list[Frame]] = {}
        for key, event in batch:
            stream = self.streams.get(key)
            if stream is None or event.seq <= stream.cursor:
                continue
            for feed in stream.feeds.values():
                frame = feed.accept(event)  # never raises: a failure is that feed's skip frame
                if frame is not None:
                    pending.setdefault(feed, []).append(frame)
            stream.cursor = event.seq
            stream.last_activity = now
            stream.published.set()
            self.metrics.events_in.inc()
            with contextlib.suppress(ValueError):  # a timestamp without an instant: no lag figure
                self.metrics.observe_lag(wall, event.ts)
            if ends_stream(event):
                stream.mark_ended(event.seq, _state(event))
        for feed, frames in pending.items():
            try:
                feed.fan_out(frames, self.metrics)
            except Exception:  # one feed's clients must not cost the others their frames
                log.exception("edge hub: fan-out of %s failed", feed.key)

    # ---- keepalive: one sweep for every client ----------------------------
    async def _keepalive_loop(self) -> None:
        every = self.settings.keepalive_s
        while True:
            await asyncio.sleep(min(1.0, every / 4))
            now = time.monotonic()
            due = 0
            for stream in list(self.streams.values()):
                for feed in list(stream.feeds.values()):
                    for client in list(feed.clients):
                        if client.last_write <= now - (client.keepalive_s or every) and not len(client):
                            client.last_write = time.monotonic()
                            client.keepalive()
                            due += 1
                            if due % KEEPALIVE_SLICE == 0:
                                # clients that connected together fall due together: let other
                                # work (a control event's fan-out) in between slices of them
                                await asyncio.sleep(0)

    # ---- silence: every stream ends -------------------------------------
    async def _silence_loop(self) -> None:
        limit = self.settings.silence_s
        if limit <= 0:
            return
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for stream in list(self.streams.values()):
                if not stream.ended and now - stream.last_activity > limit:
                    self.end_silent(stream, limit)

    def end_silent(self, stream: Stream, limit: float) -> None:
        """End a stream whose agent went silent: a synthesized ``run.lifecycle`` error (seq unchanged)."""
        stream.ended = True
        stream.silence = event = self._silenced[stream.key] = RunLifecycle(
            id=new_event_id(),
            ts=envelope.now_ts(),
            run_id=stream.key[0],
            seq=stream.cursor,
            payload=RunLifecyclePayload(
                state="error", reason=f"no events for {limit:g} s; the agent is presumed dead"
            ),
        )
        if len(self._silenced) > SILENCED_KEPT:
            del self._silenced[next(iter(self._silenced))]
        for feed in list(stream.feeds.values()):
            if feed.ready.is_set() and feed.terminal_seq is None:
                frame = feed.encode(event)
                if frame is not None:
                    frame.seq = None  # not a delivery seq: a resume continues after the last real one
                    feed.fan_out([frame], self.metrics)

    def stream_of(self, feed: Feed) -> Stream:
        """The stream a feed belongs to (present while a client is attached to the feed)."""
        return self.streams[feed.key.stream]

    @staticmethod
    def silence_frame(feed: Feed, stream: Stream) -> Frame | None:
        """A silenced run's synthesized end, for a client that attached after it went out."""
        if stream.silence is None or not feed.accepts(stream.silence):
            return None
        try:
            encoder = copy.deepcopy(feed.encoder)
        except Exception:  # an encoder that cannot be copied: its state after the end no longer matters
            encoder = feed.encoder
        frame = frame_or_skip(encoder, stream.silence, True, feed.key.format)
        frame.seq = None
        return frame
