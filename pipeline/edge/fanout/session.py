"""One client's stream, whatever the transport: attach, catch up, go live, end.

The order matters (live events arrive while history is read): the client is attached to its feed first —
from then on live frames after the feed's position ``P`` queue up for it —
then history ``(after, P]`` is written, then the queue, skipping any seq
already written. Nothing is lost at the seam and nothing is sent twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable

import msgspec

from ...core.envelope import Event
from ...core.errors import BUF_DROP, ReplayExpired, RunNotPublished
from ...protocols import egress
from .clients import ClientQueue
from .feed import Feed, FeedKey, encode_preamble, ends_stream, frame_or_skip, is_stateless
from .frames import Batch, Frame, error_frame
from .hub import Hub, Stream
from .resume import history, needs_log

log = logging.getLogger(__name__)


class StreamRequest(msgspec.Struct, kw_only=True, frozen=True):
    """What a client asked for (from the path, the query and the headers)."""

    run_id: str
    view: str = "shaped"
    """``raw`` (detail=full) or ``shaped``."""
    format: str = "koder"
    profile: str = "default"
    children: str = "flatten"
    after: int = 0
    """Resume after this delivery seq (Last-Event-ID / ``?after=``); 0 = from the start."""
    live: bool = False
    """Join at the live position (``?after=live``): no history, the format's preamble first."""
    holder: str = ""
    """The token the stream is held for (its ``token_id``; "" with auth off): what quotas count."""

    @property
    def feed_key(self) -> FeedKey:
        return FeedKey(self.run_id, self.view, self.format, self.profile, self.children)


class Sink(ABC):
    """A transport's side of a stream: SSE, NDJSON or WebSocket."""

    format_name: str = "koder"
    writes_now: bool = False
    """Whether :meth:`write_now` can ever write (the hub then writes live frames through it)."""

    async def begin(self) -> None:  # noqa: B027 - optional hook, most sinks have nothing to do
        """Called once the stream is going to be served (HTTP sends its status and headers here)."""

    @abstractmethod
    async def send(self, frames: list[Frame]) -> None:
        """Write frames (already encoded) to the client."""

    def write_now(self, batch: Batch) -> bool:
        """Write a batch of live frames (none terminal) at once, without waiting; False, having
        written nothing, when that can't be done now (they are then :meth:`send`'s)."""
        return False

    def keepalive_now(self) -> bool:
        """:meth:`keepalive`'s bytes written at once, without waiting; False as :meth:`write_now`."""
        return False

    @abstractmethod
    async def keepalive(self) -> None:
        """Called when nothing was sent for ``keepalive_s`` seconds."""


class StreamSession:
    """Serves one client until its run ends, it disconnects or it overflows."""

    def __init__(self, hub: Hub, request: StreamRequest, sink: Sink) -> None:
        self.hub = hub
        self.request = request
        self.sink = sink
        settings = hub.settings
        self.client = ClientQueue(
            max_frames=settings.client_queue_events, max_bytes=settings.client_queue_bytes
        )
        self.last = request.after
        self.feed: Feed | None = None
        self.overflowed = False
        self._sending = False
        self._task: asyncio.Task[object] | None = None
        self.client.on_overflow = self._abort
        self._frames_out = hub.metrics.events_out.labels(request.format)

    def _abort(self) -> None:
        """The client overflowed: stop a write that is stuck on a client that stopped reading."""
        self.overflowed = True
        if self._sending and self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        """Stream to the client until the run ends.

        Raises :class:`RunEnded` when the cursor is at or past the end of a
        finished run (before :meth:`Sink.begin` unless the run was unpublished
        when the client came), :class:`RunNotPublished` when nobody published
        the run within ``unpublished_wait_s``, and ReplayExpired for a cursor
        nobody keeps any more.
        """
        self._task = asyncio.current_task()
        feed = await self.hub.feed(self.request.feed_key)
        self.feed = feed
        self.hub.attach(feed, self.client)
        try:
            stream = self.hub.stream_of(feed)
            published = stream.published.is_set()
            if published:
                after = await self._cursor(stream, feed)
                await self._history_reachable(after, feed.position)
            # Headers go out before any wait: a client may open the stream, then start its agent.
            await self.sink.begin()
            if not published:
                await self._await_published(stream)
                after = await self._cursor(stream, feed)
            # Frames after the feed's position are queued for this client from here on.
            position = feed.position
            if self.request.live or after >= position:
                # Joining at the live position: no history, the format's preamble first.
                self.last = position if self.request.live else after
                await self._send(self._preamble(feed))
            elif await self._catch_up(after, position):
                return
            await self._live(stream)
        finally:
            self.hub.detach(feed, self.client)

    async def _await_published(self, stream: Stream) -> None:
        if stream.published.is_set():
            return
        wait = self.hub.settings.unpublished_wait_s
        try:
            await asyncio.wait_for(stream.published.wait(), wait)
        except TimeoutError:
            raise RunNotPublished(
                f"no events of run {self.request.run_id!r} were published within {wait:g} s"
            ) from None

    async def _cursor(self, stream: Stream, feed: Feed) -> int:
        """The cursor to serve from: the request's, or the run's end when it is past it."""
        after = self.request.after
        end = stream.end_seq
        if end is not None and (self.request.live or after >= end):
            raise RunEnded(self.request.run_id, end, stream.terminal_state or "error")
        if after > feed.position:
            # Past the end of a live run (or of this hub's read): served from where the run is.
            bounds = await self.hub.bus.bounds(feed.key.stream)
            return min(after, max(feed.position, bounds[1] if bounds else 0))
        return after

    async def _history_reachable(self, after: int, position: int) -> None:
        """A resume whose history starts in the replay log asks the log first, so that one it
        can't serve now is refused before the response starts: ``StoreUnavailable``, 503 with
        ``Retry-After`` (a resume the hot tier covers goes on while the log is down)."""
        if self.request.live or after >= position:
            return
        start = 0 if after > 0 and not is_stateless(self.request.format) else after
        if await needs_log(self.hub.bus, self.request.feed_key.stream, start):
            await self.hub.store.ping()

    @staticmethod
    def _preamble(feed: Feed) -> list[Frame]:
        if is_stateless(feed.key.format):
            return []
        payloads = encode_preamble(feed.encoder)
        return [Frame(payloads, seq=None)] if payloads else []

    async def _catch_up(self, after: int, position: int) -> bool:
        """Write history ``(after, position]``; True when it ended the run."""
        self.last = after
        if after >= position:
            return False
        accepts = self.feed.accepts if self.feed else (lambda _e: True)
        counted = False
        async for source, frames, _last in replay(self.hub, self.request.feed_key, accepts, after, position):
            if not counted and source != PREAMBLE:
                self.hub.metrics.resumes.labels(source).inc()
                counted = True
            if await self._send(frames):
                return True
        return False

    async def _live(self, stream: Stream) -> None:
        if stream.silence is not None and self.feed is not None:
            # The run was ended for silence before this client came: end it the same way.
            frame = self.hub.silence_frame(self.feed, stream)
            await self._send([frame] if frame else [])
            return
        if self.sink.writes_now:
            self.client.direct = self
        try:
            while True:
                if not await self.client.wait():
                    await self.sink.keepalive()
                    continue
                if self.client.overflowed:
                    raise Overflowed()
                frames = [f for f in self.client.take() if f.seq is None or f.seq > self.last]
                if await self._send(frames):
                    return
        finally:
            self.client.direct = None

    def write_now(self, batch: Batch) -> bool:
        """Write a batch of live frames from the hub's fan-out, while this session's task waits.

        No task switch and no ASGI message per client write (docs/edge.md § Performance); False,
        having written nothing, for what the task must handle: a terminal frame (its drop count,
        the end), a seq already written, or a sink that can't write now (a full buffer: the task's
        ``send`` then waits for the drain, and the queue's bounds apply as ever).
        """
        first = batch.first_seq
        if batch.terminal or (first is not None and first <= self.last):
            return False
        try:
            if not self.sink.write_now(batch):
                return False
        except Exception:  # this client's alone: queued, its task's send meets it; the hub goes on
            log.debug("edge: a direct write to a client failed; its task sends instead", exc_info=True)
            return False
        if batch.last_seq is not None:
            self.last = batch.last_seq
        self.client.last_write = time.monotonic()
        self._frames_out.inc(len(batch))
        return True

    def keepalive_now(self) -> bool:
        """A keepalive from the hub's sweep, written as :meth:`write_now` writes (no task woken)."""
        try:
            return self.sink.keepalive_now()
        except Exception:  # as write_now: the task sends it instead
            log.debug("edge: a direct keepalive to a client failed; its task sends one", exc_info=True)
            return False

    async def _send(self, frames: list[Frame]) -> bool:
        """Write frames (terminal ones with this client's drop count); True after the terminal one."""
        if not frames:
            return False
        ended = False
        out: list[Frame] = []
        for frame in frames:
            if frame.terminal:
                frame = frame.with_dropped(self.client.dropped)
                ended = True
            out.append(frame)
            if frame.seq is not None:
                self.last = max(self.last, frame.seq)
            if ended:
                break
        self._sending = True
        self.client.last_write = time.monotonic()
        try:
            await self.sink.send(out)
        except asyncio.CancelledError:
            if not self.overflowed:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise Overflowed() from None
        finally:
            self._sending = False
        self._frames_out.inc(len(out))
        return ended


class RunEnded(Exception):
    """The cursor is at or past the end of a finished run: nothing will ever follow it."""

    def __init__(self, run_id: str, seq: int, state: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.state = state
        super().__init__(f"run {run_id!r} ended ({state}) at seq {seq}; nothing follows it")

    def frame(self) -> Frame:
        """The final message NDJSON and WebSocket clients get (SSE gets 204 No Content)."""
        body = msgspec.json.encode(
            {"type": "end", "run_id": self.run_id, "state": self.state, "seq": self.seq, "message": str(self)}
        )
        return Frame([body], seq=None, terminal=True, event_type="end")


PREAMBLE = "preamble"


async def replay(
    hub: Hub, key: FeedKey, accepts: Callable[[Event], bool], after: int, upto: int
) -> AsyncGenerator[tuple[str, list[Frame], int]]:
    """Frames of ``(after, upto]`` in a feed's format, as ``(source, frames, last seq read)`` batches.

    A stateful format resumed mid-run first gets its encoder primed with the
    events up to ``after`` and the format's preamble (source ``preamble``),
    so the frames are exactly what a client that followed live received.
    """
    encoder = egress(key.format)
    batch = hub.settings.history_batch
    if after > 0 and not is_stateless(key.format):
        async for _source, events in history(hub.bus, hub.store, key.stream, 0, after, batch):
            for event in events:
                if accepts(event):
                    frame_or_skip(encoder, event, False, key.format)
        payloads = encode_preamble(encoder)
        if payloads:
            yield PREAMBLE, [Frame(payloads, seq=None)], after
    async for source, events in history(hub.bus, hub.store, key.stream, after, upto, batch):
        frames = [frame_or_skip(encoder, e, ends_stream(e), key.format) for e in events if accepts(e)]
        yield source, frames, events[-1].seq if events else after


class Overflowed(Exception):
    """The client could not take even control events (Koder agent stream §4 R4): disconnect with BUF-0001."""

    code = BUF_DROP


def overflow_frame() -> Frame:
    return error_frame(
        BUF_DROP,
        "the client fell too far behind to receive control events; reconnect with Last-Event-ID to resume",
    )


def expired_frame(exc: ReplayExpired) -> Frame:
    return error_frame(exc.code, str(exc))
