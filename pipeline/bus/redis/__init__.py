"""``redis://``, ``rediss://``, ``redis+cluster://``: the bus on Redis Streams.

``bus`` (the :class:`~runwire.bus.base.Bus`), ``consumer`` (an ingest group's member: leases,
claims), ``link`` (the client, its scripts, error classification), ``scripts`` (the Lua),
``entries`` (entries of several events, the delivery streams' three keys), ``retain``
(ingest entries kept until confirmed), ``trim`` (ingest trimmed once every group acked).
"""

from .bus import RedisBus

__all__ = ["RedisBus"]
