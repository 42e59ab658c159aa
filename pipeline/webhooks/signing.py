"""Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

A secret is ``whsec_`` and the base64 of 32 random bytes — what the
``standardwebhooks`` library (and every receiver built on the spec) takes as
it is. The signed content is ``{id}.{timestamp}.{body}``; the signature is
``v1,`` and the base64 of its HMAC-SHA256 under the secret's bytes. Several
secrets (the current one and the previous one after a rotation) give several
signatures, separated by spaces, any of which a receiver accepts. Each
attempt is signed at its own time, so a retry a day later is not refused as
stale (receivers reject a timestamp older than 5 minutes).

Written here rather than imported: the library's signer needs its HTTP
client and date libraries, and the scheme is one HMAC.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as _random

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
"""The spec asks for 24 to 64 random bytes."""


def new_secret() -> str:
    """A fresh ``whsec_…`` secret."""
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256>`` of ``{msg_id}.{timestamp}.{body}`` under ``secret``."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), content, hashlib.sha256).digest()).decode()


def signed_headers(secrets: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt (``secrets`` space-separated; none:
    no ``webhook-signature``)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    keys = secrets.split()
    if keys:
        headers["webhook-signature"] = " ".join(signature(key, msg_id, timestamp, body) for key in keys)
    return headers
