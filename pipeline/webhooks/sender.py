"""One attempt of one delivery: a signed POST, bounded in every direction.

aiohttp's client over :class:`~.targets.GuardedResolver` (an IP literal is
checked here, as aiohttp does not resolve one): no redirect is followed (a 3xx
is a failed attempt), no proxy from the environment is used (it would reach
what the guard refuses), the response body is read to at most
:data:`RESPONSE_BYTES` and dropped (only the status matters; an unread rest
closes the connection), and an attempt ends after :data:`ATTEMPT_S` whatever
the receiver does — a receiver that trickles its answer byte by byte holds one
of the deliverer's slots for that long, never more, and never anything of the
worker's. aiohttp rather than httpx's transport: ``bench/webhooks.py``
measured httpcore's pool at 1.5–9 ms of CPU per delivery (its pool scans every
connection for every queued request) against ~0.4 ms here.
"""

from __future__ import annotations

import time

import aiohttp

from ..store.outbox import Delivery
from .signing import signed_headers
from .targets import GuardedResolver, TargetRefused, ip_literal, refusal, refused, split_url

ATTEMPT_S = 15.0
"""The most one attempt may take, from connecting to the last byte read."""
CONNECT_S = 5.0
RESPONSE_BYTES = 64 * 1024
"""The most of a response body read (then the connection is closed)."""
USER_AGENT = "runwire-webhooks/1"


class Sender:
    """Sends deliveries; one connection pool (``max_connections`` at once) shared by all, made in
    the event loop of the first attempt."""

    def __init__(self, *, allow_private: bool = False, max_connections: int = 64,
                 attempt_s: float = ATTEMPT_S) -> None:
        self.allow_private = allow_private
        self.max_connections = max_connections
        self.attempt_s = attempt_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                             resolver=GuardedResolver(allow_private=self.allow_private))
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self.attempt_s, sock_connect=CONNECT_S))
        return self._session

    def _refused(self, url: str) -> str | None:
        """Why ``url`` is refused before any connection (its form, an IP literal's address)."""
        try:
            host, _ = split_url(url)
        except TargetRefused as exc:
            return str(exc)
        literal = ip_literal(host)
        reason = None if literal is None or self.allow_private else refusal(literal)
        return None if reason is None else str(refused(host, reason))

    async def send(self, delivery: Delivery) -> tuple[str | None, bool]:
        """Attempt ``delivery`` once, signed now: ``(error, final)`` — ``(None, False)`` when the
        receiver answered 2xx; ``final`` when no retry can succeed (a refused target)."""
        refusing = self._refused(delivery.url)
        if refusing is not None:
            return refusing, True
        body = delivery.body
        headers = {"content-type": "application/json", "user-agent": USER_AGENT, **delivery.headers,
                   **signed_headers(delivery.secrets, delivery.id, int(time.time()), body)}
        try:
            async with self._client().post(delivery.url, data=body, headers=headers,
                                           allow_redirects=False) as response:
                await response.content.read(RESPONSE_BYTES)
                status = response.status
        except TargetRefused as exc:
            return str(exc), True
        except TimeoutError:
            return f"no answer within {self.attempt_s:g} s", False
        except (aiohttp.ClientError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:500], False
        if 200 <= status < 300:
            return None, False
        if 300 <= status < 400:
            return f"HTTP {status}: redirects are not followed", False
        return f"HTTP {status}", False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
