"""Bus URL query options, converted and validated through one table.

``redis://host:6379/0?shards=16&maxlen=10000&ttl=86400&claim_idle_ms=30000``

Every option any backend understands is a field of :class:`BusOptions`
(with its default and bounds); each backend names the subset it accepts.
An unknown or ill-typed option is a :class:`~runwire.core.errors.ConfigError`
naming the option, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import msgspec

from ..core.errors import ConfigError

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class BusOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a bus URL's query string may set (each backend accepts a subset)."""

    shards: Positive = 16
    """Ingest shards (Redis streams / Kafka partitions); a root run's shard is CRC32(id) % shards."""
    maxlen: Positive = 10_000
    """Length bound of each delivery stream (Redis: approximate ``MAXLEN ~``)."""
    ttl: Positive = 86_400
    """Seconds a delivery/control stream is kept after its last append."""
    grace: Positive = 60
    """Seconds a finished run's delivery and control streams are kept after its terminal
    event (Redis: the keys; Kafka: the events in the hot tier); resumes after that read the
    replay log."""
    claim_idle_ms: Positive = 30_000
    """Default idle time after which another consumer claims a pending entry."""
    lease_ms: Positive = 10_000
    """How long a shard lease / group membership lives without renewal."""
    max_deliveries: Positive = 5
    """Past this many deliveries an entry is dead-lettered by the consumer."""
    max_backlog: Positive = 100_000
    """memory://: ingest entries kept (unacked by some group) before publish waits."""
    ingest_maxlen: NonNegative = 1_000_000
    """Redis: approximate length bound of each ingest shard stream (0 = unbounded)."""
    retain_bytes: NonNegative = 64 * 2**20
    """Redis: bytes of published ingest entries a process keeps until every consumer group has
    read and acked them, to publish them again if Redis loses them (0 = keep none; see
    :mod:`runwire.bus.redis.retain`)."""
    close_wait_ms: NonNegative = 5_000
    """Redis: how long closing a bus waits for the groups reading its shards to ack what it
    kept (shards no group reads are not waited for)."""
    dead_letter_maxlen: Positive = 10_000
    """Redis: approximate length bound of the dead-letter stream."""
    prefix: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "rw"
    """Redis: key prefix, so several deployments can share one Redis."""
    tail_poll_ms: Positive = 20
    """redis+cluster://: poll interval of a multi-slot ``tail``."""


def split_url(url: str, accepted: Iterable[str], passthrough: Iterable[str] = ()) -> tuple[
    BusOptions, str, dict[str, str]
]:
    """Parse ``url``'s query: runwire options, the URL without them, and passthrough options.

    ``accepted`` names the :class:`BusOptions` fields this backend understands;
    ``passthrough`` names client options left in the returned URL (e.g.
    redis-py's ``socket_timeout``). Anything else raises ConfigError.
    """
    parts = urlsplit(url)
    accepted_set, passthrough_set = set(accepted), set(passthrough)
    ours: dict[str, Any] = {}
    kept: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in accepted_set:
            ours[name] = value
        elif name in passthrough_set:
            kept[name] = value
        else:
            known = ", ".join(sorted(accepted_set | passthrough_set))
            raise ConfigError(f"unknown bus URL option {name!r} in {url!r}; known: {known}")
    try:
        options = msgspec.convert(ours, BusOptions, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad bus URL option in {url!r}: {exc}") from None
    query = "&".join(f"{k}={v}" for k, v in kept.items())
    bare = urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    return options, bare, kept
