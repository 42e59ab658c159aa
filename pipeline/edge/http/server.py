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
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...core import limits

HEADER_TIMEOUT_S = 10.0
"""Default time a client has to send a request's line and headers."""
KEEP_ALIVE_S = 5
"""Idle time between two requests on one connection (uvicorn's ``timeout_keep_alive``)."""
MAX_HEADER_BYTES = 64 * 1024
"""Largest request head (``h11_max_incomplete_event_size``; httptools' own bound is 80 KiB)."""


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head is not in by the deadline."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
