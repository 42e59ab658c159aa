"""How long the broker may hold an ingest consumer's fetch for records to arrive.

aiokafka keeps one fetch in flight per broker, and leaves out of it the
partitions whose fetched records are not taken yet. Once they are taken, their
next fetch waits for the one in flight to come back, which the broker holds up
to ``fetch_max_wait_ms`` when the partitions it asks for have nothing new. So a
long hold delays a backlog behind caught-up partitions (faust's 1,500 ms: the
last of a backlog came in steps a second apart), and a short one makes an idle
consumer ask many times a second (at 100 ms faust's consumer thread spent ~12 ms
of CPU a second, against ~4 ms at 400).

:func:`hold_fetches` sets the hold of each fetch as it is built:
:data:`BACKLOG_FETCH_WAIT_MS` while some partition is left out of it (fetched
records waiting to be taken, or paused), else :data:`IDLE_FETCH_WAIT_MS` —
every partition is then in the fetch, which Kafka answers as soon as any of them
has a record (``docs/bus.md`` § Kafka, "Fetch wait").
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer

BACKLOG_FETCH_WAIT_MS = 100
"""The hold of a fetch that leaves partitions out (their records wait to be taken)."""
IDLE_FETCH_WAIT_MS = 400
"""The hold of a fetch that asks for every partition. Kafka answers a held fetch as a record
comes; Tansu looks again at intervals: a record after a quiet spell came within ~135 ms with
holds of 250 to 400 ms, after ~250 ms with 500 ms and more (faust's 1,500)."""


def fetch_hold(fetcher: Any, assignment: Any) -> int:
    """The hold for the fetch ``fetcher`` builds now for the partitions of ``assignment``."""
    if fetcher._records:
        return BACKLOG_FETCH_WAIT_MS
    for tp in assignment.tps:
        if assignment.state_value(tp).paused:
            return BACKLOG_FETCH_WAIT_MS
    return IDLE_FETCH_WAIT_MS


def hold_fetches(consumer: AIOKafkaConsumer) -> None:
    """Let :func:`fetch_hold` set the hold of each fetch of a started ``consumer``.

    aiokafka's fetcher reads its ``_fetch_max_wait_ms`` as its
    ``_get_actions_per_node`` builds each request: that method is wrapped on the
    fetcher (an instance attribute; aiokafka has no public way to vary the hold).
    """
    fetcher: Any = consumer._fetcher
    build = fetcher._get_actions_per_node

    def held(assignment: Any) -> Any:
        fetcher._fetch_max_wait_ms = fetch_hold(fetcher, assignment)
        return build(assignment)

    fetcher._get_actions_per_node = held
