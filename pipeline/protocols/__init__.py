"""Protocol codecs, selected by name; each loads only when used.

Ingest formats: koder, loom, loom-export, cogency, cogency-wire, loom-mcp.
Egress formats: koder, loom, loom-export, cogency, loom-mcp, streamweave, agui, ai-sdk, a2a.
See ``docs/protocols.md`` for the mapping table.
"""

from __future__ import annotations

from typing import Any

from ..core.loader import load_entry
from .base import Egress, Ingest

INGEST: dict[str, str] = {
    "koder": "runwire.protocols.koder:KoderIngest",
    "loom": "runwire.protocols.loom:LoomIngest",
    "loom-export": "runwire.protocols.loom_export:LoomExportIngest",
    "cogency": "runwire.protocols.cogency:CogencyIngest",
    "cogency-wire": "runwire.protocols.cogency_wire:CogencyWireIngest",
    "loom-mcp": "runwire.protocols.loom_mcp:LoomMcpIngest",
}
EGRESS: dict[str, str] = {
    "koder": "runwire.protocols.koder:KoderEgress",
    "loom": "runwire.protocols.loom:LoomEgress",
    "loom-export": "runwire.protocols.loom_export:LoomExportEgress",
    "cogency": "runwire.protocols.cogency:CogencyEgress",
    "loom-mcp": "runwire.protocols.loom_mcp:LoomMcpEgress",
    "streamweave": "runwire.protocols.streamweave:StreamWeaveEgress",
    "agui": "runwire.protocols.agui:AguiEgress",
    "ai-sdk": "runwire.protocols.ai_sdk:AiSdkEgress",
    "a2a": "runwire.protocols.a2a:A2AEgress",
}


def _load(table: dict[str, str], name: str, kind: str) -> Any:
    known = ", ".join(sorted(table))
    return load_entry(table, name, f"unknown {kind} format {name!r}; known: {known}")


def ingest(name: str, **options: Any) -> Ingest:
    """A fresh ingest codec for one stream of format ``name``."""
    codec: Ingest = _load(INGEST, name, "ingest")(**options)
    return codec


def egress(name: str, **options: Any) -> Egress:
    """A fresh egress codec for one stream of format ``name``."""
    codec: Egress = _load(EGRESS, name, "egress")(**options)
    return codec


__all__ = ["EGRESS", "INGEST", "Egress", "Ingest", "egress", "ingest"]
