"""``a2a`` (egress): a run as an A2A 1.0 task, every event a ``StreamResponse``.

The one place runwire's events and A2A's objects meet (``docs/a2a.md`` has the
table both ways). A run is a **task**: task id = run id, context id = the
run's thread (``thread_id``). Each event becomes one or more
``StreamResponse`` objects in their ProtoJSON form (camelCase, enums as
strings), as the ``a2a-sdk`` client parses them:

==========================  ====================================================
canonical                   A2A
==========================  ====================================================
``run.lifecycle``           ``statusUpdate``: planning/running/redirecting/paused →
                            ``TASK_STATE_WORKING``; awaiting_approval →
                            ``TASK_STATE_INPUT_REQUIRED``; done → ``COMPLETED``;
                            aborted → ``CANCELED``; error → ``FAILED``; a reason
                            is the status message (role agent)
``text.delta``              ``artifactUpdate`` of a text artifact (``text-<seq>``):
                            the first delta opens it, the next ones ``append``;
                            ``lastChunk`` closes it when something else comes
``reasoning.delta``         the same, artifact ``reasoning-<seq>`` named ``reasoning``
``tool.start``              ``artifactUpdate`` ``tool-<call_id>`` named after the
                            tool: a data part ``{call_id, tool, input}``
``tool.end``                the same artifact, ``append`` + ``lastChunk``: a data
                            part ``{call_id, ok, output | error}``
``child.spawn``             ``artifactUpdate`` ``child-<child_id>``: a data part
                            ``{child_id, prompt}``
a child's events            the same objects, artifact ids prefixed with
                            ``<child_id>/`` and ``childId`` in the metadata; a
                            child's ``run.lifecycle`` is a data part on its
                            ``child-<child_id>`` artifact (``lastChunk`` when it ends)
``x.a2a.message``           a client's message (the inbox writes it): the task's
                            history, role user; no object
anything else               ``artifactUpdate`` ``event-<seq>`` named after the
                            type: a data part with the payload, ``lastChunk``
==========================  ====================================================

Every object's ``metadata`` carries ``runwire`` ``{seq, type, childId}`` and
the exact-resume extension's ``{cursor}`` (:data:`RESUME_EXTENSION`): the
point after which a resume continues with the next object. One event's
objects are ``<seq>.0``, ``<seq>.1`` … and its last one ``<seq>``, so a
client cut off between two objects of one event resumes exactly.

:meth:`A2AEgress.preamble` is the task **snapshot**: a ``task`` object with
the status and the artifacts so far (a text artifact's chunks as one part),
what ``SubscribeToTask`` sends first; :meth:`A2AEgress.task` the same, bounded
for an answer (``GetTask``, ``ListTasks``).

Longer than ~400 lines: the one mapping between runwire's events and A2A's
objects, its task snapshot and that snapshot's bounds stay in one module, so
that the stream, the answers and the push bodies cannot drift apart.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec
from msgspec import UNSET

from ..core import envelope, limits
from ..core.envelope import (
    ChildSpawn,
    Event,
    ReasoningDelta,
    RunLifecycle,
    TextDelta,
    ToolEnd,
    ToolStart,
)
from .base import Egress

Obj = dict[str, Any]

RESUME_EXTENSION = "urn:runwire:a2a:exact-resume:v1"
"""The exact-resume extension's URI (card ``capabilities.extensions``, ``A2A-Extensions``)."""

USER_MESSAGE_TYPE = "x.a2a.message"
"""The event an agent's inbox (``pub.tasks``) writes with a client's message (``{"message": …}``): the
task's first message, and each answer. It is the task's history (role user), no stream object."""

NEW_TASK_TRIGGER = "a2a-message"
"""The ``trigger`` of a request ``SendMessage`` puts on a requests channel (the SDK's inbox reads these)."""

WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
SUBMITTED = "TASK_STATE_SUBMITTED"
TERMINAL = {"done": "TASK_STATE_COMPLETED", "aborted": "TASK_STATE_CANCELED", "error": "TASK_STATE_FAILED"}
STATES: dict[str, str] = {
    "planning": WORKING, "running": WORKING, "redirecting": WORKING, "paused": WORKING,
    "awaiting_approval": INPUT_REQUIRED, **TERMINAL,
}
"""runwire lifecycle state → A2A task state."""
RUN_STATES: dict[str, tuple[str, ...]] = {
    SUBMITTED: (), WORKING: ("planning", "running", "redirecting", "paused"),
    INPUT_REQUIRED: ("awaiting_approval",), "TASK_STATE_COMPLETED": ("done",),
    "TASK_STATE_CANCELED": ("aborted",), "TASK_STATE_FAILED": ("error",),
}
"""A2A task state → the runwire lifecycle states it stands for (``ListTasks``' filter)."""
TERMINAL_TASK_STATES = frozenset({*TERMINAL.values(), "TASK_STATE_REJECTED"})


A2A_MEDIA_TYPE = "application/a2a+json"
PUSH_TOKEN_HEADER = "X-A2A-Notification-Token"
"""The header a push notification carries its config's ``token`` in (as the ``a2a-sdk`` server sends it)."""
PUSH_CONFIG_PREFIX = "a2a_"
"""The id prefix of a webhook that is an A2A push-notification config (its bodies are A2A's)."""


def push_body(task_id: str, run_state: str, ts: str, seq: int) -> Obj:
    """What an A2A push notification carries: a ``StreamResponse`` with the task's new status."""
    return {"statusUpdate": {"taskId": task_id, "status": {"state": task_state(run_state), "timestamp": ts},
                             "metadata": {"runwire": {"seq": seq}, RESUME_EXTENSION: {"cursor": str(seq)}}}}


def task_state(run_state: str | None) -> str:
    """The A2A state of a run whose last lifecycle state is ``run_state`` (None: submitted)."""
    return STATES.get(run_state or "", SUBMITTED if run_state is None else WORKING)


def agent_message(text: str, *, task_id: str, context_id: str | None, message_id: str) -> Obj:
    message: Obj = {"messageId": message_id, "taskId": task_id, "role": "ROLE_AGENT",
                    "parts": [{"text": text}]}
    if context_id:
        message["contextId"] = context_id
    return message


def history_message(message: Any) -> Obj:
    """A client's message as the task's history keeps it: as sent when its JSON is within
    :data:`~runwire.core.limits.CONTROL_BYTES`, else its text cut to that and marked
    (``metadata.runwire.truncated``)."""
    if not isinstance(message, dict):
        return {"role": "ROLE_USER", "parts": []}
    if len(_json.encode(message)) <= limits.CONTROL_BYTES:
        return message
    text = message_text(message).encode()[:limits.CONTROL_BYTES // 2].decode(errors="ignore")
    kept = {k: v for k, v in message.items() if k in ("messageId", "taskId", "contextId", "role")
            and isinstance(v, str) and len(v) <= limits.ID_CHARS}
    return {**kept, "parts": [{"text": text}], "metadata": {"runwire": {"truncated": True}}}


def message_text(message: Any) -> str:
    """The text parts of an A2A message (ProtoJSON), joined by newlines."""
    if not isinstance(message, dict):
        return ""
    parts = message.get("parts") or []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


class _Artifact:
    """An artifact as the snapshot shows it. Text chunks are kept as a list and joined when a
    snapshot is taken, so a delta costs the same however long the text already is."""

    __slots__ = ("artifact_id", "closed", "metadata", "name", "parts")

    def __init__(self, artifact_id: str, name: str, metadata: Obj) -> None:
        self.artifact_id = artifact_id
        self.name = name
        self.parts: list[Obj | list[str]] = []
        self.metadata = metadata
        self.closed = False

    def add(self, parts: list[Obj]) -> None:
        """Keep a chunk for the snapshot (consecutive text chunks make one part)."""
        for part in parts:
            text = part.get("text")
            if isinstance(text, str):
                last = self.parts[-1] if self.parts else None
                if isinstance(last, list):
                    last.append(text)
                else:
                    self.parts.append([text])
            else:
                self.parts.append(part)

    def snapshot(self, max_chars: int | None = None) -> Obj:
        """The artifact with its text chunks joined; with ``max_chars``, a text part joins only
        the chunks that reach past that many characters (the caller cuts it)."""
        parts = [{"text": _joined(p, max_chars)} if isinstance(p, list) else p for p in self.parts]
        out: Obj = {"artifactId": self.artifact_id, "name": self.name, "parts": parts}
        if self.metadata:
            out["metadata"] = self.metadata
        return out


def _joined(chunks: list[str], max_chars: int | None) -> str:
    if max_chars is None:
        return "".join(chunks)
    taken: list[str] = []
    for chunk in chunks:
        taken.append(chunk)
        max_chars -= len(chunk)
        if max_chars < 0:
            break
    return "".join(taken)


class A2AEgress(Egress):
    """Canonical events → A2A ``StreamResponse`` objects for one run (one task)."""

    name = "a2a"

    def __init__(self) -> None:
        self.task_id = ""
        self.context_id: str | None = None
        self.state = SUBMITTED
        self.status_message: Obj | None = None
        self.timestamp: str | None = None
        self.position = 0
        """The last seq folded into the task (the snapshot's cursor)."""
        self.artifacts: dict[str, _Artifact] = {}
        self.history: deque[Obj] = deque(maxlen=limits.TASK_HISTORY)
        self._open: dict[tuple[str | None, str], str] = {}
        """(child, text|reasoning) → the id of its open artifact."""
        self.ended = False
        self.budget: int | None = None
        """When set, :attr:`kept` counts the bytes of the artifacts and messages kept so far
        (:attr:`full` once past this): what a bounded read stops at."""
        self.kept = 0
        self.unread = 0
        """Events after :attr:`position` a bounded read left unread (the task's ``truncated.events``)."""

    @property
    def full(self) -> bool:
        """Whether the task kept more than :attr:`budget` bytes: nothing further read can be answered."""
        return self.budget is not None and self.kept > self.budget

    # ---- the Egress interface -------------------------------------------
    def convert(self, event: Event) -> list[Any]:
        if self.ended:
            return []
        if not self.task_id and event.child_id is None:
            self.task_id = event.run_id
        self.task_id = self.task_id or event.run_id
        if self.context_id is None and event.child_id is None and event.thread_id:
            self.context_id = event.thread_id
        out = self._convert(event)
        self.position = event.seq
        self.timestamp = event.ts
        last = len(out) - 1
        for index, obj in enumerate(out):
            body = next(iter(obj.values()))
            body["metadata"] = _meta(event, str(event.seq) if index == last else f"{event.seq}.{index}",
                                     body.get("metadata"))
        return out

    def finish(self) -> list[Any]:
        return []

    def preamble(self) -> list[Any]:
        """The task so far, bounded as an answer (``SubscribeToTask``'s first object)."""
        return [{"task": self.task(max_bytes=limits.TASK_BYTES)}]

    # ---- the task as it stands ------------------------------------------
    def task(self, history_length: int | None = None, *, max_bytes: int | None = None) -> Obj:
        """The task snapshot: status, artifacts so far, the last ``history_length`` messages (at most
        :data:`~runwire.core.limits.TASK_HISTORY`); with ``max_bytes``, its history and artifacts cut
        to about that many bytes of JSON (the latest messages kept, then the artifacts in order) and
        ``metadata.runwire.truncated`` counting what was cut."""
        task: Obj = {"id": self.task_id, "status": self._status()}
        if self.context_id:
            task["contextId"] = self.context_id
        length = min(limits.TASK_HISTORY, limits.TASK_HISTORY if history_length is None else history_length)
        history = list(self.history)[-length:] if length else []
        runwire: Obj = {"seq": self.position}
        if max_bytes is not None:
            history, artifacts, cut = _bounded(history, list(self.artifacts.values()), max_bytes)
            if self.unread:
                cut["events"] = self.unread
            if cut:
                runwire["truncated"] = cut
        else:
            artifacts = [a.snapshot() for a in self.artifacts.values()]
        if artifacts:
            task["artifacts"] = artifacts
        if history:
            task["history"] = history
        task["metadata"] = {"runwire": runwire, RESUME_EXTENSION: {"cursor": str(self.position)}}
        return task

    def stopped(self, run_state: str | None, ts: str | None, unread: int) -> None:
        """A bounded read stopped here with ``unread`` events left: the status becomes the run's
        latest (``run_state``, as of ``ts``), without a message unless it is the one read."""
        state = task_state(run_state)
        if state != self.state:
            self.state, self.status_message = state, None
        self.timestamp = ts or self.timestamp
        self.unread = unread

    def _status(self) -> Obj:
        status: Obj = {"state": self.state}
        if self.status_message is not None:
            status["message"] = self.status_message
        if self.timestamp:
            status["timestamp"] = self.timestamp
        return status

    # ---- events → objects -------------------------------------------------
    def _convert(self, event: Event) -> list[Obj]:
        child = event.child_id
        if isinstance(event, TextDelta | ReasoningDelta):
            return self._delta(event, child)
        if event.type == USER_MESSAGE_TYPE and child is None:
            return self._user_message(event)
        out = self._close(child)
        if isinstance(event, RunLifecycle):
            out.extend(self._lifecycle(event, child))
        elif isinstance(event, ToolStart):
            data = {"call_id": event.payload.call_id, "tool": event.payload.tool, **_set(event.payload, "input")}
            artifact_id = _lane(child, f"tool-{event.payload.call_id}")
            out.append(self._update(child, artifact_id, event.payload.tool, [{"data": data}]))
        elif isinstance(event, ToolEnd):
            payload = event.payload
            data = {"call_id": payload.call_id, "ok": payload.ok, **_set(payload, "output", "error", "duration_ms")}
            artifact_id = _lane(child, f"tool-{payload.call_id}")
            out.append(self._update(child, artifact_id, "tool", [{"data": data}], last=True))
        elif isinstance(event, ChildSpawn):
            data = {"child_id": event.payload.child_id, **_set(event.payload, "prompt", "tools_allowed")}
            out.append(self._update(child, f"child-{event.payload.child_id}", "child run", [{"data": data}]))
        else:
            out.append(self._update(child, _lane(child, f"event-{event.seq}"), event.type,
                                    [{"data": event.payload_dict()}], last=True))
        return out

    def _user_message(self, event: Event) -> list[Obj]:
        """A client's message (the inbox wrote it): the task's history, no stream object."""
        message = history_message(event.payload_dict().get("message"))
        message = {**message, "role": "ROLE_USER", "taskId": self.task_id}
        if self.context_id:
            message["contextId"] = self.context_id
        self.history.append(message)
        self._count(message)
        return []

    def _delta(self, event: TextDelta | ReasoningDelta, child: str | None) -> list[Obj]:
        kind = "text" if isinstance(event, TextDelta) else "reasoning"
        out = self._close(child, only="reasoning" if kind == "text" else "text")
        artifact_id = self._open.get((child, kind))
        if artifact_id is None:
            artifact_id = self._open[(child, kind)] = _lane(child, f"{kind}-{event.seq}")
        out.append(self._update(child, artifact_id, kind, [{"text": event.payload.text}]))
        return out

    def _close(self, child: str | None, only: str | None = None) -> list[Obj]:
        """``lastChunk`` (an empty chunk) on the lane's open text/reasoning artifacts."""
        out: list[Obj] = []
        for kind in ("reasoning", "text"):
            if only is not None and kind != only:
                continue
            artifact_id = self._open.pop((child, kind), None)
            if artifact_id is not None:
                out.append(self._update(child, artifact_id, kind, [], last=True))
        return out

    def _close_all(self) -> list[Obj]:
        out: list[Obj] = []
        for child in dict.fromkeys(child for child, _kind in self._open):
            out.extend(self._close(child))
        return out

    def _lifecycle(self, event: RunLifecycle, child: str | None) -> list[Obj]:
        state = event.payload.state
        if child is not None:  # a child's lifecycle shows on its child artifact
            data = {"child_id": child, "state": state, **_set(event.payload, "reason")}
            return [self._update(child, f"child-{child}", "child run", [{"data": data}],
                                 last=state in envelope.TERMINAL_STATES)]
        out = self._close_all() if state in envelope.TERMINAL_STATES else []
        self.state = STATES.get(state, WORKING)
        reason = event.payload.reason if isinstance(event.payload.reason, str) else None
        self.status_message = None
        if reason:
            self.status_message = agent_message(reason, task_id=self.task_id, context_id=self.context_id,
                                                message_id=f"{self.task_id}-status-{event.seq}")
            self.history.append(self.status_message)
            self._count(self.status_message)
        self.ended = state in envelope.TERMINAL_STATES
        self.timestamp = event.ts
        update: Obj = {"taskId": self.task_id, "status": self._status()}
        if self.context_id:
            update["contextId"] = self.context_id
        return [*out, {"statusUpdate": update}]

    def _count(self, message: Obj) -> None:
        if self.budget is not None:
            self.kept += len(_json.encode(message))

    def _update(self, child: str | None, artifact_id: str, name: str, parts: list[Obj], *,
                last: bool = False) -> Obj:
        """An ``artifactUpdate`` (``append`` when the artifact has had a chunk), kept for the snapshot."""
        artifact = self.artifacts.get(artifact_id)
        append = artifact is not None
        if artifact is None:
            metadata: Obj = {"runwire": {"childId": child}} if child is not None else {}
            artifact = self.artifacts[artifact_id] = _Artifact(artifact_id, name, metadata)
        artifact.add(parts)
        if self.budget is not None:
            self.kept += sum(len(p["text"]) if isinstance(p.get("text"), str) else len(_json.encode(p)) for p in parts)
        artifact.closed = artifact.closed or last
        body: Obj = {"artifactId": artifact_id, "name": artifact.name, "parts": parts}
        if artifact.metadata:
            body["metadata"] = artifact.metadata
        update: Obj = {"taskId": self.task_id, "artifact": body, "append": append, "lastChunk": last}
        if self.context_id:
            update["contextId"] = self.context_id
        return {"artifactUpdate": update}


_json = msgspec.json.Encoder()


def _bounded(history: list[Obj], artifacts: list[_Artifact], max_bytes: int) -> tuple[list[Obj], list[Obj], Obj]:
    """History (the latest first) and artifacts (in order) within ``max_bytes`` of JSON; what was cut.
    The work is bounded by the answer: an artifact's text is joined only as far as the room left,
    and the artifacts past the bound are counted, not looked at."""
    left = max_bytes
    kept_history: list[Obj] = []
    for message in reversed(history):
        size = len(_json.encode(message))
        if size > left:
            break
        left -= size
        kept_history.insert(0, message)
    kept: list[Obj] = []
    cut = 0
    for whole in artifacts:
        if left <= 0:
            cut += 1
            continue
        artifact = whole.snapshot(left)
        size = len(_json.encode(artifact))
        if size <= left:
            kept.append(artifact)
            left -= size
            continue
        cut += 1
        parts: list[Obj] = []
        left -= 256  # the artifact's id, name and metadata, about
        for part in artifact.get("parts", []):
            text = part.get("text")
            if isinstance(text, str) and left > 0:
                parts.append({"text": text.encode()[:left].decode(errors="ignore")})
                left -= len(text.encode())
            elif not isinstance(text, str) and (size := len(_json.encode(part))) <= left:
                parts.append(part)
                left -= size
        if parts:
            kept.append({**artifact, "parts": parts})
    out: Obj = {}
    if len(kept_history) < len(history):
        out["history"] = len(history) - len(kept_history)
    if cut:
        out["artifacts"] = cut
    return kept_history, kept, out


def _lane(child: str | None, artifact_id: str) -> str:
    """An artifact id in a child's lane (``<child_id>/<id>``) or the run's own."""
    return artifact_id if child is None else f"{child}/{artifact_id}"


def _set(payload: Any, *names: str) -> Obj:
    """The payload's fields among ``names`` that are set."""
    out: Obj = {}
    for name in names:
        value = getattr(payload, name, None)
        if value is not None and value is not UNSET:
            out[name] = value
    return out


def _meta(event: Event, cursor: str, metadata: Obj | None) -> Obj:
    runwire: Obj = {"seq": event.seq, "type": event.type}
    if event.child_id is not None:
        runwire["childId"] = event.child_id
    out = dict(metadata or {})
    out["runwire"] = runwire
    out[RESUME_EXTENSION] = {"cursor": cursor}
    return out
