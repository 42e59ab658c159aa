"""The agent card (A2A 1.0 form): ``/.well-known/agent-card.json`` for the agent ``default``, and
``/a2a/{agent}/.well-known/agent-card.json`` for each requests channel an agent consumes.

``supportedInterfaces`` name the two bindings served (JSON-RPC at ``/a2a/{agent}``,
HTTP+JSON under ``/a2a/{agent}/rest``), both ``protocolVersion`` ``1.0``: a card
without them reads to a 1.x client as a 0.3 agent.
"""

from __future__ import annotations

from typing import Any

from ...bus.requests import DEFAULT_CHANNEL
from ...protocols.a2a import RESUME_EXTENSION
from .methods import CURSOR_HEADER

PROTOCOL_VERSION = "1.0"
BEARER = "bearer"


def agent_card(base_url: str, agent: str = DEFAULT_CHANNEL, *, secured: bool) -> dict[str, Any]:
    """The card of ``agent`` served at ``base_url`` (scheme and host, no trailing slash)."""
    root = f"{base_url}/a2a/{agent}"
    card: dict[str, Any] = {
        "name": agent,
        "description": (f"The runwire agent {agent!r}: every run it publishes is a task; "
                        "runs of any agent can be watched, listed and cancelled."),
        "version": "1.0.0",
        "supportedInterfaces": [
            {"url": root, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {"url": f"{root}/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
        ],
        "capabilities": {
            "streaming": True,
            "pushNotifications": True,
            "extensions": [{
                "uri": RESUME_EXTENSION,
                "description": (f"Exact resume: send the cursor of the last response seen (its metadata "
                                f"[{RESUME_EXTENSION!r}].cursor) as the {CURSOR_HEADER} header on "
                                "SubscribeToTask; the stream continues with the next response, on any "
                                "edge, nothing missed and nothing twice."),
                "required": False,
                "params": {"header": CURSOR_HEADER},
            }],
        },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{
            "id": agent,
            "name": agent,
            "description": f"Runs of the agent {agent!r}, streamed as they happen.",
            "tags": ["runwire", "streaming"],
        }],
    }
    if secured:
        card["securitySchemes"] = {BEARER: {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "bearerFormat": "JWT",
            "description": "A runwire token: its tenant, its runs and its scopes (read, write, control)."}}}
        card["securityRequirements"] = [{"schemes": {BEARER: {"list": []}}}]
    return card
