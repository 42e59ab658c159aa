"""One attempt of one delivery: a signed POST, bounded in every direction.

httpcore (httpx's transport, without its client) over :class:`GuardedBackend`:
no redirect is followed (a 3xx is a failed attempt), the response body is read
to at most :data:`RESPONSE_BYTES` and dropped (only the status matters), and an
attempt ends after :data:`ATTEMPT_S` whatever the receiver does — a receiver
that trickles its answer byte by byte holds one of the deliverer's slots for
that long, never more, and never anything of the worker's.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import httpcore

from ..store.outbox import Delivery
from .signing import signed_headers
from .targets import GuardedBackend, TargetRefused

ATTEMPT_S = 15.0
"""The most one attempt may take, from connecting to the last byte read."""
CONNECT_S = 5.0
RESPONSE_BYTES = 64 * 1024
"""The most of a response body read (then the connection is closed)."""
USER_AGENT = "runwire-webhooks/1"


class Sender:
    """Sends deliveries; one connection pool (``max_connections`` at once) shared by all."""

    def __init__(self, *, allow_private: bool = False, max_connections: int = 64,
                 attempt_s: float = ATTEMPT_S) -> None:
        self.attempt_s = attempt_s
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(), max_connections=max_connections,
            max_keepalive_connections=max_connections, keepalive_expiry=30.0, retries=0,
            network_backend=GuardedBackend(allow_private=allow_private),
        )

    async def send(self, delivery: Delivery) -> tuple[str | None, bool]:
        """Attempt ``delivery`` once, signed now: ``(error, final)`` — ``(None, False)`` when the
        receiver answered 2xx; ``final`` when no retry can succeed (a refused target)."""
        body = delivery.body
        headers = {"content-type": "application/json", "user-agent": USER_AGENT, **delivery.headers,
                   **signed_headers(delivery.secrets, delivery.id, int(time.time()), body)}
        timeouts = {"connect": CONNECT_S, "read": self.attempt_s, "write": self.attempt_s, "pool": self.attempt_s}
        try:
            async with asyncio.timeout(self.attempt_s):
                async with self._pool.stream("POST", delivery.url, headers=list(headers.items()), content=body,
                                             extensions={"timeout": timeouts}) as response:
                    await _drain(response)
                    status = response.status
        except TargetRefused as exc:
            return str(exc), True
        except TimeoutError:
            return f"no answer within {self.attempt_s:g} s", False
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
                ssl.SSLError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:500], False
        if 200 <= status < 300:
            return None, False
        if 300 <= status < 400:
            return f"HTTP {status}: redirects are not followed", False
        return f"HTTP {status}", False

    async def aclose(self) -> None:
        await self._pool.aclose()


async def _drain(response: httpcore.Response) -> None:
    """Read at most :data:`RESPONSE_BYTES` of the body (the rest is never read: closing the
    response closes its connection)."""
    read = 0
    async for chunk in response.aiter_stream():
        read += len(chunk)
        if read >= RESPONSE_BYTES:
            return
