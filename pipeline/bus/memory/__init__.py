"""``memory://``: the bus in one process (the embedded default).

``bus`` (the :class:`~runwire.bus.base.Bus`), ``consumer`` (an ingest group's member),
``state`` (what the bus holds: shard logs, delivery streams, control channels).
"""

from .bus import MemoryBus

__all__ = ["MemoryBus"]
