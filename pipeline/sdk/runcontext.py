"""A run's place in its tree, as a small token that crosses service boundaries.

A sub-agent in another service knows its parent only by id. Named that way,
a grandchild would claim the parent as its root, land on the parent's ingest
shard, and never reach the real root's stream. The token carries the tree::

    token = run.context()                       # in the parent's service
    child = pub.run("child-1", context=token)   # in the other service
    # or over HTTP ingest: header ``Runwire-Run-Context: <token>``

It is opaque to callers (``rw1.`` + base64url of a compact JSON object
``{"run", "root", "tenant"}``) and **not a credential**: it states a parent
and a root, which every entrance then authorizes for the caller's tenant
like any ``parent_id``/``root_id`` an event claims.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from ..core.envelope import RunId, RunRef
from ..core.errors import RequestError

CONTEXT_HEADER = "Runwire-Run-Context"
"""The HTTP ingest header that carries a token."""
PREFIX = "rw1."
MAX_TOKEN_CHARS = 1024


class RunContext(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The run a child is started under: ``run`` (the parent), its ``root``, its ``tenant``."""

    run: RunId
    root: RunId | None = None
    """The tree's root; None when ``run`` is itself a root."""
    tenant: RunRef | None = None

    @property
    def root_id(self) -> str:
        return self.root or self.run

    def token(self) -> str:
        """The opaque string to hand to another service."""
        return PREFIX + base64.urlsafe_b64encode(_encoder.encode(self)).rstrip(b"=").decode()

    @classmethod
    def parse(cls, token: str) -> RunContext:
        """The context a token carries; ``RequestError`` (KAI-STREAM-REQ-0001) for anything else."""
        if len(token) > MAX_TOKEN_CHARS or not token.startswith(PREFIX):
            raise RequestError(f"not a run context token (they start with {PREFIX!r})")
        body = token[len(PREFIX):]
        try:
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            return _decoder.decode(data)
        except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
            raise RequestError(f"run context token does not decode: {exc}") from None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunContext)
