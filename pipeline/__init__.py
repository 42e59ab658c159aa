"""runwire: the event pipeline between AI agents and the people watching them.

The public API, one import away::

    from runwire import Publisher, open_bus

    async with Publisher(open_bus("redis://localhost:6379")) as pub:
        run = pub.run("run_123", tenant="acme")
        await run.emit("text.delta", {"text": "Hello"})
        await run.finish()

========================  =====================================================
name                      what it is
========================  =====================================================
``Publisher``, ``Run``    the SDK an agent embeds (:mod:`runwire.sdk`)
``Event``, ``make``,      the canonical envelope and its codec; the event
``decode``, ``encode``,   types (``TextDelta``, ``ToolStart`` …) are in
``EVENT_CLASSES``         :mod:`runwire.core.events`
``open_bus``              a bus by URL: ``memory://``, ``redis://``,
                          ``redis+cluster://``, ``kafka://``
``open_store``            a replay log by URL: ``sqlite:///…``, ``postgresql://…``
``export_run``,           offline jobs over the replay log (:mod:`runwire.jobs`)
``play_run``
``RunwireError``          the root of the error tree (:mod:`runwire.core.errors`)
========================  =====================================================

The folders, bottom to top: ``core`` (types, codec, errors), ``protocols``,
``bus`` and ``store`` (backends), ``processing`` (the worker's logic),
``sdk``, ``jobs``, ``edge`` (the ASGI app), and ``workers`` (the
processes). Imports point down; this package's names load lazily, so
importing any part loads only what that part needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.envelope import EVENT_CLASSES, Event, decode, encode, make
from .core.errors import RunwireError

if TYPE_CHECKING:
    from .bus import open_bus
    from .jobs.replay import export_run, play_run
    from .sdk.publisher import Publisher, Run
    from .store import open_store

_LAZY = {
    "Publisher": "runwire.sdk.publisher",
    "Run": "runwire.sdk.publisher",
    "open_bus": "runwire.bus",
    "open_store": "runwire.store",
    "export_run": "runwire.jobs.replay",
    "play_run": "runwire.jobs.replay",
}

__all__ = [
    "EVENT_CLASSES", "Event", "Publisher", "Run", "RunwireError", "decode", "encode", "export_run", "make",
    "open_bus", "open_store", "play_run",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runwire' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
