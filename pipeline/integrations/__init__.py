"""Agents built with a framework publish their runs in three lines.

::

    from runwire import Publisher
    from runwire.integrations import pydantic_ai

    async with Publisher.connect("redis://localhost:6379") as pub:
        output = await pydantic_ai.run(agent, "What is the weather?", publisher=pub)

One module per framework — :mod:`.pydantic_ai`, :mod:`.openai_agents`,
:mod:`.langgraph`, :mod:`.google_adk` — each installed by an extra
(``pip install "runwire[pydantic-ai]"`` …) and each with one entry point of
the same shape, ``await run(agent, input, *, publisher, run_id=None, **kwargs)``.
What they share (a run opened as a child of the run around it, tool calls
paired and timed, a client's cancel or approval reaching the framework,
publishing that never kills the agent) is :mod:`.agentrun`; how a value the
framework hands over becomes JSON is :mod:`.values`. ``import runwire``
imports none of this; ``docs/integrations.md`` has the mapping tables.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

EXTRAS = {
    "pydantic_ai": ("pydantic-ai", "pydantic_ai"),
    "openai_agents": ("openai-agents", "agents"),
    "langgraph": ("langgraph", "langgraph"),
    "google_adk": ("google-adk", "google.adk"),
}
"""Integration module → (the extra that installs its framework, the framework's import name)."""


def require(integration: str) -> ModuleType:
    """The framework an integration drives, imported; ``ImportError`` naming the extra when the
    framework is not installed."""
    extra, module = EXTRAS[integration]
    try:
        return import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"runwire.integrations.{integration} needs {module}: pip install \"runwire[{extra}]\""
        ) from exc
