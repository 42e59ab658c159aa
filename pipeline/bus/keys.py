"""Key and topic names, in one place.

Every Redis key runwire writes is built here (``prefix`` defaults to ``rw``;
set ``?prefix=`` in the bus URL to share one Redis between deployments):

==========================================  =====================================
key                                         what it holds
==========================================  =====================================
``{rw:ingest:<shard>}``                     ingest shard stream (one per shard)
``rw:{<run>}:raw`` / ``rw:{<run>}:shaped``  delivery stream of a run, entry id
                                            ``<seq>-0``, field ``e`` = event JSON
``rw:{<run>}:meta:<view>``                  hash: ``last`` seq + writer ``state``
``rw:{<run>}:control``                      control stream of a run
``{rw:group:<group>}:members``              zset: live members, score = expiry ms
``{rw:group:<group>}:lease:<shard>``        string: the member owning a shard
``rw:deadletter``                           dead-letter stream
==========================================  =====================================

The ``{…}`` parts are Redis Cluster hash tags: one run's keys share a slot
(the append script touches its stream and meta key together), one group's
coordination keys share a slot (the rebalance script touches them all), and
each ingest shard lands in its own slot so shards spread over the nodes.
Braces and ``%`` inside run ids and group names are percent-escaped so a
hash tag can never be cut short and two names can never map to one key.
"""

from __future__ import annotations

import zlib

DEFAULT_PREFIX = "rw"
DATA_FIELD = b"e"
"""The one field of every stream entry: the canonical JSON of the event."""


def shard_for(root_run_id: str, shards: int) -> int:
    """Stable shard of a root run: CRC32 of its id modulo the shard count."""
    return zlib.crc32(root_run_id.encode()) % shards


def escape(name: str) -> str:
    """A name safe inside a hash tag (``%``, ``{``, ``}`` percent-escaped)."""
    if "%" in name or "{" in name or "}" in name:
        return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return name


def ingest_key(prefix: str, shard: int) -> str:
    return f"{{{prefix}:ingest:{shard}}}"


def delivery_key(prefix: str, run_id: str, view: str) -> str:
    return f"{prefix}:{{{escape(run_id)}}}:{view}"


def meta_key(prefix: str, run_id: str, view: str) -> str:
    return f"{prefix}:{{{escape(run_id)}}}:meta:{view}"


def control_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:{{{escape(run_id)}}}:control"


def group_tag(prefix: str, group: str) -> str:
    return f"{{{prefix}:group:{escape(group)}}}"


def members_key(prefix: str, group: str) -> str:
    return f"{group_tag(prefix, group)}:members"


def lease_key(prefix: str, group: str, shard: int) -> str:
    return f"{group_tag(prefix, group)}:lease:{shard}"


def dead_letter_key(prefix: str) -> str:
    return f"{prefix}:deadletter"



# ---- Kafka ------------------------------------------------------------------
# Topics are ``<prefix>.<kind>`` (``prefix`` defaults to ``rw``). Records are keyed:
# ingest by the root run id, delivery and control by the run id; the partition is
# ``shard_for(key, partitions)`` so a run's shard is the same on every backend.
KAFKA_INGEST = "ingest"
KAFKA_DELIVERY = "delivery"
KAFKA_CONTROL = "control"
KAFKA_DEAD_LETTER = "deadletter"


def kafka_topic(prefix: str, kind: str) -> str:
    """The Kafka topic of one kind (``ingest``, ``delivery``, ``control``, ``deadletter``)."""
    return f"{prefix}.{kind}"


def kafka_marks_topic(prefix: str, group: str) -> str:
    """A consumer group's delivery marks (what each partition's owner handed out).

    Characters a topic name can't hold are written as ``_<hex>``.
    """
    safe = "".join(c if c.isascii() and (c.isalnum() or c in ".-") else f"_{ord(c):x}" for c in group)
    return f"{prefix}.marks.{safe}"


def kafka_group(prefix: str, group: str) -> str:
    """The Kafka consumer group id of a runwire group: prefixed like the topics."""
    return f"{prefix}.{group}"
