"""``kafka://host:port[,host:port]``: the bus on Kafka (aiokafka).

``bus`` (the :class:`~runwire.bus.base.Bus`), ``consumer`` (an ingest group's member, its
partitions' bookkeeping), ``io`` (the clients and the record format), ``tail`` (the delivery
topic read into the hot tier), ``hot`` (the hot tier), ``life`` (the broker's life marker: a
broker that lost its state).
"""

from .bus import KafkaBus

__all__ = ["KafkaBus"]
