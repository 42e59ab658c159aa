"""How the edge is served: uvicorn with a header-read deadline.

uvicorn (0.30–0.54) bounds the idle time *between* requests
(``timeout_keep_alive``) but not the time a client takes to send a
request's headers: a connection that sends nothing, or one header byte every
few seconds (slowloris), stays open forever and holds a socket and memory.
:func:`edge_config` serves with :class:`HeaderDeadlineProtocol`, uvicorn's
httptools protocol plus one timer: armed when the connection opens and after
each response, cancelled when a request's headers are complete (or the
connection is upgraded to a WebSocket); when it fires the connection is
closed. Streams are unaffected: the deadline covers the request head only.

It also makes an idle stream cheaper to hold (a client of a run's stream is idle nearly all its
life, and an edge holds tens of thousands; docs/edge.md § Performance):

* **No task per client to notice it left.** Each request's scope carries the ASGI extension
  ``runwire.disconnect``: ``{"register": f}``, where ``f(callback)`` has ``callback()`` called
  once if the client's connection is lost before the response completed (at once if it already
  was). The edge's streams register one instead of keeping a task blocked in ``receive()`` for
  ``http.disconnect`` (what a server without the extension still gets,
  :func:`runwire.edge.fanout.transports.http_watcher`): ~1.3 KB less per client.
* **No task switch per client write.** The scope also carries ``runwire.write``:
  ``{"write": f}``, where ``f(body)`` writes one chunk of the started response body at once and
  returns True, or writes nothing and returns False when it can't (client gone, transport over its
  high-water mark, response not chunked). The hub writes a live client's frames through it as it
  fans them out, instead of waking the client's task to make an ASGI ``send``
  (:meth:`runwire.edge.fanout.session.StreamSession.write_now`).
* **Lists, not deques.** uvicorn keeps two ``asyncio.Event`` per connection (its flow control's
  and the request cycle's) and a queue of pipelined requests; an ``Event`` holds its waiters in a
  ``collections.deque``, and an empty deque allocates a 64-slot block at once. The events are
  swapped for :class:`LightEvent` (the same class with its waiters in a list) and the queue for
  a list: ~1.8 KB less per connection.
* **Slots.** This class's own state is in slots: uvicorn's protocol has ~30 attributes, and
  CPython 3.11 stops sharing an instance dict's keys past 30 (~1.6 KB more a connection).

``bench/edge_memory.py`` measures it: Python's allocations per connected SSE client 14.6 →
11.7 KB (docs/benchmarks.md § Edge fan-out).
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...core import limits
from ..fanout.transports import DISCONNECT_EXTENSION, WRITE_EXTENSION

HEADER_TIMEOUT_S = 10.0
"""Default time a client has to send a request's line and headers."""
KEEP_ALIVE_S = 5
"""Idle time between two requests on one connection (uvicorn's ``timeout_keep_alive``)."""
MAX_HEADER_BYTES = 64 * 1024
"""Largest request head (``h11_max_incomplete_event_size``; httptools' own bound is 80 KiB)."""


class LightEvent(asyncio.Event):
    """An ``asyncio.Event`` whose waiters are a list, not a ``deque`` (an idle one: ~0.6 KB less).

    ``Event`` only appends, removes and iterates its waiters, which a list does alike."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[Any]] = []  # type: ignore[assignment]


class _Pipeline(list[Any]):
    """uvicorn's queue of a connection's pipelined requests as a list (uvicorn only appends to its
    left, pops and tests it): they are rare, and an empty ``deque`` holds a 64-slot block."""

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


def _lighten(holder: Any, name: str) -> None:
    """Swap ``holder.name``, an idle ``asyncio.Event``, for a :class:`LightEvent` in the same state
    (left as it is if uvicorn ever holds something else there)."""
    event = getattr(holder, name, None)
    if type(event) is asyncio.Event and not event._waiters:
        light = LightEvent()
        if event.is_set():
            light.set()
        setattr(holder, name, light)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head is not in by the
    deadline, with the ``runwire.disconnect`` extension and lighter events (see the module docs)."""

    __slots__ = ("_deadline", "_gone")
    header_timeout_s: float = HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._gone: tuple[Any, Callable[[], None]] | None = None
        """The request cycle whose client a callback waits on, and the callback."""
        super().__init__(*args, **kwargs)
        if type(self.pipeline) is collections.deque and not self.pipeline:
            self.pipeline = _Pipeline()  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _lighten(self.flow, "_is_writable_event")
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:  # a request (not a WebSocket upgrade)
            _lighten(cycle, "message_event")
            # one dict serves both extensions (each reads its own key): a dict less per client
            hooks: dict[object, object] = {"register": functools.partial(self._on_gone, cycle),
                                           "write": functools.partial(_write_body, cycle)}
            extensions = cycle.scope.setdefault("extensions", {})
            extensions[DISCONNECT_EXTENSION] = extensions[WRITE_EXTENSION] = hooks

    def _on_gone(self, cycle: Any, callback: Callable[[], None]) -> None:
        if cycle.disconnected:  # lost before the app asked: it learns at once
            callback()
            return
        self._gone = (cycle, callback)

    def on_response_complete(self) -> None:
        self._gone = None
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        gone, self._gone = self._gone, None
        super().connection_lost(exc)
        if gone is not None and gone[0].disconnected:  # uvicorn's own mark: lost before the response ended
            gone[1]()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


_LAST_CHUNK: list[object] = [object(), b""]
"""The last body :func:`_write_body` framed, and its chunk: a fan-out writes one body object to
every client of a feed, so it is framed once, not once per client (holds one body alive)."""


def _write_body(cycle: Any, body: bytes) -> bool:
    """Write one chunk of a started, chunked response body now, as ``send`` would; False (nothing
    written) when the client is gone, the response is not streaming, or the transport's buffer is
    over its high-water mark (the app then sends it the ASGI way, which waits for the drain)."""
    if (cycle.disconnected or cycle.flow.write_paused or not cycle.response_started
            or cycle.response_complete or cycle.chunked_encoding is not True):
        return False
    if not body:  # as send: nothing to write (an empty chunk would end the response)
        return True
    last = _LAST_CHUNK
    if last[0] is body:
        chunk = last[1]
    else:
        chunk = b"%x\r\n%s\r\n" % (len(body), body)
        last[0], last[1] = body, chunk
    cycle.transport.write(chunk)
    return True


def header_deadline_protocol(seconds: float) -> type[HeaderDeadlineProtocol]:
    """:class:`HeaderDeadlineProtocol` with its own deadline (uvicorn takes a class, not an instance)."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": seconds})


def edge_config(app: Any, *, header_timeout_s: float = HEADER_TIMEOUT_S, **options: Any) -> uvicorn.Config:
    """A uvicorn config for the edge: the header deadline, keep-alive and head-size bounds, then ``options``."""
    defaults: dict[str, Any] = {
        "http": header_deadline_protocol(header_timeout_s),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        # a WebSocket message is one frame of runwire.core.limits (1 MiB; the chat socket closes past it
        # with 1009 and KAI-STREAM-REQ-0002); uvicorn's own cap (16 MiB by default) stops the rest
        "ws_max_size": 2 * limits.FRAME_BYTES,
    }
    return uvicorn.Config(app, **{**defaults, **options})
