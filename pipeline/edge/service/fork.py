"""Forks, whichever entrance asks (``POST /v1/runs/{run_id}/fork``, a Durable Streams ``PUT``
with ``Stream-Forked-From``), and the forks a run lists.

``POST /v1/runs/{run_id}/fork`` with ``{"at": seq, "run_id": optional}`` makes a
new run whose history is the run's events up to ``seq`` (:mod:`runwire.jobs.fork`)
and answers ``201`` with the fork's id (``200`` when the same fork was made
before). The Durable Streams fork (``PUT`` with ``Stream-Forked-From``,
:mod:`runwire.edge.durable.write`) goes through :func:`fork_for` too.

Auth as every entrance: the source is read (``read`` scope; another tenant's
run, or one outside the token's ``runs``, is refused as a read is: ``404``),
and the fork is written (``write`` scope, the write rule for its id, which is
claimed for the caller's tenant once every check passed: a refused fork claims
nothing). A seq outside the source's events is ``400``; an id that is another
run's, or another fork's, ``409``; a source with ``limits.FORKS_PER_RUN`` forks,
or a token holding all its streams (a copy holds one while it runs), ``429``.
The body is bounded like a control body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ...core.errors import REQ_BAD_BODY, RequestError, UnknownRun
from ...core.events import RunId
from ...core.ulid import new_random_ulid
from ...jobs.fork import ForkResult, RunExists, check_fork, fork_run
from ...store.base import RunInfo
from .auth import Principal
from .authz import authorize_write
from .context import Edge

_json = msgspec.json.Encoder()


class ForkRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    at: int = msgspec.field(default=-1)
    """The seq the fork's history ends at (its source's events ``1 … at``)."""
    run_id: RunId | None = None
    """The fork's id (default: a new random one)."""


def fork_request(body: bytes) -> ForkRequest:
    try:
        request = msgspec.json.decode(body or b"{}", type=ForkRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RequestError(f"bad fork body: {exc}", code=REQ_BAD_BODY) from None
    except RecursionError:
        raise RequestError("bad fork body: nested too deep", code=REQ_BAD_BODY) from None
    if request.at < 0:
        raise RequestError('a fork needs "at": the seq its history ends at', code=REQ_BAD_BODY)
    return request


async def fork_for(
    edge: Edge, principal: Principal | None, source_id: str, *, at: int | None, run_id: str | None
) -> ForkResult:
    """Check the caller may read ``source_id`` and write the fork, then fork (see the module docstring)."""
    await edge.gate.check_run(principal, source_id, "read")
    source = await edge.store.run(source_id)
    if source is None:
        raise UnknownRun(f"no run {source_id!r} in the replay log")
    run_id = run_id or new_random_ulid("run_")
    if principal is not None:
        await authorize_write(edge.gate, principal, run_id)
    # Every check before the fork's id is claimed: a refused fork claims nothing.
    _fork, existing = await check_fork(edge.store, source, at=at, run_id=run_id)
    if existing is None and await edge.bus.bounds((run_id, "raw")) is not None:
        raise RunExists(f"run id {run_id!r} is taken (its events are on their way to the replay log)")
    with edge.quotas.stream(principal.token_id if principal else ""):  # a copy holds one of the token's streams
        if principal is not None:
            owner = await edge.gate.claim(run_id, principal.tenant, run_id)
            if owner.tenant != principal.tenant:
                raise RunExists(f"run id {run_id!r} is taken")
        return await fork_run(edge.store, source_id, at=at, run_id=run_id, bus=edge.bus, source=source)


def answer(result: ForkResult) -> dict[str, Any]:
    fork = result.fork
    return {"run_id": fork.run_id, "forked_from": {"run_id": fork.source_id, "at": fork.at},
            "created": result.created}


async def with_forks(edge: Edge, principal: Principal | None, infos: Sequence[RunInfo]) -> list[RunInfo]:
    """``infos`` with ``forked_from`` and the forks the caller may see (a token's ``runs``) filled in."""
    found = await edge.store.with_forks(infos)
    for info in found:
        info.forks = [fork for fork in info.forks if principal is None or principal.covers(fork.run_id)]
    return found
