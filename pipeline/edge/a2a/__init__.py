"""A2A 1.0 at the edge: every run is a task (``docs/a2a.md``).

``a2a_routes(edge)`` is the whole wing: the agent cards, the JSON-RPC and HTTP+JSON
bindings (:mod:`.bindings`), the methods on runwire's runs (:mod:`.methods`),
a task's stream with exact resume (:mod:`.stream`) and A2A's errors (:mod:`.errors`).
Events map to A2A objects in one place, :mod:`runwire.protocols.a2a`.
"""

from __future__ import annotations

from .bindings import a2a_routes

__all__ = ["a2a_routes"]
