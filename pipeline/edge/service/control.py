"""Client → agent commands: one code path for every edge entrance (HTTP and gRPC).

A command goes onto the run's control channel, where the agent reads it from
``async for cmd in run.controls()`` (publisher SDK). Closing a stream is a
disconnect, never a cancel (closing a tab must not stop the agent); cancelling does not need a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from ...bus.base import ControlCommand
from ...bus.ports import ControlChannel
from ...core.envelope import now_ts
from ...core.errors import RunwireError
from ...core.ulid import new_event_id
from .auth import Gate, Principal
from .authz import authorize_control, authorize_write
from .params import check_depth, choice
from .quotas import Hold

CONTROL_COMMANDS = frozenset({"cancel", "pause", "resume", "redirect", "approve", "deny", "answer"})


async def send_control(
    bus: ControlChannel,
    gate: Gate,
    principal: Principal | None,
    run_id: str,
    command: str,
    args: dict[str, Any],
) -> ControlCommand:
    """Check the caller may control ``run_id``, validate ``command``, and send it.

    Raises AuthError / UnknownRun like every run endpoint, RunFinished for a
    run that has ended (:func:`.authz.authorize_control`), RequestError for an
    unknown command (``KAI-STREAM-REQ-0001``) or args nested deeper than 64
    levels (``KAI-STREAM-REQ-0003``), and the bus's error when it can't take
    the command.
    """
    await authorize_control(gate, principal, run_id)
    choice(command, CONTROL_COMMANDS, "command")
    check_depth(args, "control args")
    sent = ControlCommand(
        command=command,
        run_id=run_id,
        id=new_event_id(),
        ts=now_ts(),
        args=args,
        by=principal.tenant if principal else None,
    )
    await bus.send_control(sent)
    return sent


AGENT_KEEPALIVE_S = 15.0
"""A quiet agent control stream gets an empty line this often (proxies close idle responses)."""
_command_json = msgspec.json.Encoder()


async def agent_controls(
    bus: ControlChannel, gate: Gate, principal: Principal | None, run_id: str, hold: Hold
) -> AsyncIterator[bytes]:
    """``GET /v1/runs/{run_id}/control``: the run's commands as NDJSON lines, live from now, for
    an agent that publishes through the edge (the publisher SDK's ``http://`` bus). The caller
    needs what its publisher needs to write the run (checked here, before anything is sent).
    A run nobody has seen yet passes that check (the agent listens before its first event), so
    the check is made again before the first command is sent: a run that turned out to be
    another tenant's ends the stream and shows nothing of it. An empty line every
    :data:`AGENT_KEEPALIVE_S` while quiet; ends when the client goes."""
    await authorize_write(gate, principal, run_id)

    async def still_writable() -> bool:
        try:
            await authorize_write(gate, principal, run_id)
        except RunwireError:
            return False
        return True

    return _command_lines(bus.controls(run_id), None if principal is None else still_writable, hold)


async def _command_lines(
    commands: AsyncIterator[ControlCommand], check: Callable[[], Awaitable[bool]] | None, hold: Hold
) -> AsyncIterator[bytes]:
    upcoming = asyncio.ensure_future(anext(commands))
    try:
        while True:
            done, _ = await asyncio.wait({upcoming}, timeout=AGENT_KEEPALIVE_S)
            if not done:
                yield b"\n"
                continue
            if check is not None:
                if not await check():
                    return
                check = None  # the run is the caller's: it stays so (claims are never moved)
            yield _command_json.encode(upcoming.result()) + b"\n"
            upcoming = asyncio.ensure_future(anext(commands))
    finally:
        upcoming.cancel()
        with contextlib.suppress(BaseException):
            await upcoming
        await commands.aclose()  # type: ignore[attr-defined]
        hold.release()
