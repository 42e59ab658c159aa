"""One framework run being published: what every integration shares.

An integration opens an :class:`AgentRun` around the framework's streaming
call and maps each framework event onto it::

    async with AgentRun(publisher, run_id, framework="pydantic_ai", name=agent.name) as run:
        await run.text("Hello")
        await run.tool_start("c1", "search", {"q": "x"})
        await run.tool_end("c1", ok=True, output=["3 results"])

What it does for them:

* **Nesting.** An ``AgentRun`` opened while another is active in the same task context (a
  sub-agent inside a tool, a delegation) is a child of it: ``child.spawn`` in the parent,
  ``parent_id``/``root_id`` on every event, fanned into the parent's stream by the workers.
  :meth:`child` opens one explicitly for a framework's own sub-agents (a LangGraph subgraph task,
  an OpenAI Agents handoff).
* **Lifecycle.** ``running`` on entry; on exit ``done``, ``error`` (the exception's type and
  message, secrets redacted, at most 1,000 characters) or ``aborted`` (a cancel, with the client's
  reason). Tool calls still open at the end are closed with ``ok: false``.
* **Control.** A client's ``cancel`` (HTTP, WebSocket, gRPC, on any edge, on any bus — ``http://``
  included) cancels the task that opened the run: the framework's run stops within the bus's
  delivery time and ``run()`` raises :class:`asyncio.CancelledError`, as the framework does when
  its task is cancelled. :meth:`awaiting` publishes ``awaiting_approval`` with the pending calls
  in ``ext.approval.calls`` and returns each one's :class:`Decision` from ``approve`` / ``deny`` /
  ``answer`` commands. The run listens from the moment it opens, before its first event, and reads
  live: a command sent while the listener reconnects (``http://``) is not seen, so a client that
  got no effect sends it again.
* **Publishing never kills the agent.** Each emit waits at most ``publish_timeout`` seconds for
  room in the publisher (a slow or down bus); ``on_publish_error="continue"`` (the default) then
  counts the event in :attr:`unpublished` and goes on, logging once when publishing stops and once
  when it resumes; ``"raise"`` raises :class:`PublishFailed`. Once an emit failed, later text and
  reasoning deltas don't wait at all until an event finds room again (other events still wait up
  to ``publish_timeout``). An event not published uses up its seq, so the workers report the gap
  to clients (``x.gap``, Koder agent stream §7 T2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Literal

import msgspec

from ..bus.base import ControlCommand
from ..core import limits
from ..core.envelope import TERMINAL_STATES
from ..core.errors import BusUnavailable, DeliveryTimeout, ProtocolError, RunwireError
from ..core.events import TextPayload
from ..core.redaction import redact_text
from ..core.ulid import new_random_ulid
from ..sdk.publisher import Publisher, Run
from .values import bounded

__all__ = ["AgentRun", "Decision", "PublishFailed", "close_all", "current"]

log = logging.getLogger("runwire.integrations")

OnPublishError = Literal["continue", "raise"]
REASON_CHARS = 1000
DELTA_CHARS = 64 * 1024
"""The longest text one ``text.delta``/``reasoning.delta`` carries; a longer text is several."""
PROMPT_CHARS = 4096
"""The longest prompt a ``child.spawn`` carries (it is for display)."""
_DELTAS = frozenset({"text.delta", "reasoning.delta"})
"""Events that don't wait at all once publishing has failed (the others still wait up to
``publish_timeout``: a tool's end or the run's end is worth the wait)."""
_CURRENT: ContextVar[AgentRun | None] = ContextVar("runwire_agent_run", default=None)


def current() -> AgentRun | None:
    """The run being published in this task context, if any (the parent of a new one)."""
    return _CURRENT.get()


class PublishFailed(RunwireError):
    """An event could not be published in time (``on_publish_error="raise"``)."""

    retriable = True


class Decision(msgspec.Struct, kw_only=True, frozen=True):
    """A client's answer to one pending call: ``approve``, ``deny`` or ``answer``."""

    call_id: str
    approved: bool
    """True for ``approve`` and ``answer``, False for ``deny``."""
    answer: Any = None
    """``args.answer`` of an ``answer`` command (a LangGraph ``interrupt()``'s resume value)."""
    reason: str | None = None
    command: str = "approve"


class AgentRun:
    """One framework run on a publisher (see the module docstring)."""

    def __init__(
        self,
        publisher: Publisher,
        run_id: str | None = None,
        *,
        framework: str,
        name: str | None = None,
        parent: AgentRun | None | Literal["current"] = "current",
        prompt: str | None = None,
        thread: str | None = None,
        tenant: str | None = None,
        on_publish_error: OnPublishError = "continue",
        publish_timeout: float = 5.0,
        current: bool = True,
    ) -> None:
        if on_publish_error not in ("continue", "raise"):
            raise ValueError('on_publish_error must be "continue" or "raise"')
        self.publisher = publisher
        self.run_id = run_id or new_random_ulid("run_")
        self.framework = framework
        self.name = name
        self.parent = _CURRENT.get() if parent == "current" else parent
        self.prompt = prompt
        self.thread = thread
        self.tenant = tenant
        self.on_publish_error = on_publish_error
        self.publish_timeout = publish_timeout
        self.becomes_current = current
        """Whether the run is the current one of the task context that opens it, for its
        ``async with`` block (False: a framework's own sub-agent opened beside the code that
        drives the framework; :meth:`as_current` makes it current where it runs)."""
        self.unpublished = 0
        """This run's events not published (``on_publish_error="continue"``): those that found
        no room in time, and those the publisher gave up after its ``delivery_timeout`` when
        the report reached this run (it reaches the next emit of any run: the publisher's
        ``DeliveryTimeout`` names each one, and is logged)."""
        self.refused = 0
        """This run's events the publisher refused as they were (over a limit); each is logged."""
        self.run: Run | None = None
        self.degraded = False
        """An emit failed, none found room since: deltas don't wait."""
        self._steps = 0
        self._open_tools: dict[str, tuple[str, float]] = {}
        self._decisions: dict[str, asyncio.Future[Decision]] = {}
        self._cancel_reason: str | None = None
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._token: Token[AgentRun | None] | None = None

    # ---- lifecycle ---------------------------------------------------------
    async def __aenter__(self) -> AgentRun:
        parent = self.parent
        self.run = self.publisher.run(
            self.run_id, tenant=self.tenant, parent=parent.run if parent else None,
            thread=None if parent else self.thread,
        )
        self._task = asyncio.current_task()
        self._watcher = asyncio.create_task(self._watch(), name=f"runwire-controls-{self.run_id}")
        try:
            await asyncio.sleep(0)  # the watcher opens the control channel before the run is seen
            if parent is not None:
                spawn: dict[str, Any] = {"child_id": self.run_id}
                if self.prompt is not None:
                    spawn["prompt"] = self.prompt[:PROMPT_CHARS]
                await parent.emit("child.spawn", spawn)
            await self.emit("run.lifecycle", {"state": "running"}, self._agent_ext())
        except BaseException:  # no __aexit__ follows a failed __aenter__: stop listening here
            await self._stop_watching()
            raise
        if self.becomes_current:
            self._token = _CURRENT.set(self)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            with contextlib.suppress(ValueError):  # reset from another context: leave it
                _CURRENT.reset(self._token)
        await self._stop_watching()
        cancelled = isinstance(exc, asyncio.CancelledError)
        for call_id in list(self._open_tools):
            await self.tool_end(call_id, ok=False, error="cancelled" if cancelled else "the run ended")
        if exc is None:
            await self.emit("run.lifecycle", {"state": "done"})
        elif cancelled:
            await self.emit("run.lifecycle", {"state": "aborted",
                                              "reason": self._cancel_reason or "cancelled"})
        else:
            await self.emit("run.lifecycle", {"state": "error", "reason": describe(exc)})

    def _agent_ext(self) -> dict[str, Any]:
        return {"agent": {"framework": self.framework, **({"name": self.name} if self.name else {})}}

    def child(self, run_id: str | None = None, *, name: str | None = None,
              prompt: str | None = None, current: bool = True) -> AgentRun:
        """A sub-run of this one (open it with ``async with``), whatever run is current."""
        return AgentRun(self.publisher, run_id, framework=self.framework, name=name, parent=self,
                        prompt=prompt, tenant=self.tenant, on_publish_error=self.on_publish_error,
                        publish_timeout=self.publish_timeout, current=current)

    @contextlib.contextmanager
    def as_current(self) -> Iterator[AgentRun]:
        """Make this run the current one for a block (a framework's sub-agent running there:
        a ``run(...)`` nested in it becomes this run's child)."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            with contextlib.suppress(ValueError):
                _CURRENT.reset(token)

    # ---- events ------------------------------------------------------------
    async def emit(self, type: str, payload: dict[str, Any] | msgspec.Struct,
                   ext: dict[str, Any] | None = None) -> None:
        """Publish one event of this run, within the publishing policy (module docstring)."""
        run = self.run
        assert run is not None, "use `async with AgentRun(...)`"
        if not self.degraded:
            try:
                if run.emit_nowait(type, payload, ext) is not None:
                    return  # the common case: room in the publisher, no coroutine of its own
            except (DeliveryTimeout, BusUnavailable) as exc:
                self._failed(type, exc, self._lost(exc))
                return
            except ProtocolError as exc:
                self._refused(type, exc)
                return
        wait = (0.0 if self.degraded and type in _DELTAS
                else None if type == "run.lifecycle" and payload_state(payload) in TERMINAL_STATES
                else self.publish_timeout)
        try:
            await run.emit(type, payload, ext, room_timeout=wait)
        except (DeliveryTimeout, BusUnavailable) as exc:
            self._failed(type, exc, self._lost(exc))
            return
        except ProtocolError as exc:  # an event no worker could carry: refused, the run goes on
            self._refused(type, exc)
            return
        if self.degraded:
            self.degraded = False
            log.warning("run %s: publishing resumed (%d event(s) were not published)",
                        self.run_id, self.unpublished)

    def _refused(self, type: str, exc: ProtocolError) -> None:
        """An event the publisher refused as it is (over a limit): counted and logged, or raised
        with ``on_publish_error="raise"``; never the agent's end otherwise."""
        if self.on_publish_error == "raise":
            raise exc
        self.refused += 1
        log.warning("run %s: a %s event was refused and not published: %s", self.run_id, type,
                    describe(exc))

    def _lost(self, exc: BaseException) -> int:
        """This run's events a failure names (given up by the publisher, or this one), at least 1."""
        assert self.run is not None
        named = {seq for run_id, seq in getattr(exc, "undelivered", ()) if run_id == self.run_id}
        named.add(self.run.seq)  # the event being emitted was not queued
        return len(named)

    def _failed(self, type: str, exc: BaseException, lost: int) -> None:
        if self.on_publish_error == "raise":
            raise PublishFailed(f"run {self.run_id}: {type} not published: {describe(exc)}") from exc
        self.unpublished += lost
        if not self.degraded:
            self.degraded = True
            log.warning("run %s: publishing stopped (%s); the agent goes on and counts what is "
                        "not published", self.run_id, describe(exc) or "bus too slow")

    def delta_now(self, type: str, text: str) -> bool:
        """A ``text.delta``/``reasoning.delta`` queued without a coroutine (every token's path);
        False when there is no room now (then await :meth:`text` or :meth:`reasoning`)."""
        if self.degraded or self.run is None or len(text) > DELTA_CHARS:
            return False
        try:
            return self.run.delta_nowait(type, text)
        except (DeliveryTimeout, BusUnavailable, ProtocolError) as exc:
            self.delta_failed(type, exc)
        return True

    def delta_failed(self, type: str, exc: DeliveryTimeout | BusUnavailable | ProtocolError) -> None:
        """``run.delta_nowait`` raised ``exc`` (called by an integration itself): as :meth:`emit`."""
        if isinstance(exc, ProtocolError):
            return self._refused(type, exc)
        self._failed(type, exc, self._lost(exc))

    async def text(self, text: str) -> None:
        """``text.delta`` (a text longer than :data:`DELTA_CHARS` as several, in order)."""
        for start in range(0, len(text), DELTA_CHARS):
            await self.emit("text.delta", TextPayload(text=text[start:start + DELTA_CHARS]))

    async def reasoning(self, text: str) -> None:
        for start in range(0, len(text), DELTA_CHARS):
            await self.emit("reasoning.delta", TextPayload(text=text[start:start + DELTA_CHARS]))

    async def tool_start(self, call_id: str, tool: str, arguments: Any = None) -> None:
        """``tool.start``; its ``tool.end`` gets the duration from now."""
        if call_id in self._open_tools:
            return
        self._open_tools[call_id] = (tool, time.monotonic())
        await self.emit("tool.start", {"call_id": call_id, "tool": tool, "input": bounded(arguments)})

    async def tool_end(self, call_id: str, *, ok: bool, output: Any = None, error: Any = None,
                       tool: str | None = None) -> None:
        """``tool.end`` of a call (a call never started gets its ``tool.start`` first)."""
        if call_id not in self._open_tools:
            await self.tool_start(call_id, tool or "unknown")
        _tool, started = self._open_tools.pop(call_id)
        payload: dict[str, Any] = {"call_id": call_id, "ok": ok,
                                   "duration_ms": int((time.monotonic() - started) * 1000)}
        if ok or output is not None:
            payload["output"] = bounded(output)
        if not ok:
            payload["error"] = bounded(error if error is not None else "failed")
        await self.emit("tool.end", payload)

    def tool_open(self, call_id: str) -> bool:
        return call_id in self._open_tools

    async def step(self, kind: str = "text-only") -> None:
        """``step.boundary`` (a model request/response step), numbered from 0."""
        await self.emit("step.boundary", {"step_index": self._steps, "step_kind": kind})
        self._steps += 1

    async def usage(self, input_tokens: int | None, output_tokens: int | None,
                    model: str | None = None, total_tokens: int | None = None) -> None:
        """``x.usage`` with the model's name; nothing when the framework reported no tokens."""
        given_in, given_out = int(input_tokens or 0), int(output_tokens or 0)
        total = int(total_tokens or 0) or given_in + given_out
        if not total:
            return
        payload: dict[str, Any] = {"input_tokens": given_in, "output_tokens": given_out,
                                   "total_tokens": total}
        if model:
            payload["model"] = model
        await self.emit("x.usage", payload)

    async def carry(self, kind: str, value: Any) -> None:
        """A framework event with no runwire type, carried as ``x.<framework>.<kind>``
        (payload ``{"data": <its JSON>}``): every format passes ``x.*`` events on."""
        await self.emit(f"x.{self.framework}.{kind}", {"data": bounded(value)})

    # ---- control -----------------------------------------------------------
    async def awaiting(self, calls: list[dict[str, Any]]) -> dict[str, Decision]:
        """Publish ``awaiting_approval`` with ``calls`` (each ``{"call_id", "tool", "input"}``)
        in ``ext.approval.calls``, wait for a decision on every one, publish ``running``, and
        return the decisions by call id. ``approve``/``deny``/``answer`` name the call in
        ``args.call_id``; without it a command decides every call still pending."""
        loop = asyncio.get_running_loop()
        self._decisions = {str(call["call_id"]): loop.create_future() for call in calls}
        share = limits.TOOL_VALUE_BYTES // max(1, len(calls))  # the event stays within a frame
        listed = [{"call_id": str(c["call_id"]), "tool": c.get("tool"),
                   "input": bounded(c.get("input"), share)} for c in calls]
        await self.emit("run.lifecycle", {"state": "awaiting_approval",
                                          "reason": f"{len(calls)} call(s) wait for a decision"},
                        {"approval": {"calls": listed}})
        try:
            decided = {call_id: await future for call_id, future in self._decisions.items()}
        finally:
            self._decisions = {}
        await self.emit("run.lifecycle", {"state": "running"})
        return decided

    async def _watch(self) -> None:
        assert self.run is not None
        try:
            async for command in self.run.controls():
                self._apply(command)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bus without a control channel: the run goes on, unstoppable
            log.warning("run %s: no control channel (%s); cancel and approvals won't reach it",
                        self.run_id, describe(exc))

    def _apply(self, command: ControlCommand) -> None:
        args = command.args or {}
        if command.command == "cancel":
            self._cancel_reason = str(args.get("reason") or "cancelled by a client")[:REASON_CHARS]
            if self._task is not None and not self._task.done():
                self._task.cancel(self._cancel_reason)
        elif command.command in ("approve", "deny", "answer"):
            wanted = args.get("call_id")
            for call_id, future in self._decisions.items():
                if future.done() or (wanted is not None and str(wanted) != call_id):
                    continue
                future.set_result(Decision(
                    call_id=call_id, approved=command.command != "deny", answer=args.get("answer"),
                    reason=args.get("reason"), command=command.command))

    async def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})  # a cancel of this task meanwhile still raises here


def payload_state(payload: Any) -> str | None:
    """A ``run.lifecycle`` payload's state (a dict or a Struct)."""
    return payload.get("state") if isinstance(payload, dict) else getattr(payload, "state", None)


async def close_all(runs: list[AgentRun], exc: BaseException | None) -> None:
    """Close every run of ``runs`` in order (``exc``: how they ended); an error closing one does
    not leave the others open (their control listeners running): the first is raised after."""
    first: BaseException | None = None
    for run in runs:
        try:
            await run.__aexit__(type(exc) if exc else None, exc, None)
        except Exception as error:
            first = first or error
    if first is not None:
        raise first


def describe(exc: BaseException) -> str:
    """An exception as a run's error reason: its type and message, secrets redacted, bounded."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return redact_text(text)[:REASON_CHARS]
