"""``http://`` and ``https://``: the publisher SDK over an edge's HTTP ingest, for agents that can't reach the bus.

``Publisher(open_bus("http://127.0.0.1:8765"))`` publishes exactly as on any
bus — the same runs, children, seqs and retries — by posting each batch's
canonical JSON lines to ``POST /v1/runs/{root}/events`` of a running edge
(``runwire up``, ``runwire edge``), one request per tree. So an agent in
another process reaches the in-process bus of ``scripts/run`` by changing
one line: the URL. ``?token=`` is sent as the bearer token when the edge has
auth on (``RUNWIRE_SECRET``).

It is a bus for publishing and for the agent's control channel
(``run.controls()`` reads ``GET /v1/runs/{run}/control``, so a client's
cancel or approval reaches an agent that publishes through the edge): the
workers and the edge need a real bus (``memory://`` in their own process,
``redis://``, ``kafka://``), so every other operation — consuming, delivery
streams, sending control commands — raises
:class:`~runwire.core.errors.ConfigError` saying so. An
unreachable edge, a 5xx or a 429 is :class:`BusUnavailable` (the publisher
retries it within its ``delivery_timeout``); a refused event (4xx) is the
edge's error with its ``KAI-STREAM-*`` code, never retried (the publisher
reports the batch as not delivered, though the edge may have accepted its
other lines: a 422 names only the refused ones).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import NoReturn
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
import msgspec
from redis.backoff import FullJitterBackoff

from ...core.envelope import Event
from ...core.errors import (
    AUTH_WRITE_REFUSED,
    AuthError,
    BusUnavailable,
    ConfigError,
    ProtocolError,
    RequestError,
    WriteRefused,
)
from ...core.redaction import redact_text
from ..base import Bus, Consumer, ControlCommand, DeadLetter, Routed, StreamKey, encoded

log = logging.getLogger(__name__)
CONTROL_BACKOFF = FullJitterBackoff(cap=2.0, base=0.05)
CONTROL_READ_TIMEOUT_S = 45.0
"""A control stream silent this long is taken as lost and reopened (the edge writes an empty
line every 15 s while quiet)."""
_control_json = msgspec.json.Decoder(ControlCommand)


class HttpBus(Bus):
    """Publishes through an edge's HTTP ingest (see the module docstring)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigError(f"bad HTTP bus URL {url!r}: use http://host:port of a running edge")
        self.url = url
        self.base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        token = parse_qs(parts.query).get("token", [None])[0]
        self._headers = {"content-type": "application/x-ndjson"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def connect(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.base, timeout=self._timeout_s, headers=self._headers)
        await self.ping()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def ping(self) -> None:
        try:
            answer = await self._http().get("/readyz")
        except httpx.HTTPError as exc:
            raise BusUnavailable(f"edge {self.base} unreachable: {exc}") from None
        if answer.status_code != 200:
            raise BusUnavailable(f"edge {self.base} not ready ({answer.status_code})")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise BusUnavailable("the HTTP bus is not connected")
        return self._client

    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None:
        data = encoded(events, data)
        trees: dict[str, list[bytes]] = {}
        for event, line in zip(events, data, strict=True):
            trees.setdefault(event.root_id or event.run_id, []).append(line)
        for root, lines in trees.items():
            await self._post(root, b"\n".join(lines))

    async def _post(self, root: str, body: bytes) -> None:
        try:
            answer = await self._http().post(f"/v1/runs/{root}/events", content=body,
                                             params={"format": "koder"})
        except httpx.HTTPError as exc:
            raise BusUnavailable(f"edge {self.base} unreachable: {exc}") from None
        if answer.status_code == 200:
            return
        if answer.status_code >= 500 or answer.status_code == 429:
            raise BusUnavailable(f"edge {self.base} answered {answer.status_code}: {answer.text[:200]}")
        raise _refusal(answer)

    # ---- not a bus to consume from ----------------------------------------
    def consumer(self, group: str, name: str, *, claim_idle_ms: int | None = None) -> Consumer:
        _publish_only("consuming")

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        _publish_only("dead letters")

    async def append(self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None) -> int:
        _publish_only("delivery streams")

    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]:
        _publish_only("delivery streams")

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]:
        _publish_only("delivery streams")

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None:
        _publish_only("delivery streams")

    async def tail(self, cursors: Mapping[StreamKey, int], block_ms: int = 1000) -> list[tuple[StreamKey, Event]]:
        _publish_only("delivery streams")

    async def send_control(self, command: ControlCommand) -> None:
        _publish_only("control commands (POST /v1/runs/{run}/control does)")

    async def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]:
        """The run's commands, live from now (``after`` other than ``"$"`` is refused), read
        from the edge; a lost connection or an edge that is down is retried with backoff for
        as long as this is iterated (commands sent while it was away are not seen)."""
        if after != "$":
            raise ConfigError("an http:// bus reads a run's control channel live from now only")
        failures = 0
        async with httpx.AsyncClient(  # its own connections: a long read holds one per run
            base_url=self.base, headers=self._headers, limits=httpx.Limits(max_connections=None),
            timeout=httpx.Timeout(self._timeout_s, read=CONTROL_READ_TIMEOUT_S),
        ) as client:
            while True:
                try:
                    async with client.stream("GET", f"/v1/runs/{run_id}/control") as answer:
                        if answer.status_code != 200:
                            await answer.aread()
                            if answer.status_code < 500 and answer.status_code != 429:
                                raise _refusal(answer)
                            raise httpx.HTTPStatusError("edge busy", request=answer.request,
                                                        response=answer)
                        failures = 0
                        async for line in answer.aiter_lines():
                            if line.strip():
                                yield _control_json.decode(line)
                    failures += 1  # the edge ended the stream (it stopped): reconnect, not at once
                except httpx.HTTPError as exc:
                    failures += 1
                    log.warning("control channel of %s unavailable (%s); retrying", run_id,
                                redact_text(str(exc)))
                await asyncio.sleep(CONTROL_BACKOFF.compute(failures))


def _publish_only(what: str) -> NoReturn:
    raise ConfigError(f"an http:// bus only publishes (through an edge's ingest); {what} needs the "
                      "bus itself: memory:// in the edge's process, redis:// or kafka://")


def _refusal(answer: httpx.Response) -> Exception:
    try:
        body = answer.json()
    except ValueError:
        body = {}
    rejected = body.get("rejected") or []
    first = rejected[0] if rejected else {}
    code = first.get("code") or body.get("code") or ""
    message = f"edge refused the batch ({answer.status_code}): " + (
        "; ".join(f"line {r.get('line')}: {r.get('code')} {r.get('message')}" for r in rejected[:5])
        or str(body.get("error") or answer.text[:200]))
    if code == AUTH_WRITE_REFUSED:
        return WriteRefused(message)
    if answer.status_code in (401, 403):
        return AuthError(message, status=answer.status_code)
    if code.startswith("KAI-STREAM-PROTO"):
        return ProtocolError(message)
    return RequestError(message, code=code or None)
