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
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from ...bus.requests import AgentRequest, consumer_alive, send_request
from ...core import limits
from ...core.envelope import now_ts
from ...core.errors import RunFinished, UnknownRun
from ...core.ulid import new_event_id, new_random_ulid
from ...protocols.a2a import (
    NEW_TASK_TRIGGER,
    RUN_STATES,
    A2AEgress,
    message_text,
    task_state,
)
from ...store.base import RunInfo
from ..fanout.feed import FeedKey
from ..fanout.filters import event_filter
from ..fanout.resume import Probe, history, probe
from ..service.auth import Principal
from ..service.authz import authorize_control, authorize_write
from ..service.context import Edge
from ..service.control import send_control
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


def text_of(params: Mapping[str, Any], field: str, *, chars: int = limits.ID_CHARS) -> str | None:
    """An optional string parameter (None when absent or empty), else ``INVALID_PARAMS``."""
    value = params.get(field)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > chars:
        raise A2AFault("INVALID_PARAMS", f"{field} must be a string of at most {chars} characters")
    return value


def object_of(params: Mapping[str, Any], field: str) -> dict[str, Any]:
    """An optional object parameter (``{}`` when absent), else ``INVALID_PARAMS``."""
    value = params.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise A2AFault("INVALID_PARAMS", f"{field} must be an object")
    return value


def flag_of(params: Mapping[str, Any], field: str) -> bool:
    value = params.get(field, False)
    if not isinstance(value, bool):
        raise A2AFault("INVALID_PARAMS", f"{field} must be true or false")
    return value


def history_length(params: Mapping[str, Any]) -> int | None:
    value = params.get("historyLength")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise A2AFault("INVALID_PARAMS", "historyLength must be a non-negative integer")
    return value


# ---- reading a task -------------------------------------------------------------
async def task_encoder(edge: Edge, run_id: str, *, sent: bool = False, room: int | None = None) -> A2AEgress:
    """The run's events so far through the ``a2a`` mapping, read until the task holds
    :data:`~runwire.core.limits.TASK_BYTES` (or ``room``) bytes of artifacts and messages: what
    an answer can carry. A read stopped there leaves the rest unread (``truncated.events``) and
    takes the task's status from where the run stands (its end, else the run catalogue).
    UnknownRun when nobody wrote the run, unless this edge has just ``sent`` it to an agent."""
    key = FeedKey(run_id, view_of(edge), "a2a", "default", "flatten")
    found = await probe(edge.bus, edge.store, key.stream)
    encoder = A2AEgress()
    encoder.task_id = run_id
    encoder.budget = limits.TASK_BYTES if room is None else min(room, limits.TASK_BYTES)
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
                if encoder.full:  # (the reading stops here: the batch's events after it are not read on)
                    await _stopped(edge, encoder, found, upto)
                    return encoder
    return encoder


async def _stopped(edge: Edge, encoder: A2AEgress, found: Probe, upto: int) -> None:
    """A read stopped at the bound: the status is the run's as it stands now."""
    if found.end_state is not None:
        encoder.stopped(found.end_state, None, upto - encoder.position)
        return
    info = await edge.store.run(encoder.task_id)
    encoder.stopped(info.state if info else None, info.last_ts if info else None, upto - encoder.position)


async def task_now(edge: Edge, run_id: str) -> dict[str, Any]:
    """The run's task as it stands, bounded (the caller checked read access)."""
    return (await task_encoder(edge, run_id)).task(max_bytes=limits.TASK_BYTES)


async def get_task(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id, length = task_id_of(params), history_length(params)
    await edge.gate.check_run(principal, run_id, "read")
    return (await task_encoder(edge, run_id)).task(length, max_bytes=limits.TASK_BYTES)


async def context_of(edge: Edge, run_id: str) -> str | None:
    """The run's thread (its context id) as far as the replay log or the hot tier know."""
    info = await edge.store.run(run_id)
    if info is not None and info.thread_id:
        return info.thread_id
    first = await edge.bus.read((run_id, "raw"), 0, limit=1)
    return first[0].thread_id if first else None


async def list_tasks(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    """A page of the caller's tenant's tasks, newest first (by their last update, then id).

    The page token is the (update time, id) of the last task given: the next page starts after it
    whatever the filters. A status the log cannot select alone (working: four run states; submitted:
    none yet) is filtered here over at most :data:`SCAN_BATCHES` batches of runs; a page may then hold
    fewer tasks than ``pageSize`` and still have a ``nextPageToken``. A page also ends early (with a
    token) before its tasks pass :data:`~runwire.core.limits.TASK_PAGE_BYTES`. ``totalSize`` is how
    many tasks match the filters (whatever the page token), counted in the run catalogue up to
    :data:`~runwire.core.limits.TASK_COUNT`.
    """
    edge.gate.require_scope(principal, "read")
    size = params.get("pageSize") or DEFAULT_PAGE
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_PAGE:
        raise A2AFault("INVALID_PARAMS", f"pageSize must be between 1 and {MAX_PAGE}")
    status = text_of(params, "status")
    if status is not None and status not in RUN_STATES:
        raise A2AFault("INVALID_PARAMS", f"unknown status {status!r}")
    states = RUN_STATES[status] if status else ()
    since = _time(text_of(params, "statusTimestampAfter"), "statusTimestampAfter")
    thread = text_of(params, "contextId")
    artifacts, length = flag_of(params, "includeArtifacts"), history_length(params)
    position = _page_token(text_of(params, "pageToken", chars=1024))
    matched: list[RunInfo] = []
    more = False
    for _ in range(SCAN_BATCHES):
        batch = await edge.store.runs(
            tenant=principal.tenant if principal else None, state=states[0] if len(states) == 1 else None,
            since=since, updated_until=position[0] + _SLACK if position else None, limit=SCAN_BATCH,
            thread_id=thread)
        for info in batch:
            if position is not None and _seen(info, position):
                continue
            if principal is not None and not principal.covers(info.run_id):
                continue
            if status is not None and task_state(info.state) != status:
                continue
            if len(matched) == size:
                more = True
                break
            matched.append(info)
        if more or len(batch) < SCAN_BATCH:
            break
        last = batch[-1]
        position = (last.updated_at or _EPOCH, last.run_id)
    else:
        more = True  # scanned as far as one page may: the next page goes on from here
    tasks: list[dict[str, Any]] = []
    room = limits.TASK_PAGE_BYTES
    for info in matched:
        # A page's first task gets a task's whole bound; the others what is left of the page's,
        # and one that does not fit whole ends the page (it comes first on the next).
        bound = min(room, limits.TASK_BYTES) if tasks else limits.TASK_BYTES
        if bound <= 0:
            more = True
            break
        task = await _listed(edge, info, artifacts, length, bound)
        used = len(_json.encode(task))
        if tasks and (used > room or (bound < limits.TASK_BYTES and _cut(task))):
            more = True
            break
        room -= used
        tasks.append(task)
        position = (info.updated_at or _EPOCH, info.run_id)
    token = _encode_token(position) if more and position is not None else ""
    total = await edge.store.count_runs(
        cap=limits.TASK_COUNT, tenant=principal.tenant if principal else None, since=since, thread_id=thread,
        states=None if status is None else (states or (None,)),
        run_ids=principal.runs if principal is not None and principal.runs is not None else None)
    return {"tasks": tasks, "nextPageToken": token, "pageSize": size, "totalSize": total}


SCAN_BATCH = 1000
SCAN_BATCHES = 5
_SLACK = timedelta(milliseconds=1)
"""The page token's time is read back through a float: the next page asks a little past it and
skips what it gave already."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_json = msgspec.json.Encoder()


def _seen(info: RunInfo, position: tuple[datetime, str]) -> bool:
    """Whether ``info`` comes before ``position`` in the list's order (given on an earlier page)."""
    updated = info.updated_at or _EPOCH
    return updated > position[0] or (updated == position[0] and info.run_id <= position[1])


def _cut(task: dict[str, Any]) -> bool:
    return "truncated" in task.get("metadata", {}).get("runwire", {})


async def _listed(edge: Edge, info: RunInfo, artifacts: bool, length: int | None, room: int) -> dict[str, Any]:
    """A task of a page: with artifacts or history read as ``GetTask`` reads it, at most the
    ``room`` left on the page (a task cut by it ends the page and comes whole on the next)."""
    if artifacts or length:
        full = (await task_encoder(edge, info.run_id, room=room)).task(length, max_bytes=room)
        if not artifacts:
            full.pop("artifacts", None)
        return full
    task: dict[str, Any] = {"id": info.run_id, "status": {"state": task_state(info.state)}}
    if info.updated_at is not None:
        task["status"]["timestamp"] = info.updated_at.isoformat().replace("+00:00", "Z")
    if info.thread_id:
        task["contextId"] = info.thread_id
    return task


def _encode_token(position: tuple[datetime, str]) -> str:
    return base64.urlsafe_b64encode(_json.encode([position[0].isoformat(), position[1]])).decode()


def _page_token(raw: str | None) -> tuple[datetime, str] | None:
    if not raw:
        return None
    try:
        moment, run_id = msgspec.json.decode(base64.urlsafe_b64decode(raw.encode()), type=tuple[str, str])
        return datetime.fromisoformat(moment), run_id
    except (ValueError, msgspec.DecodeError):
        raise A2AFault("INVALID_PARAMS", "bad pageToken: use a nextPageToken this edge returned") from None


def _time(raw: str | None, name: str) -> datetime | None:
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    except ValueError:
        raise A2AFault("INVALID_PARAMS", f"{name} must be an RFC 3339 timestamp") from None


# ---- cancelling, sending ----------------------------------------------------------
async def cancel_task(edge: Edge, principal: Principal | None, params: Mapping[str, Any]) -> dict[str, Any]:
    run_id = task_id_of(params)
    try:
        await send_control(edge.bus, edge.gate, principal, run_id, "cancel", {"reason": "A2A CancelTask"})
    except RunFinished as exc:
        raise A2AFault("TASK_NOT_CANCELABLE", str(exc)) from None
    return (await task_encoder(edge, run_id)).task(0, max_bytes=limits.TASK_BYTES)


class Sent:
    """Where a sent message went: the run to stream, and after which seq (0: its start)."""

    def __init__(self, run_id: str, context_id: str | None, *, new: bool, after: int = 0) -> None:
        self.run_id = run_id
        self.context_id = context_id
        self.new = new
        self.after = after


Prepare = Callable[[str], Awaitable[None]]
"""What must be in place for a task before its message goes out (its push config): called with the
task id after every check, before the agent can see the message."""


async def send_message(edge: Edge, principal: Principal | None, agent: str, params: Mapping[str, Any],
                       prepare: Prepare | None = None) -> Sent:
    """A new task for ``agent``, or an answer on the message's task."""
    message = params.get("message")
    if not isinstance(message, dict) or not isinstance(message.get("parts"), list) or not message["parts"]:
        raise A2AFault("INVALID_PARAMS", "message must be a Message with at least one part")
    task_id, context_id = text_of(message, "taskId"), text_of(message, "contextId")
    metadata = object_of(params, "metadata") or None
    if task_id:
        # An answer is a control command: the control bound (limits.CONTROL_BYTES), as every entrance's.
        limits.check_size(len(_json.encode(message)), edge.settings.max_control_bytes, "an answer's message")
        try:
            await authorize_control(edge.gate, principal, task_id)
            # Where the task is before the answer: its stream goes on from here (the agent may
            # answer and finish before the stream begins).
            before = await probe(edge.bus, edge.store, (task_id, "raw" if view_of(edge) == "raw" else "shaped"))
            if prepare is not None:
                await prepare(task_id)
            await send_control(edge.bus, edge.gate, principal, task_id, "answer",
                               {"text": message_text(message), "message": message})
        except RunFinished as exc:
            raise A2AFault("UNSUPPORTED_OPERATION", f"task {task_id} is in a terminal state: {exc}") from None
        return Sent(task_id, context_id or await context_of(edge, task_id), new=False, after=before.tail)
    run_id = new_random_ulid("run_")
    context_id = context_id or new_random_ulid("ctx_")
    await authorize_write(edge.gate, principal, run_id)
    if not await consumer_alive(edge.bus, agent):
        raise A2AFault("UNSUPPORTED_OPERATION", (
            f"no agent consumes tasks for {agent!r} (an agent runs `async for task in pub.tasks({agent!r})`)"))
    tenant = principal.tenant if principal else None
    if tenant is not None:
        await edge.gate.claim(run_id, tenant, run_id)
    if prepare is not None:
        await prepare(run_id)
    await send_request(edge.bus, AgentRequest(
        id=new_event_id(), channel=agent, run_id=run_id, thread_id=context_id, tenant=tenant, ts=now_ts(),
        trigger=NEW_TASK_TRIGGER, messages=[message], metadata=metadata,
    ))
    return Sent(run_id, context_id, new=True)
