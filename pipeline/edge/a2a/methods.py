"""A2A's methods on runwire, whichever binding carried them: a run is a task.

==========================  ========================================================
method                      what the edge does
==========================  ========================================================
``GetTask``                 the run's events through the ``a2a`` mapping: its task
                            (``historyLength``: that many of the last messages)
``ListTasks``               the token's tenant's runs (``GET /v1/runs``' rule),
                            newest first; ``contextId`` = thread, ``status``,
                            ``statusTimestampAfter``, ``pageSize`` ≤ 100, ``pageToken``
``CancelTask``              ``cancel`` on the run's control channel; the task
``SendMessage`` …           no ``taskId``: a new run, asked of the agent consuming the
                            requests channel ``{agent}`` (``pub.tasks(agent)``);
                            with one: ``answer`` on that run's control channel
==========================  ========================================================

Reads need the ``read`` scope, ``CancelTask`` and an answer ``control``, a new
task the write rule of :mod:`..authz` — as every other entrance.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ...bus.requests import AgentRequest, consumer_alive, send_request
from ...core import limits
from ...core.envelope import now_ts
from ...core.errors import RunFinished, UnknownRun
from ...core.ulid import new_event_id, new_random_ulid
from ...protocols.a2a import (
    NEW_TASK_TRIGGER,
    RUN_STATES,
    SUBMITTED,
    A2AEgress,
    message_text,
    task_state,
)
from ...store.base import RunInfo
from ..auth import Principal
from ..authz import authorize_write
from ..context import Edge
from ..control import send_control
from ..feed import FeedKey
from ..filters import event_filter
from ..resume import history, probe
from ..runs import list_runs
from .errors import A2AFault

CURSOR_HEADER = "Runwire-A2A-Cursor"
"""The exact-resume extension's request header: the cursor of the last response seen."""
EXTENSIONS_HEADER = "a2a-extensions"
MAX_PAGE = 100
DEFAULT_PAGE = 50


def view_of(edge: Edge) -> str:
    return "raw" if edge.settings.default_detail == "full" else "shaped"


def requested(headers: Mapping[str, str], uri: str) -> bool:
    """Whether the client activated extension ``uri`` (``A2A-Extensions``, comma-separated)."""
    values = headers.get(EXTENSIONS_HEADER, "")
    return uri in {part.strip() for part in values.split(",")}


def parse_cursor(raw: str) -> tuple[int, tuple[int, int] | None]:
    """``<seq>`` → after it; ``<seq>.<k>`` → after ``seq - 1``, skipping the event's objects 0…k."""
    seq, _, index = raw.strip().partition(".")
    if not (seq.isascii() and seq.isdigit() and len(seq) <= 18) or (index and not (index.isascii() and index.isdigit()
                                                                                  and len(index) <= 6)):
        raise A2AFault("INVALID_PARAMS", f"bad {CURSOR_HEADER} {raw[:64]!r}: use a cursor from a response's metadata")
    if not index:
        return int(seq), None
    return max(0, int(seq) - 1), (int(seq), int(index))


def task_id_of(params: Mapping[str, Any], field: str = "id") -> str:
    value = params.get(field)
    if not isinstance(value, str) or not 0 < len(value) <= limits.ID_CHARS:
        raise A2AFault("INVALID_PARAMS", f"{field} must be a task id of 1 to {limits.ID_CHARS} characters")
    return value


def history_length(params: Mapping[str, Any]) -> int | None:
    value = params.get("historyLength")
    if value is None:
        return None
    if not isinstance(value, int) or value < 0:
        raise A2AFault("INVALID_PARAMS", "historyLength must be a non-negative integer")
    return value


# ---- reading a task -------------------------------------------------------------
async def task_encoder(edge: Edge, run_id: str, *, sent: bool = False) -> A2AEgress:
    """The run's events so far through the ``a2a`` mapping (UnknownRun when nobody wrote it,
    unless this edge has just ``sent`` it to an agent)."""
    key = FeedKey(run_id, view_of(edge), "a2a", "default", "flatten")
    found = await probe(edge.bus, edge.store, key.stream)
    encoder = A2AEgress()
    encoder.task_id = run_id
    if not found.published:
        if not sent and await edge.gate.owner(run_id) is None:
            raise UnknownRun(f"no task {run_id!r}")
        return encoder  # asked of an agent that has not started it yet
    accepts = event_filter(key.profile, key.children)
    upto = found.tail if found.end_seq is None else min(found.tail, found.end_seq)
    async for _source, events in history(edge.bus, edge.store, key.stream, 0, upto, edge.settings.history_batch):
        for event in events:
            if accepts(event):
                encoder.convert(event)
    return encoder


async def task_now(edge: Edge, run_id: str) -> dict[str, Any]:
    """The run's task as it stands (the caller checked read access)."""
    return (await task_encoder(edge, run_id)).task()


async def get_task(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = task_id_of(params)
    await edge.gate.check_run(principal, run_id, "read")
    return (await task_encoder(edge, run_id)).task(history_length(params))


async def context_of(edge: Edge, run_id: str) -> str | None:
    """The run's thread (its context id) as far as the replay log or the hot tier know."""
    info = await edge.store.run(run_id)
    if info is not None and info.thread_id:
        return info.thread_id
    first = await edge.bus.read((run_id, "raw"), 0, limit=1)
    return first[0].thread_id if first else None


async def list_tasks(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    size = params.get("pageSize") or DEFAULT_PAGE
    if not isinstance(size, int) or not 1 <= size <= MAX_PAGE:
        raise A2AFault("INVALID_PARAMS", f"pageSize must be between 1 and {MAX_PAGE}")
    status = params.get("status") or None
    if status is not None and status not in RUN_STATES:
        raise A2AFault("INVALID_PARAMS", f"unknown status {status!r}")
    states = RUN_STATES.get(status, ()) if status else ()
    runs = await list_runs(
        edge, principal, tenant=None, state=states[0] if len(states) == 1 else None,
        since=_time(params.get("statusTimestampAfter"), "statusTimestampAfter"),
        until=_page_token(params.get("pageToken")), limit=min(1000, size + 1 if not status else 1000),
        thread_id=params.get("contextId") or None,
    )
    if status is not None:
        runs = [r for r in runs if task_state(r.state) == status or (status == SUBMITTED and r.state is None)]
    page, rest = runs[:size], runs[size:]
    length = history_length(params)
    tasks = [await _listed(edge, info, bool(params.get("includeArtifacts")), length) for info in page]
    token = _encode_token(rest[0]) if rest else ""
    return {"tasks": tasks, "nextPageToken": token, "pageSize": size, "totalSize": len(tasks)}


async def _listed(edge: Edge, info: RunInfo, artifacts: bool, length: int | None) -> dict[str, Any]:
    if artifacts or length:
        full = (await task_encoder(edge, info.run_id)).task(length)
        if not artifacts:
            full.pop("artifacts", None)
        return full
    task: dict[str, Any] = {"id": info.run_id, "status": {"state": task_state(info.state)}}
    if info.updated_at is not None:
        task["status"]["timestamp"] = info.updated_at.isoformat().replace("+00:00", "Z")
    if info.thread_id:
        task["contextId"] = info.thread_id
    return task


def _encode_token(info: RunInfo) -> str:
    moment = info.created_at.isoformat() if info.created_at else ""
    return base64.urlsafe_b64encode(moment.encode()).decode()


def _page_token(raw: Any) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(base64.urlsafe_b64decode(str(raw).encode()).decode())
    except ValueError:
        raise A2AFault("INVALID_PARAMS", "bad pageToken: use a nextPageToken this edge returned") from None


def _time(raw: Any, name: str) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise A2AFault("INVALID_PARAMS", f"{name} must be an RFC 3339 timestamp") from None


# ---- cancelling, sending ----------------------------------------------------------
async def cancel_task(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = task_id_of(params)
    try:
        await send_control(edge.bus, edge.gate, principal, run_id, "cancel", {"reason": "A2A CancelTask"})
    except RunFinished as exc:
        raise A2AFault("TASK_NOT_CANCELABLE", str(exc)) from None
    return (await task_encoder(edge, run_id)).task(0)


class Sent:
    """Where a sent message went: the run to stream, and after which seq (0: its start)."""

    def __init__(self, run_id: str, context_id: str | None, *, new: bool, after: int = 0) -> None:
        self.run_id = run_id
        self.context_id = context_id
        self.new = new
        self.after = after


async def send_message(edge: Edge, principal: Principal | None, agent: str, params: Mapping[str, Any]) -> Sent:
    """A new task for ``agent``, or an answer on the message's task."""
    message = params.get("message")
    if not isinstance(message, dict) or not message.get("parts"):
        raise A2AFault("INVALID_PARAMS", "message must be a Message with at least one part")
    task_id = message.get("taskId")
    if task_id:
        run_id = task_id_of(message, "taskId")
        await edge.gate.check_run(principal, run_id, "control")
        # Where the task is before the answer: its stream goes on from here (the agent may
        # answer and finish before the stream begins).
        before = await probe(edge.bus, edge.store, (run_id, "raw" if view_of(edge) == "raw" else "shaped"))
        try:
            await send_control(edge.bus, edge.gate, principal, run_id, "answer",
                               {"text": message_text(message), "message": message})
        except RunFinished as exc:
            raise A2AFault("UNSUPPORTED_OPERATION", f"task {run_id} is in a terminal state: {exc}") from None
        return Sent(run_id, message.get("contextId") or await context_of(edge, run_id), new=False,
                    after=before.tail)
    run_id = new_random_ulid("run_")
    context_id = message.get("contextId") or new_random_ulid("ctx_")
    if len(context_id) > limits.ID_CHARS:
        raise A2AFault("INVALID_PARAMS", f"contextId over {limits.ID_CHARS} characters")
    await authorize_write(edge.gate, principal, run_id)
    if not await consumer_alive(edge.bus, agent):
        raise A2AFault("UNSUPPORTED_OPERATION", (
            f"no agent consumes tasks for {agent!r} (an agent runs `async for task in pub.tasks({agent!r})`)"))
    tenant = principal.tenant if principal else None
    if tenant is not None:
        await edge.gate.claim(run_id, tenant, run_id)
    await send_request(edge.bus, AgentRequest(
        id=new_event_id(), channel=agent, run_id=run_id, thread_id=context_id, tenant=tenant, ts=now_ts(),
        trigger=NEW_TASK_TRIGGER, messages=[message], metadata=params.get("metadata"),
    ))
    return Sent(run_id, context_id, new=True)
