"""Durable Streams, read side: every run is a JSON-mode stream at ``/v1/ds/runs/{run_id}``.

The Durable Streams protocol (ElectricSQL; ``@durable-streams/client``,
``durable-streams`` on PyPI) reads a stream by **offset**: a catch-up ``GET``
returns a JSON array of messages and ``Stream-Next-Offset``;
``live=long-poll`` waits for the next messages (``204`` on timeout);
``live=sse`` streams ``event: data`` (a JSON array) and ``event: control``
(``streamNextOffset``, ``streamCursor``, ``upToDate``, ``streamClosed``).

Here a message is one frame of the run in the requested ``format`` (the
canonical envelope by default; ``detail``, ``profile`` and ``children`` apply
as on ``/v1/runs/{run_id}/stream``), and an **offset is a delivery seq**,
zero-padded to 20 digits: opaque to clients, lexicographically ordered, the
same in every format and view and on every edge instance. A run is *closed*
(``Stream-Closed: true``) once its terminal ``run.lifecycle`` is delivered.

Every mode reads through the edge's own machinery: catch-up and long-poll
answers are :func:`.session.replay` of ``(offset, tail]`` (hot tier, else the
replay log; ``410 Gone`` when neither keeps it), long-poll waits on the hub's
feed of the run, and ``live=sse`` is a :class:`.session.StreamSession` with a
Durable Streams sink. Auth is :func:`authorize_stream`'s, as on every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...core.errors import CONN_REPLAY_EXPIRED, ConfigError, ReplayExpired, UnknownRun
from ..fanout.clients import ClientQueue
from ..fanout.feed import FeedKey
from ..fanout.filters import event_filter
from ..fanout.frames import Frame
from ..fanout.resume import Probe, probe
from ..fanout.session import RunEnded, Sink, StreamRequest, StreamSession, replay
from ..fanout.transports import http_watcher, run_session
from ..service.context import Edge

JSON = "application/json"
OFFSET_DIGITS = 20
CURSOR_EPOCH_S = 1_728_432_000
"""2024-10-09T00:00:00Z: the protocol's default epoch for live-mode cursors."""
CURSOR_INTERVAL_S = 20
SAFETY = {"x-content-type-options": "nosniff", "cross-origin-resource-policy": "cross-origin"}
_json = msgspec.json.Encoder()

Authorize = Callable[[Edge, HTTPConnection], Awaitable[StreamRequest]]


def encode_offset(seq: int) -> str:
    """The offset after delivery seq ``seq`` (0 = the start)."""
    return f"{seq:0{OFFSET_DIGITS}d}"


def decode_offset(raw: str | None) -> int | None:
    """The delivery seq an offset stands after; None for ``now``. ConfigError (400) when malformed."""
    if raw is None or raw == "-1":
        return 0
    if raw == "now":
        return None
    if len(raw) != OFFSET_DIGITS or not (raw.isascii() and raw.isdigit()):
        raise ConfigError(f"bad offset {raw!r}: use -1, now, or a Stream-Next-Offset this edge returned")
    return int(raw)


def next_cursor(client: str | None) -> str:
    """The protocol's interval cursor (§10.1): never the client's own or lower, so CDN keys move on."""
    current = int((time.time() - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client is not None and client.isascii() and client.isdigit() and len(client) <= 19 and int(client) >= current:
        return str(int(client) + random.randint(1, 180))
    return str(current)


class Chunk(msgspec.Struct, kw_only=True):
    """What a catch-up or long-poll answer carries."""

    payloads: list[bytes]
    last: int
    """The seq the answer reaches (the next offset)."""
    closed: bool
    up_to_date: bool


class DurableRead:
    """``GET`` and ``HEAD`` on ``/v1/ds/runs/{run_id}``."""

    def __init__(self, edge: Edge, authorize: Authorize) -> None:
        self.edge = edge
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        stream = await self.authorize(self.edge, request)
        after = decode_offset(request.query_params.get("offset"))
        live = request.query_params.get("live")
        if live not in (None, "long-poll", "sse"):
            raise ConfigError(f"unknown live mode {live!r}; use long-poll or sse")
        found = await self.position(stream)
        hold = self.edge.quotas.stream(stream.holder if live is not None else "")
        start = found.tail if after is None else after
        stream = msgspec.structs.replace(stream, after=start, live=after is None)
        with hold:  # a live read (long-poll, SSE) holds one of the token's streams while it waits
            if request.method == "HEAD":
                response = Response(status_code=200, headers=_meta(found, "no-store"), media_type=JSON)
            elif live == "sse":
                await self.sse(stream, found, request, receive, send)
                return
            else:
                response = await self.answer(stream, found, request, long_poll=live == "long-poll")
            await response(scope, receive, send)

    async def position(self, stream: StreamRequest) -> Probe:
        """Where the run is; UnknownRun (404) when nobody published it."""
        found = await probe(self.edge.bus, self.edge.store, stream.feed_key.stream)
        if not found.published and await self.edge.store.stream_state(stream.run_id) is None:
            raise UnknownRun(f"no run {stream.run_id!r}")
        if found.end_seq is not None:
            found.tail = min(found.tail, found.end_seq)
        return found

    # ---- catch-up and long-poll ---------------------------------------------
    async def answer(self, stream: StreamRequest, found: Probe, request: Request, *, long_poll: bool) -> Response:
        after = stream.after
        cursor = next_cursor(request.query_params.get("cursor")) if long_poll else None
        try:
            if stream.live and not long_poll:  # offset=now: the tail, nothing else (§8)
                return _answer(Chunk(payloads=[], last=found.tail, closed=_closed(found, found.tail),
                                     up_to_date=True), None, "no-store")
            if long_poll and after >= found.tail:
                if _closed(found, after):
                    return _empty(found, after, cursor)
                found = await self.wait(stream, found)
                if after >= found.tail:
                    return _empty(found, after, cursor)
            chunk = await self.read(stream, found, after)
        except ReplayExpired as exc:
            return _json_error(410, str(exc), CONN_REPLAY_EXPIRED)
        etag = _etag(stream, after, chunk)
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag, **SAFETY})
        caching = "no-cache" if chunk.up_to_date and not chunk.closed else self._shared()
        response = _answer(chunk, cursor, caching)
        response.headers["etag"] = etag
        return response

    def _shared(self) -> str:
        scope = "private" if self.edge.gate.enabled else "public"
        return f"{scope}, max-age=60, stale-while-revalidate=300"

    async def read(self, stream: StreamRequest, found: Probe, after: int) -> Chunk:
        """Messages of ``(after, tail]``, at most ``history_batch`` events' worth."""
        if after >= found.tail:
            return Chunk(payloads=[], last=after, closed=_closed(found, after), up_to_date=True)
        key = stream.feed_key
        accepts = event_filter(key.profile, key.children)
        limit = self.edge.settings.history_batch
        payloads: list[bytes] = []
        last, events, closed = after, 0, False
        async with contextlib.aclosing(replay(self.edge.hub, key, accepts, after, found.tail)) as batches:
            async for _source, frames, upto in batches:
                for frame in frames:
                    payloads.extend(frame.payloads)
                    closed = closed or frame.terminal
                last = max(last, upto)
                events += len(frames)
                if closed or events >= limit:
                    break
        return Chunk(payloads=payloads, last=last, closed=closed, up_to_date=closed or last >= found.tail)

    async def wait(self, stream: StreamRequest, found: Probe) -> Probe:
        """Wait up to ``long_poll_s`` for the run to move past ``stream.after``; the new position."""
        hub = self.edge.hub
        key = stream.feed_key
        feed = await hub.feed(FeedKey(key.run_id, key.view, "koder", key.profile, key.children))
        client = ClientQueue(max_frames=64, max_bytes=1 << 20)
        hub.attach(feed, client)
        try:
            deadline = time.monotonic() + self.edge.settings.long_poll_s
            while feed.position <= stream.after and (remaining := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.wait(), remaining)
                client.take()
            ended = hub.stream_of(feed).end_seq
        finally:
            hub.detach(feed, client)
        tail = feed.position if ended is None else min(feed.position, ended)
        return Probe(tail=max(tail, found.tail), end_seq=ended, published=True)

    # ---- live=sse ---------------------------------------------------------------
    async def sse(
        self, stream: StreamRequest, found: Probe, request: Request, receive: Receive, send: Send
    ) -> None:
        if not stream.live and stream.after < found.tail:
            try:  # a cursor nobody keeps is 410 before the stream starts, not an error frame in it
                await self.read(msgspec.structs.replace(stream, format="koder"), found, stream.after)
            except ReplayExpired as exc:
                await _json_error(410, str(exc), CONN_REPLAY_EXPIRED)(request.scope, receive, send)
                return
        sink = DurableSseSink(send, stream.after, found.tail, request.query_params.get("cursor"),
                              self.edge.settings.durable_sse_s)
        session = StreamSession(self.edge.hub, stream, sink)
        sink.session = session
        try:
            final, gone, refused = await run_session(self.edge.hub, session, http_watcher(request.scope, receive))
        except Rotate:
            final, gone, refused = None, False, None
        if gone:
            return
        with contextlib.suppress(OSError):
            if final is not None and not sink.started:
                # refused before anything was sent: a stateful format resumed mid-run needs the run's
                # history from the start to prime its encoder, and nobody keeps it any more
                error = msgspec.json.decode(final.payloads[0])
                status = 410 if error.get("code") == CONN_REPLAY_EXPIRED else 503
                await _json_error(status, error.get("message", ""), error.get("code", ""))(
                    request.scope, receive, send)
                return
            if isinstance(refused, RunEnded):
                await sink.begin()
                await sink.control(refused.seq, closed=True)
            await sink.begin()
            await sink.finish()


class DurableSseSink(Sink):
    """``event: data`` (a JSON array of the frames' messages) then ``event: control``, per write."""

    def __init__(self, send: Send, offset: int, tail: int, cursor: str | None, rotate_s: float) -> None:
        self._send = send
        self.offset = offset
        self.tail = tail
        self.cursor = next_cursor(cursor)
        """One cursor per connection (§10.1): it only has to differ from the one the client sent."""
        self.session: StreamSession | None = None
        self.started = False
        self.rotate_at = time.monotonic() + rotate_s if rotate_s > 0 else float("inf")

    def _rotate(self) -> None:
        """End a long connection after a control event (§10.2); the client reconnects at its offset."""
        if time.monotonic() >= self.rotate_at:
            raise Rotate()

    async def begin(self) -> None:
        if self.started:
            return
        self.started = True
        headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                   "x-accel-buffering": "no", **SAFETY}
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        await self._send({"type": "http.response.start", "status": 200, "headers": raw})
        await self.control(self.offset, closed=False)

    def _position(self) -> int:
        feed = self.session.feed if self.session is not None else None
        return max(self.tail, feed.position) if feed is not None else self.tail

    async def control(self, offset: int, *, closed: bool) -> None:
        await self._write(_control(offset, self.cursor, closed=closed, up_to_date=offset >= self._position()))

    async def send(self, frames: list[Frame]) -> None:
        payloads: list[bytes] = []
        closed = False
        for frame in frames:
            if frame.event_type == "error":  # the stream is cut short (BUF-0001): the client resumes
                continue
            payloads.extend(frame.payloads)
            if frame.seq is not None:
                self.offset = max(self.offset, frame.seq)
            closed = closed or frame.terminal
        body = b"event: data\ndata: [%s]\n\n" % b",".join(payloads) if payloads else b""
        up_to_date = closed or self.offset >= self._position()
        await self._write(body + _control(self.offset, self.cursor, closed=closed, up_to_date=up_to_date))
        if not closed:
            self._rotate()

    async def keepalive(self) -> None:
        await self._write(_control(self.offset, self.cursor, closed=False, up_to_date=True))
        self._rotate()

    async def finish(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})


class Rotate(Exception):
    """A Durable Streams SSE connection reached its age: end it after the control event just sent."""


def _control(offset: int, cursor: str, *, closed: bool, up_to_date: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": encode_offset(offset)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata: %s\n\n" % _json.encode(control)


def _closed(found: Probe, offset: int) -> bool:
    return found.end_seq is not None and offset >= found.end_seq


def _meta(found: Probe, caching: str) -> dict[str, str]:
    headers = {"stream-next-offset": encode_offset(found.tail), "cache-control": caching, **SAFETY}
    if found.end_seq is not None:
        headers["stream-closed"] = "true"
    return headers


def _answer(chunk: Chunk, cursor: str | None, caching: str) -> Response:
    headers = {"stream-next-offset": encode_offset(chunk.last), "cache-control": caching, **SAFETY}
    if chunk.up_to_date:
        headers["stream-up-to-date"] = "true"
    if chunk.closed:
        headers["stream-closed"] = "true"
    if cursor is not None and not chunk.closed:
        headers["stream-cursor"] = cursor
    return Response(b"[" + b",".join(chunk.payloads) + b"]", status_code=200, headers=headers, media_type=JSON)


def _empty(found: Probe, after: int, cursor: str | None) -> Response:
    """Long-poll with nothing new: 204, at once when the run is closed, else after the wait."""
    headers = {"stream-next-offset": encode_offset(max(after, found.tail)), "stream-up-to-date": "true",
               "cache-control": "no-store", **SAFETY}
    if _closed(found, after):
        headers["stream-closed"] = "true"
    elif cursor is not None:
        headers["stream-cursor"] = cursor
    return Response(status_code=204, headers=headers)


def _etag(stream: StreamRequest, after: int, chunk: Chunk) -> str:
    what = f"{stream.run_id}\0{stream.view}\0{stream.format}\0{stream.profile}\0{stream.children}"
    digest = hashlib.blake2b(what.encode(), digest_size=8).hexdigest()
    return f'"{digest}:{encode_offset(after)}:{encode_offset(chunk.last)}{":c" if chunk.closed else ""}"'


def _json_error(status: int, message: str, code: str | None) -> Response:
    body: dict[str, str] = {"error": message}
    if code:
        body["code"] = code
    return Response(_json.encode(body), status_code=status, media_type=JSON, headers=dict(SAFETY))

