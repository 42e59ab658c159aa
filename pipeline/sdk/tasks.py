"""The A2A inbox: tasks that A2A clients send an agent through the edge (``SendMessage``).

::

    async for task in pub.tasks("travel-agent"):
        print(task.text)                         # the client's message (its text parts)
        city = await task.ask("Which city?")     # input-required until the client answers
        await task.run.emit("text.delta", {"text": f"Booked {city}."})
        await task.finish()

Each task arrives with its run already open (``run.lifecycle`` running, the
run id the task id, the thread the A2A context id) and a reader of the run's
control channel: ``task.cancelled`` is set when a client cancels the task
(``CancelTask``), and :meth:`A2ATask.ask` puts the task in
``TASK_STATE_INPUT_REQUIRED`` (``run.lifecycle`` awaiting_approval, the question as
its reason) until a client's message on the task arrives as ``answer`` — or the
task is cancelled meanwhile (:class:`TaskCancelled`). Answers nobody asked for
wait, at most :data:`PENDING_ANSWERS` of them (the oldest are dropped). The
client's messages — the first, and each answer taken — are written to the run
(:data:`~runwire.protocols.a2a.USER_MESSAGE_TYPE`): the task's history.

The inbox is the requests channel of :mod:`runwire.bus.requests` (the agent
announces itself there; with none alive the edge refuses a new task at once):
it reads the requests ``SendMessage`` made and leaves the others to ``pub.requests()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from ..bus.base import ControlCommand
from ..bus.requests import AgentRequest, RequestsBus, consume_requests
from ..core.envelope import Event
from ..protocols.a2a import NEW_TASK_TRIGGER, USER_MESSAGE_TYPE, history_message, message_text

PENDING_ANSWERS = 16
"""Most answers kept for a later :meth:`A2ATask.ask` (a client that sends more: the oldest go)."""


class TaskCancelled(Exception):
    """A client cancelled the task while :meth:`A2ATask.ask` waited for its answer."""


class Run(Protocol):
    """What a task uses of the publisher's :class:`~runwire.sdk.publisher.Run`."""

    run_id: str
    thread_id: str | None

    async def emit(self, type: str, payload: Mapping[str, Any]) -> Event: ...
    async def finish(self, state: str = "done", reason: str | None = None) -> Event: ...
    def controls(self, *, after: str = "$") -> AsyncIterator[ControlCommand]: ...


class Publisher(Protocol):
    """What the inbox uses of :class:`~runwire.sdk.publisher.Publisher`."""

    @property
    def bus(self) -> RequestsBus: ...

    def run_for(self, request: AgentRequest) -> Run: ...


class A2ATask:
    """One A2A task handed to an agent: its message, its open run, its control channel."""

    def __init__(self, run: Run, request: AgentRequest) -> None:
        self.run = run
        self.request = request
        self.message: dict[str, Any] = request.messages[0] if request.messages else {}
        self.cancelled = asyncio.Event()
        """Set when a client cancelled the task (the run's ``cancel`` command)."""
        self.answers_received = 0
        """Answers that came on the task so far: taken by :meth:`ask`, waiting for one, or dropped
        past :data:`PENDING_ANSWERS`."""
        self._answers: asyncio.Queue[ControlCommand] = asyncio.Queue(maxsize=PENDING_ANSWERS)
        self._reader: asyncio.Task[None] | None = None

    @property
    def task_id(self) -> str:
        return self.run.run_id

    @property
    def context_id(self) -> str | None:
        return self.run.thread_id

    @property
    def text(self) -> str:
        """The message's text parts, joined by newlines."""
        return message_text(self.message)

    def _listen(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="runwire-a2a-task-controls")

    async def _read(self) -> None:
        async for command in self.run.controls():
            if command.command == "cancel":
                self.cancelled.set()
            elif command.command == "answer":
                if self._answers.full():
                    self._answers.get_nowait()
                self._answers.put_nowait(command)
                self.answers_received += 1

    async def ask(self, question: str) -> str:
        """Ask the client (``TASK_STATE_INPUT_REQUIRED`` with ``question``); the text of its answer.

        The task is working again once the answer is here. Raises :class:`TaskCancelled` when the
        client cancels the task instead (before or while it waits).
        """
        if self.cancelled.is_set():
            raise TaskCancelled(f"task {self.task_id} was cancelled")
        await self.run.emit("run.lifecycle", {"state": "awaiting_approval", "reason": question})
        answered = asyncio.ensure_future(self._answers.get())
        cancelled = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait((answered, cancelled), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
            if not answered.done():
                answered.cancel()
        if not answered.done() or answered.cancelled():
            raise TaskCancelled(f"task {self.task_id} was cancelled while it asked {question[:64]!r}")
        answer = answered.result()
        text = answer.args.get("text")
        text = text if isinstance(text, str) else message_text(answer.args.get("message"))
        message = answer.args.get("message") or {"role": "ROLE_USER", "parts": [{"text": text}]}
        await self.run.emit(USER_MESSAGE_TYPE, {"message": history_message(message)})
        await self.run.emit("run.lifecycle", {"state": "running"})
        return text

    async def finish(self, state: str = "done", reason: str | None = None) -> Event:
        """End the run (done, aborted or error) and stop reading its control channel."""
        try:
            return await self.run.finish(state, reason)
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop reading the control channel (:meth:`finish` does)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader


async def consume_tasks(publisher: Publisher, agent: str, *, ttl_s: float) -> AsyncIterator[A2ATask]:
    """The tasks A2A clients send ``agent``, each with its run open (see the module docs)."""
    async for request in consume_requests(publisher.bus, agent, ttl_s=ttl_s):
        if request.trigger != NEW_TASK_TRIGGER:
            continue
        task = A2ATask(publisher.run_for(request), request)
        task._listen()
        await asyncio.sleep(0)  # the reader takes its position on the control channel first
        await task.run.emit("run.lifecycle", {"state": "running"})
        await task.run.emit(USER_MESSAGE_TYPE, {"message": history_message(task.message)})
        yield task
