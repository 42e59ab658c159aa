"""``http://``, ``https://``: the publisher SDK over an edge's HTTP ingest.

``bus`` (the :class:`~runwire.bus.base.Bus`: ingest and control only).
"""

from .bus import HttpBus

__all__ = ["HttpBus"]
