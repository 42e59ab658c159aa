"""The Kafka bus's life marker: noticing a broker that lost its state.

A broker on volatile storage (Tansu on ``memory://``) restarted empty has
none of runwire's topics, yet it acknowledges records produced to a topic it
no longer has, and never makes them readable. So an acknowledgement after a
lost connection proves nothing until the broker is known to be the one it
was.

The marker is one record in topic ``<prefix>.life`` (one partition), a random
token written by the first bus that finds the topic without one. Each bus
remembers the token it saw; after any of its producer's connections closed it
reads the marker again before producing (and after a send that a closed
connection overlapped). A missing topic, an empty one or another token means
the broker lost its state since: the topics are created again with their
partition counts, a new token is written, and the records acknowledged meanwhile
are sent again (:meth:`~runwire.bus.kafka.io.KafkaLink.send`; the duplicates
are dropped by seq where the records are read).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from aiokafka.admin import NewTopic

from .io import KafkaLink, guard

LIFE_KIND = "life"
log = logging.getLogger("runwire.bus")


class LifeMarker:
    """The token of the broker's life this bus writes to (see the module docstring)."""

    def __init__(
        self, link: KafkaLink, topic: str, create_topics: Callable[[], Awaitable[None]]
    ) -> None:
        self.link = link
        self.topic = topic
        self.create_topics = create_topics
        self.token: bytes | None = None

    async def _current(self) -> bytes | None:
        """The marker's token on the broker (None without the topic or a record in it)."""
        metadata = await guard("metadata", self.link.producer.client.fetch_all_metadata())
        if not metadata.partitions_for_topic(self.topic):
            return None
        # a reader's position can wait for ever on a broker gone meanwhile
        timeout = self.link.options.request_timeout_ms / 1000 + 5
        last = await guard("read", asyncio.wait_for(self.link.last_records(self.topic, [0]), timeout))
        record = last.get(0)
        return None if record is None else bytes(record.value)

    async def _mark(self) -> bytes:
        """Create the topics and write a new token (unless another bus wrote one first)."""
        await self.create_topics()
        await self.link.ensure_topics([NewTopic(self.topic, 1, 1)])
        current = await self._current()
        if current is None:
            token = uuid.uuid4().hex.encode()
            await self.link.produce(self.topic, [(0, None, token, [])])
            current = await self._current() or token
        return current

    async def start(self) -> None:
        """Adopt the broker's token (writing one if it has none) at the bus's start."""
        self.token = await self._current() or await self._mark()

    async def lost(self) -> bool:
        """Whether the broker lost its state since the token was read; if so the topics
        are there again, with a new token, when this returns."""
        current = await self._current()
        if current is not None and current == self.token:
            return False
        log.warning("kafka: the broker lost its state (its life marker %s is %s); "
                    "creating the topics again", self.topic, "another" if current else "gone")
        self.token = current if current is not None else await self._mark()
        await guard("metadata", self.link.producer.client.force_metadata_update())
        return True
