"""The bus, selected by URL scheme; each backend's client loads only when used.

=====================  ==========================================
``memory://``          in-process (the embedded default)
``redis://``           Redis Streams (``rediss://`` for TLS)
``redis+cluster://``   Redis Cluster
``kafka://h:p[,h:p]``  Kafka (aiokafka)
=====================  ==========================================
"""

from __future__ import annotations

from typing import Any

from ..core.loader import load_entry, url_scheme
from .base import (
    Append,
    Bus,
    Consumer,
    ControlCommand,
    DeadLetter,
    Delivery,
    Entry,
    Fetched,
    StreamKey,
    View,
)

BACKENDS: dict[str, str] = {
    "memory": "runwire.bus.memory.bus:MemoryBus",
    "redis": "runwire.bus.redis.bus:RedisBus",
    "rediss": "runwire.bus.redis.bus:RedisBus",
    "redis+cluster": "runwire.bus.redis.bus:RedisBus",
    "kafka": "runwire.bus.kafka.bus:KafkaBus",
    "http": "runwire.bus.http.bus:HttpBus",
    "https": "runwire.bus.http.bus:HttpBus",
}


def open_bus(url: str, **options: Any) -> Bus:
    """The bus for ``url`` (not yet connected: ``async with open_bus(url) as bus``)."""
    known = ", ".join(f"{s}://" for s in BACKENDS)
    unknown = f"unsupported bus URL {url!r}; use one of {known}"
    bus: Bus = load_entry(BACKENDS, url_scheme(url), unknown)(url, **options)
    return bus


__all__ = [
    "BACKENDS",
    "Append",
    "Bus",
    "Consumer",
    "ControlCommand",
    "DeadLetter",
    "Delivery",
    "Entry",
    "Fetched",
    "StreamKey",
    "View",
    "open_bus",
]
