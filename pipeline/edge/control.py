"""Client → agent commands: one code path for every edge entrance (HTTP and gRPC).

A command goes onto the run's control channel, where the agent reads it from
``async for cmd in run.controls()`` (publisher SDK). Closing a stream is a
disconnect, never a cancel (closing a tab must not stop the agent); cancelling does not need a stream.
"""

from __future__ import annotations

from typing import Any

from ..bus.base import Bus, ControlCommand
from ..core.envelope import now_ts
from ..core.ulid import new_event_id
from .auth import Gate, Principal
from .authz import authorize_control
from .params import check_depth, choice

CONTROL_COMMANDS = frozenset({"cancel", "pause", "resume", "redirect", "approve", "deny", "answer"})


async def send_control(
    bus: Bus,
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
