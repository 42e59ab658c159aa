"""Quotas per token: no caller holds more of an edge than its share.

A token (counted by :attr:`~.auth.Principal.token_id`, a digest, never the token)
may hold at most ``streams_per_token`` streams open at once on one edge
process — SSE, NDJSON, WebSocket, Durable Streams reads, gRPC streams and
chat responses alike, including streams still waiting for a run nobody has
published yet. One chat socket may carry at most ``requests_per_socket``
responses at once (:mod:`.chat`). Over quota the caller gets
:class:`~runwire.core.errors.QuotaExceeded` (429 with ``Retry-After``, WebSocket
close 1008, gRPC ``RESOURCE_EXHAUSTED``) and nobody else notices.

With auth off (no secret: loopback only) there are no tokens and no quotas.
The counts are held only while streams are open, so their size is bounded by
the live clients. ``docs/security.md`` § Quotas lists the defaults.
"""

from __future__ import annotations

from types import TracebackType

from ..core.errors import QuotaExceeded


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
