"""Quotas per token: no caller holds more of an edge than its share.

A token (counted by :attr:`~.auth.Principal.token_id`, a digest, never the token)
may hold at most ``streams_per_token`` streams open at once on one edge
process — SSE, NDJSON, WebSocket, Durable Streams reads, gRPC streams and
chat responses alike, including streams still waiting for a run nobody has
published yet. One chat socket may carry at most ``requests_per_socket``
responses at once (:mod:`.chat`). Over quota the caller gets
:class:`~runwire.core.errors.QuotaExceeded` (429 with ``Retry-After``, WebSocket
close 1008, gRPC ``RESOURCE_EXHAUSTED``) and nobody else notices.

:class:`Throttle` bounds how often a request may be made, per key (``POST
/v1/webhooks/{id}/test``: per webhook and per tenant, :data:`WEBHOOK_TESTS`).

With auth off (no secret: loopback only) there are no tokens and no stream quotas.
The counts are held only while streams are open, so their size is bounded by
the live clients. ``docs/security.md`` § Quotas lists the defaults.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from ...core.errors import QuotaExceeded


class Quotas:
    """Open streams per token, for one edge process."""

    def __init__(self, streams_per_token: int) -> None:
        self.streams_per_token = streams_per_token
        self._streams: dict[str, int] = {}

    def streams_of(self, token_id: str) -> int:
        return self._streams.get(token_id, 0)

    def stream(self, token: str) -> Hold:
        """Take one of ``token``'s streams now (raises QuotaExceeded at the quota); release on exit.

        ``token`` is a :attr:`Principal.token_id` (a :attr:`StreamRequest.holder`); "" holds nothing.
        """
        if token:
            held = self._streams.get(token, 0)
            if held >= self.streams_per_token:
                raise QuotaExceeded(
                    f"this token already holds {held} open streams, its quota on this edge; "
                    "close one or retry later"
                )
            self._streams[token] = held + 1
        return Hold(self, token)

    def _release(self, token: str) -> None:
        held = self._streams.get(token, 0) - 1
        if held > 0:
            self._streams[token] = held
        else:
            self._streams.pop(token, None)


class Hold:
    """One stream taken from a token's quota; given back once, on exit."""

    __slots__ = ("_quotas", "_token")

    def __init__(self, quotas: Quotas, token: str) -> None:
        self._quotas: Quotas | None = quotas
        self._token = token

    def release(self) -> None:
        if self._quotas is not None and self._token:
            self._quotas._release(self._token)
        self._quotas = None

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


WEBHOOK_TESTS: Mapping[str, tuple[int, float]] = {"webhook": (3, 20.0), "tenant": (10, 6.0)}
"""Test deliveries one edge queues: per webhook 3 at once then one every 20 s, per tenant 10 at
once then one every 6 s (a webhook's URL is the tenant's to choose: tests are no way to flood it)."""


class Throttle:
    """A token bucket per key of each kind (``kind → (burst, every_s)``): ``burst`` at once, one
    more every ``every_s``; for one edge process. Buckets that have filled up again are forgotten
    once there are more than ``keys``, so their number stays bounded."""

    def __init__(self, kinds: Mapping[str, tuple[int, float]], *, keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kinds = dict(kinds)
        self.keys = keys
        self.clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}

    def _tokens(self, kind: str, key: str, now: float) -> float:
        burst, every_s = self.kinds[kind]
        tokens, at = self._buckets.get((kind, key), (float(burst), now))
        return min(float(burst), tokens + (now - at) / every_s)

    def take(self, what: str, **keys: str) -> None:
        """One action for each ``kind=key``, or none and QuotaExceeded (429, ``Retry-After`` the
        seconds until every bucket has one again) when any bucket is empty."""
        now = self.clock()
        tokens = {kind: self._tokens(kind, key, now) for kind, key in keys.items()}
        short = {kind: (1.0 - left) * self.kinds[kind][1] for kind, left in tokens.items() if left < 1.0}
        if short:
            kind, wait_s = max(short.items(), key=lambda item: item[1])
            burst, every_s = self.kinds[kind]
            raise QuotaExceeded(f"{what}: at most {burst} per {kind} at once, then one every {every_s:g} s;"
                                f" retry in {math.ceil(wait_s)} s", retry_after_s=max(1, math.ceil(wait_s)))
        for kind, key in keys.items():
            self._buckets[(kind, key)] = (tokens[kind] - 1.0, now)
        if len(self._buckets) > self.keys:
            full = [k for k in self._buckets if self._tokens(k[0], k[1], now) >= self.kinds[k[0]][0]]
            for k in full:
                del self._buckets[k]
