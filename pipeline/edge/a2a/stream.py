"""A task's stream (``SubscribeToTask``, ``SendStreamingMessage``) over SSE, on either binding.

It is a :class:`~runwire.edge.fanout.session.StreamSession` of the run in the ``a2a``
format (``runwire.protocols.a2a``): the hub encodes each event once for every A2A
client of the run; this sink only frames the bytes — JSON-RPC wraps each
object in ``{"jsonrpc":"2.0","id":…,"result":…}``, HTTP+JSON sends it as it is.

* **First a Task.** Joining live, the session's preamble is the task as it
  stands (status and artifacts so far); from a cursor, the task as it stood
  there; from the start, the empty task.
* **Exact resume** (the extension, :data:`~runwire.protocols.a2a.RESUME_EXTENSION`):
  every object's metadata has a cursor; sent back in the cursor header, the
  stream continues after it from the hot tier or the replay log, on any edge.
  A cursor inside one event's objects (``<seq>.<k>``) replays that event and
  skips the objects already seen.
* **Ends** after the terminal status. A client that fell so far behind that
  Koder agent stream §4 R4 dropped a delta for it would no longer be exact: its
  stream ends with an error instead, and it resubscribes with its cursor.
* **Keepalive**: an SSE comment after :data:`KEEPALIVE_S` of silence (the
  SDK's client times out a read after 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.types import Receive, Scope, Send

from ...core import limits
from ...core.errors import RunNotPublished
from ...protocols.a2a import INPUT_REQUIRED, RESUME_EXTENSION, TERMINAL_TASK_STATES, A2AEgress
from ..fanout.clients import ClientQueue
from ..fanout.feed import FeedKey
from ..fanout.frames import Frame
from ..fanout.session import RunEnded, Sink, StreamRequest, StreamSession
from ..fanout.transports import http_watcher, run_session
from ..service.context import Edge
from .errors import A2AFault
from .methods import view_of

KEEPALIVE_S = 2.0
_json = msgspec.json.Encoder()


class Framing(msgspec.Struct, frozen=True):
    """How one binding wraps a ``StreamResponse`` (JSON-RPC: its request's id)."""

    jsonrpc_id: Any = None
    jsonrpc: bool = False

    def wrap(self, payload: bytes) -> bytes:
        if not self.jsonrpc:
            return payload
        return b'{"jsonrpc":"2.0","id":' + _json.encode(self.jsonrpc_id) + b',"result":' + payload + b"}"

    def fault(self, fault: A2AFault) -> bytes:
        return _json.encode(fault.jsonrpc(self.jsonrpc_id) if self.jsonrpc else fault.rest())


class Behind(Exception):
    """R4 dropped a frame for this client: the stream would no longer be exact."""


class TaskSink(Sink):
    """SSE ``data:`` events of ``StreamResponse`` objects; an initial Task when the session sends none."""

    format_name = "a2a"

    def __init__(self, send: Send, framing: Framing, initial: dict[str, Any], *, extension: bool,
                 skip: tuple[int, int] | None) -> None:
        self._send = send
        self.framing = framing
        self.initial = initial
        self.extension = extension
        self.skip = skip
        self.started = False
        self.sent_task = False
        self.session: StreamSession | None = None

    async def begin(self) -> None:
        if self.started:
            return
        self.started = True
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]
        if self.extension:
            headers.append((b"a2a-extensions", RESUME_EXTENSION.encode()))
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def send(self, frames: list[Frame]) -> None:
        if self.session is not None and self.session.client.dropped:
            raise Behind()
        out: list[bytes] = []
        for frame in frames:
            for index, payload in enumerate(frame.payloads):
                if not self.sent_task:
                    self.sent_task = True
                    if not (frame.seq is None and payload.startswith(b'{"task"')):
                        out.append(self._event(_json.encode({"task": self.initial})))
                if self.skip is not None and frame.seq == self.skip[0] and index <= self.skip[1]:
                    continue
                out.append(self._event(payload))
        if out:
            await self._write(b"".join(out))

    async def keepalive(self) -> None:
        await self._write(b": keepalive\n\n")

    async def task_only(self, task: dict[str, Any]) -> None:
        """The task as it is, and the end (a finished task resumed at its end)."""
        await self.begin()
        await self._write(self._event(_json.encode({"task": task})))

    async def error(self, fault: A2AFault) -> None:
        await self.begin()
        await self._write(b"event: error\ndata: " + self.framing.fault(fault) + b"\n\n")

    async def finish(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def _event(self, payload: bytes) -> bytes:
        return b"data: " + self.framing.wrap(payload) + b"\n\n"

    async def _write(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})


def empty_task(run_id: str, context_id: str | None) -> dict[str, Any]:
    """The task before its first event (``TASK_STATE_SUBMITTED``)."""
    encoder = A2AEgress()
    encoder.task_id, encoder.context_id = run_id, context_id
    return encoder.task()


async def serve_task_stream(
    edge: Edge, stream: StreamRequest, scope: Scope, receive: Receive, send: Send, *, framing: Framing,
    context_id: str | None, extension: bool, skip: tuple[int, int] | None,
    finished_task: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> None:
    """Stream the run to the client until its terminal status, it leaves, or it must be cut off.

    ``finished_task``: what a cursor at the end of a finished run gets (the extension's resume);
    without it, such a subscription is refused (UnsupportedOperationError, before any byte).
    """
    sink = TaskSink(send, framing, empty_task(stream.run_id, context_id), extension=extension, skip=skip)
    session = StreamSession(edge.hub, stream, sink)
    session.client.keepalive_s = KEEPALIVE_S
    sink.session = session
    fault: A2AFault | None = None
    try:
        final, gone, refused = await run_session(edge.hub, session, http_watcher(scope, receive))
    except Behind:
        final, gone, refused = None, False, None
        fault = A2AFault("INTERNAL_ERROR", "the client fell behind and responses were dropped; "
                                           "resubscribe with the resume cursor of the last one received")
    if gone:
        return
    timeout = edge.settings.write_timeout_s
    with contextlib.suppress(TimeoutError, OSError):
        if isinstance(refused, RunEnded):
            if finished_task is None:
                fault = A2AFault("UNSUPPORTED_OPERATION",
                                 f"task {stream.run_id} is in a terminal state: {refused.state}")
                if not sink.started:
                    await _refuse(send, framing, fault)
                    return
            else:
                await asyncio.wait_for(sink.task_only(await finished_task()), timeout)
                fault = None
        elif isinstance(refused, RunNotPublished):
            fault = A2AFault("TASK_NOT_FOUND", str(refused))
        elif final is not None:
            message = msgspec.json.decode(final.payloads[0]).get("message", "the stream was cut short")
            fault = A2AFault("INTERNAL_ERROR", message)
        if fault is not None:
            await asyncio.wait_for(sink.error(fault), timeout)
        await sink.begin()
        await asyncio.wait_for(sink.finish(), timeout)


async def _refuse(send: Send, framing: Framing, fault: A2AFault) -> None:
    """An A2A error instead of a stream (nothing was sent yet)."""
    body = framing.fault(fault)
    status = 200 if framing.jsonrpc else fault.http_status
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def settled_task(edge: Edge, run_id: str, context_id: str | None, after: int, history_length: int | None,
                       wait_s: float) -> dict[str, Any]:
    """A blocking ``SendMessage``'s answer: the task once it ends, or asks for input after seq
    ``after``, or after ``wait_s`` as it then stands (bounded as ``GetTask``'s).

    It watches the run's feed in the hub, as a subscriber does: the edge reads each event once for
    every client of the run, and this wait only looks at the feed's task when a frame comes — the
    run is not read again while it waits.
    """
    feed = await edge.hub.feed(FeedKey(run_id, view_of(edge), "a2a", "default", "flatten"))
    def queue() -> ClientQueue:
        return ClientQueue(max_frames=edge.settings.client_queue_events, max_bytes=edge.settings.client_queue_bytes)

    client = queue()
    edge.hub.attach(feed, client)
    try:
        encoder = feed.encoder
        assert isinstance(encoder, A2AEgress)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not _settled(encoder, after) and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.wait(), left)
            client.take()  # the frames themselves are not needed: the feed's task is
            if client.overflowed:  # a burst past its queue: a fresh one (an overflowed queue never waits)
                fresh = queue()
                edge.hub.attach(feed, fresh)
                edge.hub.detach(feed, client)
                client = fresh
        task = encoder.task(history_length, max_bytes=limits.TASK_BYTES)
    finally:
        edge.hub.detach(feed, client)
    task["id"] = run_id  # (a task its agent has not started yet)
    if context_id:
        task.setdefault("contextId", context_id)
    return task


def _settled(encoder: A2AEgress, after: int) -> bool:
    """Ended, or asking for input since ``after`` (asked again after an answer)."""
    return encoder.state in TERMINAL_TASK_STATES or (encoder.state == INPUT_REQUIRED and encoder.position > after)
