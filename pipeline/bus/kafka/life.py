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

**Stamps.** A batch in flight when the broker went away is sent again by
aiokafka itself once a broker answers on the address — a broker restarted
empty then stores it in its new life, ahead of the former life's batches the
publisher sends again when it finds the loss, and a reader would meet the
run's later events before its earlier ones (an ``x.gap``, then the earlier
ones dropped as late). So a publisher stamps each ingest record with the
token it knew when producing it (:data:`~runwire.bus.kafka.io.LIFE_HEADER`),
and a reader drops a record stamped with another life's token
(:meth:`LifeMarker.of_former_life`): its publisher keeps it as of the former
life until it is committed in its own, and sends it again
(:mod:`runwire.bus.kafka.retain`). A record without a stamp is read as before.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.admin import NewTopic

from ...core.errors import BusUnavailable
from .io import LIFE_HEADER, KafkaLink, guard

LIFE_KIND = "life"
FORMER_TOKENS = 16
"""Tokens of former lives remembered (a record stamped with one is dropped without asking)."""
log = logging.getLogger("runwire.bus")


class LifeMarker:
    """The token of the broker's life this bus writes to (see the module docstring)."""

    def __init__(
        self, link: KafkaLink, topic: str, create_topics: Callable[[], Awaitable[None]]
    ) -> None:
        self.link = link
        self.topic = topic
        self.create_topics = create_topics
        self.former: deque[bytes] = deque(maxlen=FORMER_TOKENS)
        self._told: deque[bytes] = deque(maxlen=FORMER_TOKENS)
        """Former tokens a record was dropped for (one warning each)."""
        self.dropped = 0
        """Ingest records read stamped with a former life (:meth:`of_former_life`)."""

    @property
    def token(self) -> bytes | None:
        return self.link.token

    @token.setter
    def token(self, token: bytes | None) -> None:
        if self.link.token is not None and token != self.link.token:
            self.former.append(self.link.token)
        self.link.token = token

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

    def is_current(self, headers: Sequence[tuple[str, bytes]]) -> bool:
        """Whether a record with these headers is of the current life or unstamped (read as it
        is, without :meth:`of_former_life`)."""
        for name, value in headers:
            if name == LIFE_HEADER:
                return value == self.link.token
        return True

    async def of_former_life(self, headers: Sequence[tuple[str, bytes]]) -> bool:
        """Whether an ingest record with these headers was stamped in another life of the
        broker than its current one (see the module docstring): it is to be dropped.

        A token neither current nor known as former is checked against the broker first: the
        record may be of a new life this process has not seen yet, or this process may hold a
        token another bus's replaced (two wrote one at once). When the broker can't be asked,
        the record is read (as a record without a stamp is).
        """
        for name, value in headers:
            if name == LIFE_HEADER:
                token = bytes(value)
                break
        else:
            return False
        if token == self.token:
            return False
        if token not in self.former:
            try:
                await self.link.check_life()
            except BusUnavailable:
                return False
            if token == self.token:
                return False
            self.former.append(token)
        if token not in self._told:
            self._told.append(token)
            log.warning("kafka: ingest records stamped with a former life of the broker are dropped "
                        "(sent again by aiokafka as it went away; their publishers send them again)")
        self.dropped += 1
        return True
