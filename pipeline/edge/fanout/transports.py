"""SSE, NDJSON and WebSocket: how frames reach a client, and how a stream ends.

Streaming HTTP is served as a plain ASGI callable rather than a
``StreamingResponse``: it sends pre-rendered bytes (see ``frames.py``) and
learns that its client left from the server's ``runwire.disconnect``
extension (the edge's uvicorn protocol, ``edge/http/server.py``: nothing per
client but a callback), or where a server lacks it by watching for
``http.disconnect`` with one small task per client. A client
closing its connection is a disconnect (``KAI-STREAM-CONN-0001`` in the
metrics), never a cancel of the run: cancelling is a control command, and closing a tab must not stop the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from ...core.errors import (
    CONN_DISCONNECTED,
    REQ_BAD_PARAMETER,
    QuotaExceeded,
    ReplayExpired,
    RunNotPublished,
    RunwireError,
)
from .frames import Batch, Frame, error_frame
from .hub import Hub
from .session import (
    Overflowed,
    RunEnded,
    Sink,
    StreamRequest,
    StreamSession,
    expired_frame,
    overflow_frame,
)

SUBPROTOCOL = "koder-agent-stream-v1"
SSE_MEDIA_TYPE = "text/event-stream"
NDJSON_MEDIA_TYPE = "application/x-ndjson"
WS_CLOSE_ENDED = 1000
WS_CLOSE_BUF = 1013
"""BUF-0001: try again (resume) later."""
WS_CLOSE_EXPIRED = 4002
"""CONN-0002: the cursor is older than retention."""
WS_CLOSE_NOT_PUBLISHED = 4404
"""CONN-0003: nobody published the run within the edge's wait."""
CLOSE_POLICY = 1008
"""Policy violation (RFC 6455 §7.4.1): a token over its quota, a socket over its request limit, a bad frame."""

_AI_SDK_DONE = b"data: [DONE]\n\n"
_SSE_KEEPALIVE = b": keepalive\n\n"
_NDJSON_KEEPALIVE = b"\n"


class HttpSink(Sink):
    """SSE (``text/event-stream``) or NDJSON over one HTTP response."""

    def __init__(
        self, send: Send, *, sse: bool, format_name: str, headers: dict[str, str],
        write: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._send = send
        self._write = write
        """The server's :data:`WRITE_EXTENSION` writer, when it has one."""
        self.writes_now = write is not None
        self.sse = sse
        self.format_name = format_name
        self.headers = headers
        self.started = False

    async def begin(self) -> None:
        if self.started:
            return
        self.started = True
        media = SSE_MEDIA_TYPE if self.sse else NDJSON_MEDIA_TYPE
        headers = {
            "content-type": media + ("; charset=utf-8" if self.sse else ""),
            "cache-control": "no-cache, no-transform",
            "x-accel-buffering": "no",
            **self.headers,
        }
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await self._send({"type": "http.response.start", "status": 200, "headers": raw})
        if self.sse:
            # Reconnect after 1 s (EventSource's default is about 3 s) and resend Last-Event-ID.
            await self._send({"type": "http.response.body", "body": b"retry: 1000\n\n", "more_body": True})

    async def send(self, frames: list[Frame]) -> None:
        if self.sse:
            body = b"".join(frame.sse() for frame in frames)
            if self.format_name == "ai-sdk" and frames[-1].terminal:
                body += _AI_SDK_DONE
        else:
            body = b"".join(frame.ndjson() for frame in frames)
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    def write_now(self, batch: Batch) -> bool:
        """Live frames (none terminal) written without an ASGI ``send``, if the server can now:
        the batch's bytes, the same object for every client of its feed."""
        write = self._write
        if write is None:
            return False
        return write(batch.sse() if self.sse else batch.ndjson())

    async def keepalive(self) -> None:
        await self._send({"type": "http.response.body", "body": self._keepalive(), "more_body": True})

    def keepalive_now(self) -> bool:
        write = self._write
        return write is not None and write(self._keepalive())

    def _keepalive(self) -> bytes:
        return _SSE_KEEPALIVE if self.sse else _NDJSON_KEEPALIVE

    async def finish(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def refuse(self, status: int, body: bytes, media_type: str) -> None:
        """Answer without a stream (the response has not started)."""
        headers = [(b"cache-control", b"no-store")]
        if body:
            headers += [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class WebSocketSink(Sink):
    """Text frames only (Koder agent stream §5.2): one WebSocket message per format frame."""

    def __init__(self, websocket: WebSocket, format_name: str) -> None:
        self.websocket = websocket
        self.format_name = format_name

    async def send(self, frames: list[Frame]) -> None:
        for frame in frames:
            for payload in frame.payloads:
                await self.websocket.send_text(payload.decode())

    async def keepalive(self) -> None:
        """WebSocket keeps itself alive with protocol pings (the server sends them)."""


DISCONNECT_EXTENSION = "runwire.disconnect"
"""The ASGI scope extension by which a server tells a stream that its client left:
``{"register": f}``, ``f(callback)`` having ``callback()`` called once if the connection is lost
before the response completed (at once if it already was)."""

WRITE_EXTENSION = "runwire.write"
"""The ASGI scope extension by which a server lets a stream write body bytes without a ``send``:
``{"write": f}``, ``f(body)`` writing one chunk of the started response at once and returning True,
or writing nothing and returning False when it can't now (the stream then sends it)."""

Watcher = Callable[["_Disconnect"], Coroutine[Any, Any, None] | None]
"""How a session learns its client left: a coroutine to run as a task until it did, or None
when a callback was registered instead."""


async def watch_http(receive: Receive, on_gone: Callable[[], None]) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            on_gone()
            return


def http_watcher(scope: Scope, receive: Receive) -> Watcher:
    """The server's :data:`DISCONNECT_EXTENSION` where it has one (no task per client), else a
    task reading ``receive`` until ``http.disconnect``."""
    register: Watcher | None = ((scope.get("extensions") or {}).get(DISCONNECT_EXTENSION) or {}).get("register")
    if register is None:
        return lambda gone: watch_http(receive, gone)
    return register  # it returns None: nothing to run


async def _watch_ws(websocket: WebSocket, on_gone: Callable[[], None]) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
    on_gone()


class _Disconnect:
    """Cancels the serving task when the client goes away, and remembers that it did."""

    def __init__(self) -> None:
        self.gone = False
        self.task = asyncio.current_task()

    def __call__(self) -> None:
        self.gone = True
        if self.task is not None:
            self.task.cancel()


Outcome = tuple[Frame | None, bool, RunEnded | RunNotPublished | None]
"""(final error frame or None, whether the client is gone, why it was not streamed at all)."""


async def run_session(hub: Hub, session: StreamSession, watcher: Watcher) -> Outcome:
    disconnect = _Disconnect()
    watching = watcher(disconnect)
    watch = asyncio.create_task(watching) if watching is not None else None
    final: Frame | None = None
    refused: RunEnded | RunNotPublished | None = None
    try:
        await session.run()
    except asyncio.CancelledError:
        if not disconnect.gone:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        hub.metrics.disconnects.labels(CONN_DISCONNECTED).inc()
    except Overflowed:
        final = overflow_frame()
        hub.metrics.disconnects.labels(Overflowed.code).inc()
    except ReplayExpired as exc:
        final = expired_frame(exc)
        hub.metrics.disconnects.labels(exc.code or "").inc()
    except RunNotPublished as exc:
        refused = exc
        hub.metrics.disconnects.labels(exc.code or "").inc()
    except RunEnded as exc:
        refused = exc
    finally:
        disconnect.task = None  # a callback still registered cancels nothing after this
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    return final, disconnect.gone, refused


async def serve_http_stream(
    hub: Hub, request: StreamRequest, scope: Scope, receive: Receive, send: Send, *, sse: bool,
    headers: dict[str, str],
) -> None:
    """Serve one SSE or NDJSON client until the run ends, it leaves, or it must be cut off.

    A cursor at or past the end of a finished run gets ``204 No Content`` on
    SSE (the HTML standard's way to stop ``EventSource`` reconnecting) and one
    ``{"type": "end", …}`` line on NDJSON; a run nobody published within the
    wait gets an error frame ``KAI-STREAM-RUN-0003`` and the end.
    """
    write = ((scope.get("extensions") or {}).get(WRITE_EXTENSION) or {}).get("write")
    sink = HttpSink(send, sse=sse, format_name=request.format, headers=headers, write=write)
    session = StreamSession(hub, request, sink)
    final, gone, refused = await run_session(hub, session, http_watcher(scope, receive))
    if gone:
        return
    timeout = hub.settings.write_timeout_s
    with contextlib.suppress(TimeoutError, OSError):
        if isinstance(refused, RunEnded) and not sink.started:
            if sse:
                await asyncio.wait_for(sink.refuse(204, b"", ""), timeout)
            else:
                await asyncio.wait_for(sink.refuse(200, refused.frame().ndjson(), NDJSON_MEDIA_TYPE), timeout)
            return
        await sink.begin()
        if refused is not None:
            final = _final(refused, sse)
        if final is not None:
            await asyncio.wait_for(sink.send([final]), timeout)
        await asyncio.wait_for(sink.finish(), timeout)


def _final(why: RunEnded | RunNotPublished, sse: bool) -> Frame | None:
    """The last frame of a stream that was refused after it started."""
    if isinstance(why, RunNotPublished):
        return error_frame(why.code or "", str(why))
    return None if sse else why.frame()


async def serve_websocket(hub: Hub, websocket: WebSocket, request: StreamRequest) -> None:
    """Serve one WebSocket client (subprotocol ``koder-agent-stream-v1``)."""
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    session = StreamSession(hub, request, WebSocketSink(websocket, request.format))
    final, gone, refused = await run_session(hub, session, lambda d: _watch_ws(websocket, d))
    if gone:
        return
    code = WS_CLOSE_ENDED
    if refused is not None:
        final = _final(refused, sse=False)
        code = WS_CLOSE_NOT_PUBLISHED if isinstance(refused, RunNotPublished) else WS_CLOSE_ENDED
    elif final is not None:
        code = WS_CLOSE_BUF if final.payloads[0].find(b"BUF-0001") >= 0 else WS_CLOSE_EXPIRED
    timeout = hub.settings.write_timeout_s
    with contextlib.suppress(TimeoutError, OSError, RuntimeError, WebSocketDisconnect):
        if final is not None:
            await asyncio.wait_for(websocket.send_text(final.payloads[0].decode()), timeout)
        await asyncio.wait_for(websocket.close(code=code), timeout)


def http_status(exc: RunwireError) -> int:
    """The HTTP status of a refusal (a refused WebSocket closes with 4000 + it): the error's own
    (:mod:`runwire.core.errors` has the table)."""
    return exc.status


async def refuse_websocket(websocket: WebSocket, exc: RunwireError) -> None:
    """Refuse a WebSocket the way a browser can see: accept, send an error frame, close with a code.

    A refusal before the handshake is a bare HTTP 403 that the WebSocket API
    hides from scripts. The close code is 4000 + the HTTP status the same
    refusal gets over HTTP (4400 bad parameter, 4401 no valid token, 4403
    missing scope, 4404 no such run) — but 1008 (policy violation) for a token
    over its quota; the reason is the ``KAI-STREAM-*``
    code and message, cut to the 123 bytes a close frame allows.
    """
    code = exc.code or REQ_BAD_PARAMETER
    message = str(exc)
    offered = websocket.scope.get("subprotocols") or []
    reason = f"{code}: {message}"
    with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect):
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await websocket.send_json({"type": "error", "code": code, "message": message})
        close = CLOSE_POLICY if isinstance(exc, QuotaExceeded) else 4000 + http_status(exc)
        await websocket.close(code=close, reason=reason.encode()[:123].decode(errors="ignore"))
