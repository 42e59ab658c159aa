"""The edge: an ASGI app fanning each run out to many SSE / WebSocket / NDJSON clients.

``create_app(bus, store, settings)`` builds it; ``docs/edge.md`` documents
the endpoints, parameters, formats, auth, limits and error codes.
"""

from __future__ import annotations

from .http.app import create_app
from .service.auth import Principal, issue_token, verify_token
from .settings import EdgeSettings

__all__ = ["EdgeSettings", "Principal", "create_app", "issue_token", "verify_token"]
