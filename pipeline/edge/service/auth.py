"""Bearer tokens: HS256 JWTs scoping a client to one tenant, some runs and some scopes.

Claims: ``tenant`` (str), ``runs`` (a list of run ids, or ``"*"`` for all of
the tenant's runs), ``scopes`` (``read``, ``write``, ``control``, ``ops`` — the
last for ``/metrics``, process-wide figures of every tenant), ``exp``.
A token travels as ``Authorization: Bearer …`` or, for ``EventSource``
which can't send headers, as ``?access_token=…``.

A run's tenant is its **claim** in the replay log (recorded by the first
entrance that wrote to it, see :mod:`.authz`), else the log's run metadata,
else the ``tenant`` of the run's first event in the hot tier. A run of another
tenant answers 404 exactly like a run that does not exist, so a reader can't
probe for other tenants' run ids. The write rule is in :mod:`.authz`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import jwt
import msgspec

from ...bus.ports import DeliveryStreams
from ...core.errors import AuthError, UnknownRun
from ...store.base import RunOwner
from ...store.ports import Ownership, RunCatalogue

Scope = Literal["read", "write", "control", "ops"]
SCOPES: tuple[str, ...] = ("read", "write", "control", "ops")
ALGORITHM = "HS256"


class Principal(msgspec.Struct, kw_only=True, frozen=True):
    """Who a token speaks for."""

    tenant: str
    runs: tuple[str, ...] | None = None
    """Run ids the token may touch; None means every run of the tenant."""
    scopes: frozenset[str] = frozenset()
    token_id: str = ""
    """Which token this is (a digest of it, never the token): what quotas count by."""

    def covers(self, run_id: str) -> bool:
        return self.runs is None or run_id in self.runs


def issue_token(
    secret: str,
    *,
    tenant: str,
    runs: Sequence[str] | None = None,
    scopes: Sequence[str] = ("read",),
    ttl_s: float = 3600.0,
) -> str:
    """A signed token (``runs=None`` → all of the tenant's runs)."""
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise AuthError(f"unknown scopes {sorted(unknown)}; use {', '.join(SCOPES)}")
    claims = {
        "tenant": tenant,
        "runs": "*" if runs is None else list(runs),
        "scopes": list(scopes),
        "exp": int(time.time() + ttl_s),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_token(secret: str, token: str) -> Principal:
    """The principal of a valid token; AuthError(401) when it is bad or expired."""
    try:
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "tenant"]}
        )
    except jwt.ExpiredSignatureError:
        raise AuthError("token expired") from None
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    tenant, runs, scopes = claims.get("tenant"), claims.get("runs", "*"), claims.get("scopes", [])
    if not isinstance(tenant, str) or not isinstance(scopes, list):
        raise AuthError("invalid token: tenant must be a string and scopes a list")
    if runs != "*" and not (isinstance(runs, list) and all(isinstance(r, str) for r in runs)):
        raise AuthError('invalid token: runs must be "*" or a list of run ids')
    return Principal(
        tenant=tenant,
        runs=None if runs == "*" else tuple(runs),
        scopes=frozenset(str(s) for s in scopes),
        token_id=hashlib.sha256(token.encode()).hexdigest()[:24],
    )


def token_of(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The bearer token of a request: the Authorization header, else ``?access_token=``."""
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return query.get("access_token") or None


class OwnedRuns(RunCatalogue, Ownership, Protocol):
    """What the gate asks the replay log: a run's entry, and whose the run is."""


class Gate:
    """Decides what a request may do. With no secret every request is let through."""

    def __init__(self, secret: str | None, bus: DeliveryStreams, store: OwnedRuns, *, refusal_floor_s: float = 0.0) -> None:
        self.secret = secret
        self.refusal_floor_s = refusal_floor_s
        self.bus = bus
        self.store = store
        self._tenants: dict[str, str | None] = {}
        self._owners: dict[str, RunOwner] = {}
        """Claims seen by this process (a claim never changes while its run is kept)."""

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def principal(self, headers: Mapping[str, str], query: Mapping[str, str]) -> Principal | None:
        """The caller (None when auth is off); AuthError(401) without a valid token."""
        if self.secret is None:
            return None
        token = token_of(headers, query)
        if not token:
            raise AuthError("missing bearer token (Authorization header or ?access_token=)")
        return verify_token(self.secret, token)

    def require_scope(self, principal: Principal | None, scope: str) -> None:
        if principal is not None and scope not in principal.scopes:
            raise AuthError(f"token lacks the {scope!r} scope", status=403)

    async def check_run(self, principal: Principal | None, run_id: str, scope: str) -> None:
        """AuthError(403) without the scope; UnknownRun when the run is not the caller's.

        An UnknownRun comes no sooner than ``refusal_floor_s`` after the check
        began, whether the run is another tenant's or doesn't exist.
        """
        if principal is None:
            return
        self.require_scope(principal, scope)
        started = time.monotonic()
        try:
            await self._check_tenant(principal, run_id, scope)
        except UnknownRun:
            await self.pad_refusal(started)
            raise

    async def pad_refusal(self, started: float) -> None:
        """Sleep until ``refusal_floor_s`` after ``started`` (a ``time.monotonic()``)."""
        left = self.refusal_floor_s - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)

    async def _check_tenant(self, principal: Principal, run_id: str, scope: str) -> None:
        if not principal.covers(run_id):
            raise UnknownRun(f"no run {run_id!r}")
        tenant = await self.tenant_of(run_id)
        if tenant is None and principal.runs is None and scope != "write":
            raise UnknownRun(f"no run {run_id!r}")
        if tenant is not None and tenant != principal.tenant:
            raise UnknownRun(f"no run {run_id!r}")

    async def tenant_of(self, run_id: str) -> str | None:
        """The run's tenant, or None for a run nobody has seen.

        The tenant its events carry wins over an entrance's claim: the workers give
        a run to its first writer's tenant, so a claim made at an edge while another
        tenant's events were already on the bus (a squatted id) reads nothing of them.
        Known once the run has events (then cached); until then the claim's.
        """
        if run_id in self._tenants:
            return self._tenants[run_id]
        tenant = await self._logged_tenant(run_id)
        if tenant is None:
            owner = await self.owner(run_id)
            return owner.tenant if owner is not None else None
        if len(self._tenants) > 100_000:
            self._tenants.clear()
        self._tenants[run_id] = tenant
        return tenant

    async def _logged_tenant(self, run_id: str) -> str | None:
        info = await self.store.run(run_id)
        if info is not None and info.tenant is not None:
            return info.tenant
        first = await self.bus.read((run_id, "raw"), 0, limit=1)
        return first[0].tenant if first else None

    async def owner(self, run_id: str) -> RunOwner | None:
        """The run's recorded claim, or None when no entrance has claimed it."""
        owner = self._owners.get(run_id)
        if owner is None:
            owner = await self.store.run_owner(run_id)
            if owner is not None:
                self._remember(run_id, owner)
        return owner

    async def claim(self, run_id: str, tenant: str, root_id: str) -> RunOwner:
        """The run's owner, claiming it for ``tenant`` (tree root ``root_id``) if unclaimed.

        A run already seen in the hot tier (published straight to the bus)
        is claimed for the tenant of its events.
        """
        owner = await self.owner(run_id)
        if owner is None:
            hot = await self.bus.read((run_id, "raw"), 0, limit=1)
            claimant = hot[0].tenant if hot and hot[0].tenant is not None else tenant
            owner = await self.store.claim_run(run_id, claimant, root_id)
            self._remember(run_id, owner)
        return owner

    def _remember(self, run_id: str, owner: RunOwner) -> None:
        if len(self._owners) > 100_000:
            self._owners.clear()
        self._owners[run_id] = owner
