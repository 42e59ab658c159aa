"""``WS /v1/threads``: the AI SDK's ``WebSocketChatTransport`` protocol, served from runwire.

One socket carries many requests, each named by the client's ``requestId``
(the protocol as ``ai``'s ``websocket-chat-transport.ts`` defines it):

==============  ===========================================================
client frame    what the edge does
==============  ===========================================================
``resume``      the thread ``id``'s active run (see ``threads.py``):
                ``start``, then its chunks with ``sequence`` > ``lastSequence``
                (all of them without one), live until the run ends, ``end``;
                ``no-active`` when the thread has no active run
``send``        a new run for the thread: an :class:`AgentRequest` on the
                requests channel ``?agent=`` (``default``), then that run's
                chunks from ``sequence`` 0 and ``end``; an ``error`` frame at
                once when no agent consumes the channel, or a run of the
                thread is still active
``abort``       ``cancel`` on the request's run's control channel (a closed
                socket is a disconnect and cancels nothing)
==============  ===========================================================

**Limits.** A frame is at most :data:`runwire.core.limits.FRAME_BYTES` (close
1009 and ``KAI-STREAM-REQ-0002`` past it), nests at most
:data:`runwire.core.limits.DEPTH` levels and names ids of at most
:data:`runwire.core.limits.ID_CHARS` characters (close 1008 otherwise).
One socket streams at most ``requests_per_socket`` responses at
once: a ``send`` or ``resume`` past it closes the socket with 1008 and
``KAI-STREAM-REQ-0005``. Each response also holds one of the token's streams
(:mod:`.quotas`); over that quota the request gets an ``error`` frame.

**Sequences.** A chunk's ``sequence`` is its index among the AI SDK chunks
of the run's stream (same ``detail``/``profile``/``children``), from 0.
Egress codecs are deterministic, so every edge instance numbers a run's
chunks alike and a resume with ``lastSequence`` continues exactly, here or
on another instance. A chunk dropped for a slow client (Koder agent stream §4 R4) would break
that numbering, so instead the request gets an ``error`` frame and the
client resumes (``reconnectToStream`` replays from 0).

Auth: ``?access_token=`` at the handshake (browsers can't set headers on
WebSocket); ``resume`` needs ``read``, ``send`` the write rule of
:mod:`.authz` for the new run, ``abort`` ``control`` on the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any, Literal

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from ...bus.base import ControlCommand
from ...bus.requests import DEFAULT_CHANNEL, AgentRequest, consumer_alive, send_request
from ...core import limits
from ...core.envelope import now_ts
from ...core.errors import REQ_QUOTA, REQ_TOO_LARGE, RequestError, RunwireError
from ...core.ulid import new_event_id, new_random_ulid
from ..fanout.frames import Frame
from ..fanout.session import Overflowed, Sink, StreamSession
from ..fanout.transports import CLOSE_POLICY
from ..service.auth import Principal
from ..service.authz import authorize_write
from ..service.context import Edge
from ..service.params import check_depth
from ..service.quotas import Hold
from ..service.threads import active_run, chat_stream

_json = msgspec.json.Encoder()
CLOSE_INVALID = CLOSE_POLICY
CLOSE_TOO_BIG = 1009
"""RFC 6455 §7.4.1: a message too big to process (over :data:`runwire.core.limits.FRAME_BYTES`)."""


class ClientFrame(msgspec.Struct, kw_only=True, rename="camel"):
    """A client frame (``send`` / ``resume`` / ``abort``); the fields each type needs are checked."""

    type: Annotated[str, msgspec.Meta(max_length=32)]
    request_id: Annotated[str, msgspec.Meta(max_length=limits.ID_CHARS)]
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=limits.ID_CHARS)] | None = None
    last_sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = None
    messages: list[Any] = []
    headers: dict[str, str] = {}
    body: dict[str, Any] = {}
    metadata: Any = None


_frame = msgspec.json.Decoder(ClientFrame)


class ChunksDropped(Exception):
    """R4 dropped a chunk for this client: the sequence would no longer be the run's."""


class ChatSink(Sink):
    """Writes one request's frames as ``chunk`` frames numbered by their index in the run's stream."""

    format_name = "ai-sdk"

    def __init__(self, socket: ChatSocket, request_id: str, last_sequence: int) -> None:
        self.socket = socket
        self.prefix = b'{"type":"chunk","requestId":' + _json.encode(request_id) + b',"sequence":'
        self.last_sequence = last_sequence
        self.next = 0
        self.session: StreamSession | None = None

    async def send(self, frames: list[Frame]) -> None:
        if self.session is not None and self.session.client.dropped:
            raise ChunksDropped()
        out: list[bytes] = []
        for frame in frames:
            for payload in frame.payloads:
                if self.next > self.last_sequence:
                    out.append(self.prefix + b"%d" % self.next + b',"chunk":' + payload + b"}")
                self.next += 1
        await self.socket.write_many(out)

    async def keepalive(self) -> None:
        """WebSocket keeps itself alive with protocol pings."""


class ChatSocket:
    """One client's socket: its requests, each streamed by a task of its own."""

    def __init__(self, edge: Edge, websocket: WebSocket, principal: Principal | None) -> None:
        self.edge = edge
        self.websocket = websocket
        self.principal = principal
        self.query = dict(websocket.query_params)
        self.channel = self.query.get("agent") or DEFAULT_CHANNEL
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.runs: dict[str, str] = {}
        """requestId → the run it streams (what ``abort`` cancels)."""
        self._lock = asyncio.Lock()

    # ---- writing ---------------------------------------------------------
    async def write_many(self, frames: list[bytes]) -> None:
        async with self._lock:
            for frame in frames:
                await self.websocket.send_text(frame.decode())

    async def reply(self, request_id: str, type: str, **fields: Any) -> None:
        await self.write_many([_json.encode({"type": type, "requestId": request_id, **fields})])

    # ---- the socket ------------------------------------------------------
    async def serve(self) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("text") or message.get("bytes") or b""
                if len(data) > limits.FRAME_BYTES:
                    await self.websocket.close(code=CLOSE_TOO_BIG, reason=(
                        f"{REQ_TOO_LARGE}: a frame over {limits.FRAME_BYTES} bytes"))
                    return
                try:
                    frame = _frame.decode(data)
                    check_depth([frame.messages, frame.body, frame.metadata], "a chat frame")
                except (msgspec.ValidationError, msgspec.DecodeError, RequestError, RecursionError):
                    await self.websocket.close(code=CLOSE_INVALID, reason="Invalid frame")
                    return
                if self.over_limit(frame):
                    limit = self.edge.settings.requests_per_socket
                    await self.websocket.close(code=CLOSE_POLICY, reason=(
                        f"{REQ_QUOTA}: more than {limit} responses at once on one socket"))
                    return
                await self.handle(frame)
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client left: a disconnect, never a cancel of its runs
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def over_limit(self, frame: ClientFrame) -> bool:
        """Whether ``frame`` would start one response more than the socket may stream at once."""
        starts = frame.type in ("send", "resume") and frame.request_id not in self.tasks
        return starts and len(self.tasks) >= self.edge.settings.requests_per_socket

    async def handle(self, frame: ClientFrame) -> None:
        try:
            if frame.type == "abort":
                await self.abort(frame.request_id)
            elif frame.id is None:
                await self.reply(frame.request_id, "error", errorText=f"a {frame.type} frame needs the chat id")
            elif frame.type == "resume":
                await self.resume(frame)
            elif frame.type == "send":
                await self.send(frame)
            else:
                await self.reply(frame.request_id, "error", errorText=f"unknown request type {frame.type!r}")
        except RunwireError as exc:
            await self.reply(frame.request_id, "error", errorText=str(exc))

    async def resume(self, frame: ClientFrame) -> None:
        assert frame.id is not None
        self.edge.gate.require_scope(self.principal, "read")
        run = await active_run(self.edge, self.principal, frame.id)
        if run is None:
            await self.reply(frame.request_id, "no-active")
            return
        hold = self.hold()
        try:
            await self.reply(frame.request_id, "start")
        except BaseException:
            hold.release()
            raise
        last = -1 if frame.last_sequence is None else frame.last_sequence
        self.stream(frame.request_id, run.run_id, last, hold)

    async def send(self, frame: ClientFrame) -> None:
        assert frame.id is not None
        edge, principal = self.edge, self.principal
        run_id = new_random_ulid("run_")  # fresh randomness: not guessable from another chat's id
        await authorize_write(edge.gate, principal, run_id)
        if await active_run(edge, principal, frame.id) is not None:
            await self.reply(frame.request_id, "error", errorText="a response is already active for this chat")
            return
        if not await consumer_alive(edge.bus, self.channel):
            await self.reply(frame.request_id, "error", errorText=(
                f"no agent consumes requests on channel {self.channel!r} "
                f"(an agent runs `async for request in pub.requests({self.channel!r})`)"))
            return
        hold = self.hold()
        try:
            tenant = principal.tenant if principal else None
            if tenant is not None:
                await edge.gate.claim(run_id, tenant, run_id)
            await send_request(edge.bus, AgentRequest(
                id=new_event_id(), channel=self.channel, run_id=run_id, thread_id=frame.id, tenant=tenant,
                ts=now_ts(), trigger=frame.trigger, message_id=frame.message_id, messages=frame.messages,
                body=frame.body, metadata=frame.metadata,
            ))
        except BaseException:
            hold.release()
            raise
        self.stream(frame.request_id, run_id, -1, hold)

    async def abort(self, request_id: str) -> None:
        """The client stopped a response: cancel its run (the stream it had is closed already)."""
        run_id = self.runs.pop(request_id, None)
        task = self.tasks.pop(request_id, None)
        if task is not None:
            task.cancel()
        if run_id is None:
            return
        await self.edge.gate.check_run(self.principal, run_id, "control")
        await self.edge.bus.send_control(ControlCommand(
            command="cancel", run_id=run_id, id=new_event_id(), ts=now_ts(),
            args={"reason": "the client aborted the response"},
            by=self.principal.tenant if self.principal else None,
        ))

    # ---- one request's stream ----------------------------------------------
    def hold(self) -> Hold:
        """One of the token's streams (QuotaExceeded at its quota: the request gets an error frame)."""
        return self.edge.quotas.stream(self.principal.token_id if self.principal else "")

    def stream(self, request_id: str, run_id: str, last_sequence: int, hold: Hold) -> None:
        previous = self.tasks.pop(request_id, None)
        if previous is not None:
            previous.cancel()
        self.runs[request_id] = run_id
        task = asyncio.create_task(self._stream(request_id, run_id, last_sequence, hold), name="runwire-chat")
        self.tasks[request_id] = task

    async def _stream(self, request_id: str, run_id: str, last_sequence: int, hold: Hold) -> None:
        sink = ChatSink(self, request_id, last_sequence)
        session = StreamSession(self.edge.hub, chat_stream(self.edge, run_id, self.query), sink)
        sink.session = session
        error: str | None = None
        try:
            with hold:
                await session.run()
        except (ChunksDropped, Overflowed):
            error = "the client fell behind and chunks were dropped; resume the stream"
        except RunwireError as exc:
            error = str(exc)
        except (WebSocketDisconnect, RuntimeError, OSError):
            return
        finally:
            if self.tasks.get(request_id) is asyncio.current_task():
                del self.tasks[request_id]
                self.runs.pop(request_id, None)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            if error is None:
                await self.reply(request_id, "end")
            else:
                await self.reply(request_id, "error", errorText=error)


async def serve_chat(edge: Edge, websocket: WebSocket) -> None:
    """``WS /v1/threads``: accept (or refuse like every stream: 4401 and an error frame), then serve
    the socket until it closes."""
    principal = edge.gate.principal(websocket.headers, websocket.query_params)
    await websocket.accept()
    await ChatSocket(edge, websocket, principal).serve()
