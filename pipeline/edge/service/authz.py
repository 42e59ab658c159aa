"""The write rule: which runs a caller may write events to. One rule for every entrance.

Every entrance that turns a client's input into events on the bus (HTTP
ingest, Durable-Streams-style appends, chat and gRPC write paths …) calls
two functions and nothing else decides:

1. :func:`authorize_write` once per request, before reading the body: the
   token has the ``write`` scope, and the run of the path is not another
   tenant's (nor outside the token's ``runs``).
2. :func:`admit` on the decoded events, before publishing them: returns the
   events it admits (stamped with the caller's tenant) and the refused ones
   with their error. Publish ``admission.events`` only.

The rule for one event, checked for each distinct run it names — its
``root_id``, then ``parent_id``, then ``run_id``, then a client-set
``child_id`` and the child a ``child.spawn`` attaches (ancestors first, so a
refused ancestor claims nothing below it):

* the event belongs to the run of the path (that run is its ``run_id``,
  ``root_id`` or ``parent_id``), else ``KAI-STREAM-PROTO-0001``;
* its own ``tenant`` field, if set, is the caller's, else ``KAI-STREAM-AUTH-0003``;
* the run is **claimed** for the caller's tenant: the first entrance that
  sees a run id records its tenant (and the root of its tree) in the replay
  log, atomically across edge instances and restarts
  (:meth:`ReplayLog.claim_run`); a run claimed by another tenant refuses
  the event with ``KAI-STREAM-AUTH-0003`` — so a child can only be attached
  to a parent (and root) of the same tenant;
* with a token limited to some ``runs``, the run is one of them or its
  recorded root is (an agent holding a token for its root run may create
  and write child runs under it), else ``KAI-STREAM-AUTH-0003``.

With auth off (no secret) only the first check applies. Usage::

    principal = edge.gate.principal(request.headers, request.query_params)
    await authorize_write(edge.gate, principal, run_id)          # may raise AuthError
    admission = await admit(edge.gate, principal, run_id, events)
    await edge.bus.publish(admission.events)
    for index, error in admission.refused: ...                   # error.code, str(error)

Control has its own entrance check, :func:`authorize_control`: the run must
be the caller's, exist, and not have ended.

The rule lives here and nowhere else; ``docs/security.md`` § Authorization
explains it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from ...bus.base import StreamKey
from ...core import envelope
from ...core.envelope import TERMINAL_STATES, ChildSpawn, Event, RunLifecycle
from ...core.errors import ProtocolError, RunFinished, RunwireError, UnknownRun, WriteRefused
from .auth import Gate, Principal


class Admission(msgspec.Struct, kw_only=True):
    """What :func:`admit` decided about a batch of events."""

    events: list[Event]
    """The admitted events, in input order, stamped with the caller's tenant: publish these."""
    refused: list[tuple[int, RunwireError]]
    """``(index in the input, error)`` for each refused event; the error carries ``code``."""


async def authorize_write(gate: Gate, principal: Principal | None, run_id: str) -> None:
    """Raise unless ``principal`` may write to ``run_id`` (AuthError 401/403, WriteRefused 403).

    A run nobody has seen passes here: its events claim it in :func:`admit`.
    A run seen before claims existed (logged, or in the hot tier) is claimed
    now for the tenant it was seen with.
    """
    if principal is None:
        return
    gate.require_scope(principal, "write")
    owner = await gate.owner(run_id)
    seen = await gate.tenant_of(run_id)
    if owner is None and seen is not None:
        owner = await gate.claim(run_id, seen, run_id)
    if owner is not None:
        _check_owner(principal, run_id, owner.tenant, owner.root_id)
    if seen is not None and seen != principal.tenant:  # the run's events are another tenant's
        raise WriteRefused(f"run {run_id!r} is not writable with this token (another tenant's, or not in its runs)")


async def admit(
    gate: Gate, principal: Principal | None, run_id: str, events: Sequence[Event]
) -> Admission:
    """Apply the write rule to each event posted to ``run_id``; see the module docstring."""
    admitted: list[Event] = []
    refused: list[tuple[int, RunwireError]] = []
    for index, event in enumerate(events):
        try:
            admitted.append(await _admit_one(gate, principal, run_id, event))
        except (ProtocolError, WriteRefused) as exc:
            refused.append((index, exc))
    return Admission(events=admitted, refused=refused)


async def authorize_control(gate: Gate, principal: Principal | None, run_id: str) -> None:
    """Raise unless a command may be sent to ``run_id`` now.

    AuthError without the ``control`` scope; UnknownRun (404) for a run that
    is not the caller's or that nobody has seen — the same answer, no sooner
    than the gate's refusal floor; RunFinished (409) once the run has ended.
    """
    started = time.monotonic()
    await gate.check_run(principal, run_id, "control")
    finished = await run_finished(gate, run_id)
    if finished is None:
        if principal is not None:
            await gate.pad_refusal(started)
        raise UnknownRun(f"no run {run_id!r}")
    if finished:
        raise RunFinished(f"run {run_id!r} has ended; nothing can control it any more")


async def run_finished(gate: Gate, run_id: str) -> bool | None:
    """Whether a run has ended (its own terminal ``run.lifecycle``); None for a run nobody has seen."""
    info = await gate.store.run(run_id)
    if info is not None and info.terminal:
        return True
    key: StreamKey = (run_id, "raw")
    bounds = await gate.bus.bounds(key)
    if bounds is not None:
        last = await gate.bus.read(key, bounds[1] - 1, limit=1)
        return bool(last) and _ends(last[0])
    if info is not None or await gate.owner(run_id) is not None:
        return False  # logged, or claimed with its events still in the ingest backlog
    return None


def _ends(event: Event) -> bool:
    return isinstance(event, RunLifecycle) and event.child_id is None and event.payload.state in TERMINAL_STATES


def runs_written(event: Event) -> list[tuple[str, str]]:
    """The distinct runs an event names, ancestors first, each with the root it claims.

    Every reference counts, not only the envelope's: the run a ``child.spawn``
    attaches and a client-set ``child_id`` (the run the event says it came
    from) are runs of the event's tree, so they are claimed like its own run —
    a tenant cannot attach another tenant's run as its child and so read it.
    """
    root = event.root_id or event.parent_id or event.run_id
    named = [event.root_id, event.parent_id, event.run_id, event.child_id]
    if isinstance(event, ChildSpawn):
        named.append(event.payload.child_id)
    out: list[tuple[str, str]] = []
    for run in named:
        if run is not None and all(run != seen for seen, _ in out):
            out.append((run, root if run != event.root_id else run))
    return out


async def _admit_one(gate: Gate, principal: Principal | None, run_id: str, event: Event) -> Event:
    if run_id not in (event.run_id, event.root_id, event.parent_id):
        raise ProtocolError(f"event of run {event.run_id!r} posted to run {run_id!r}", field="$.run_id")
    if principal is None:
        return event
    if event.tenant not in (None, principal.tenant):
        raise WriteRefused(f"event of tenant {event.tenant!r} posted with a token of another tenant")
    for run, root in runs_written(event):
        owner = await gate.claim(run, principal.tenant, root)
        _check_owner(principal, run, owner.tenant, owner.root_id)
    return envelope.replace(event, tenant=principal.tenant) if event.tenant is None else event


def _check_owner(principal: Principal, run: str, tenant: str, root: str) -> None:
    if tenant != principal.tenant or not (principal.covers(run) or principal.covers(root)):
        raise WriteRefused(f"run {run!r} is not writable with this token (another tenant's, or not in its runs)")
