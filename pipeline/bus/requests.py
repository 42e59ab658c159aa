"""Requests: clients asking an agent to start a run (a chat turn), on a named channel.

The edge turns an AI SDK ``WebSocketChatTransport`` ``send`` frame into an
:class:`AgentRequest` and sends it on the **requests channel** its client
named (``default`` unless ``?agent=``); an agent consumes the channel with
the publisher SDK and answers by publishing the run the request names::

    async for request in pub.requests("default"):
        run = pub.run_for(request)          # run_id, tenant and thread from the request
        ...                                 # request.messages: the chat's UI messages

Built on two things every bus has, so it works the same on ``memory://``,
Redis and Kafka:

* the channel is the **control channel** of the reserved id
  ``~requests/<channel>`` (commands ``request``, and ``probe`` — see below);
* a consumer's **presence** is a delivery stream of the same id whose events
  are heartbeats (``x.runwire.consumer``) with ``seq`` = the heartbeat's
  wall-clock milliseconds, appended every ``ttl / 3``. The edge reads the
  stream's last heartbeat: none within its ``ttl_ms`` → no agent consumes
  the channel, and the edge refuses the request at once instead of waiting
  for a run that will never come. Clocks of agents and edges must agree to
  well within the ttl (10 s by default).

A consumer announces itself only once its reader is positioned: it sends a
``probe`` on the channel and waits for it to come back, so no request sent
after a heartbeat was seen can be missed. Every consumer of a channel sees
every request (like control); run one consumer per channel, or one channel
per agent pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from ..core.envelope import Extension, format_ts, now_ts
from ..core.ulid import new_event_id
from .base import ControlCommand
from .ports import ControlChannel, DeliveryStreams

DEFAULT_CHANNEL = "default"
CHANNEL_PREFIX = "~requests/"
"""Reserved run-id prefix of the requests channels and their presence streams."""
HEARTBEAT_TYPE = "x.runwire.consumer"
DEFAULT_TTL_S = 10.0
PROBE_EVERY_S = 0.5


class AgentRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A client's request that an agent start a run (an AI SDK chat turn)."""

    id: str
    """The request's id (a ULID)."""
    channel: str = DEFAULT_CHANNEL
    run_id: str
    """The run to publish the answer as: the edge is already streaming it to the client."""
    thread_id: str | None = None
    """The chat the run answers (the AI SDK ``chatId``)."""
    tenant: str | None = None
    """The requesting token's tenant: the run's tenant."""
    ts: str = ""
    trigger: str = "submit-message"
    """``submit-message`` or ``regenerate-message`` (AI SDK)."""
    message_id: str | None = None
    """The message to regenerate, for ``regenerate-message``."""
    messages: list[Any] = []
    """The chat's UI messages as the client sent them."""
    body: dict[str, Any] = {}
    """The client's extra request data (the transport's ``body``)."""
    metadata: Any = None


class RequestsBus(ControlChannel, DeliveryStreams, Protocol):
    """What the requests channel is built on: a bus's control channel (the requests, the
    consumers' heartbeats) and its delivery streams (a consumer's position)."""


def channel_id(channel: str) -> str:
    """The reserved id whose control channel and delivery stream serve ``channel``."""
    return CHANNEL_PREFIX + channel


async def send_request(bus: RequestsBus, request: AgentRequest) -> None:
    """Put a request on its channel (raises BusUnavailable)."""
    args = msgspec.to_builtins(request)
    await bus.send_control(ControlCommand(
        command="request", run_id=channel_id(request.channel), id=request.id, ts=request.ts, args=args,
    ))


async def consumer_alive(bus: RequestsBus, channel: str) -> bool:
    """Whether an agent consumes ``channel``: a heartbeat within the ttl it announced."""
    key = (channel_id(channel), "raw")
    bounds = await bus.bounds(key)  # type: ignore[arg-type]
    if bounds is None:
        return False
    last = await bus.read(key, bounds[1] - 1, limit=1)  # type: ignore[arg-type]
    if not last:
        return False
    ttl_ms = int(last[0].payload_dict().get("ttl_ms", DEFAULT_TTL_S * 1000))
    return time.time() * 1000 - last[0].seq < ttl_ms


async def heartbeat(bus: RequestsBus, channel: str, consumer: str, ttl_s: float) -> None:
    """Announce ``consumer`` on ``channel`` now (a presence event, seq = now in ms)."""
    now_ms = int(time.time() * 1000)
    event = Extension(
        id=new_event_id(), ts=format_ts_ms(now_ms), type=HEARTBEAT_TYPE, run_id=channel_id(channel),
        seq=now_ms, payload={"consumer": consumer, "ttl_ms": int(ttl_s * 1000)},
    )
    await bus.append((channel_id(channel), "raw"), [event])


def format_ts_ms(ms: int) -> str:
    return format_ts(datetime.fromtimestamp(ms / 1000, UTC))


async def consume_requests(
    bus: RequestsBus, channel: str = DEFAULT_CHANNEL, *, ttl_s: float = DEFAULT_TTL_S, consumer: str | None = None
) -> AsyncIterator[AgentRequest]:
    """The requests sent on ``channel`` once this consumer reads it, announcing it meanwhile."""
    name = consumer or f"{socket.gethostname()}:{os.getpid()}:{new_event_id()[-6:]}"
    reader = bus.controls(channel_id(channel))
    pending: asyncio.Task[ControlCommand] = asyncio.ensure_future(anext(reader))
    beating: asyncio.Task[None] | None = None
    try:
        early, pending = await _position(bus, channel, reader, pending)
        await heartbeat(bus, channel, name, ttl_s)
        beating = asyncio.create_task(_beat(bus, channel, name, ttl_s), name="runwire-requests-heartbeat")
        for command in early:
            yield msgspec.convert(command.args, AgentRequest)
        while True:
            command = await pending
            pending = asyncio.ensure_future(anext(reader))
            if command.command == "request":
                yield msgspec.convert(command.args, AgentRequest)
    finally:
        tasks = [task for task in (pending, beating) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # a cancel of this consumer itself still propagates
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved: a reader that failed while closing is not an error here
        with contextlib.suppress(Exception):
            await reader.aclose()  # type: ignore[attr-defined]


async def _position(
    bus: RequestsBus, channel: str, reader: AsyncIterator[ControlCommand], pending: asyncio.Task[ControlCommand]
) -> tuple[list[ControlCommand], asyncio.Task[ControlCommand]]:
    """Probe the channel until the reader sees our probe: from then on it reads live.

    Returns the requests read meanwhile and the reader's next pending read.
    """
    probe = new_event_id()
    early: list[ControlCommand] = []
    loop = asyncio.get_running_loop()
    while True:
        await bus.send_control(ControlCommand(command="probe", run_id=channel_id(channel), id=probe, ts=now_ts()))
        deadline = loop.time() + PROBE_EVERY_S
        while (left := deadline - loop.time()) > 0:
            done, _ = await asyncio.wait({pending}, timeout=left)
            if not done:
                break
            command = pending.result()
            pending = asyncio.ensure_future(anext(reader))
            if command.command == "probe" and command.id == probe:
                return early, pending
            if command.command == "request":
                early.append(command)


async def _beat(bus: RequestsBus, channel: str, consumer: str, ttl_s: float) -> None:
    """Heartbeats every ``ttl / 3`` (a failed one is retried at the next beat)."""
    while True:
        await asyncio.sleep(ttl_s / 3)
        with contextlib.suppress(Exception):
            await heartbeat(bus, channel, consumer, ttl_s)
