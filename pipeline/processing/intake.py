"""A fetched batch's deliveries → the events a worker processes, poison sorted out.

A delivery holds one event, or a whole ingest entry of several
(:meth:`~runwire.bus.Consumer.fetch` with ``whole``: their canonical JSON lines
joined by newlines). The rule is a batch of valid events: it is decoded by
one msgspec call and each distinct timestamp is read once, with no pass per
event. Otherwise every event is decoded on its own, so a bad one is
dead-lettered alone and the events around it go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from ..bus.base import Fetched, each_event, event_count
from ..core.envelope import MAX_FRAME_BYTES, Event, decode_joined, decode_many, ts_ms
from ..core.errors import ProtocolError
from ..core.events import new_timestamps
from .processor import validate

_DATA = attrgetter("data")


def decode_batch(
    deliveries: Sequence[Fetched],
) -> tuple[list[Fetched], list[Event], list[tuple[Fetched, ProtocolError]], bool]:
    """``(good, events, poison, whole)``: the deliveries of valid events and those events,
    the deliveries of events that are not valid with the reason, and whether ``good`` holds
    whole entries (then ``events`` counts more than ``good``; otherwise they pair up)."""
    count = event_count(deliveries)
    whole = count != len(deliveries)
    results: list[Event | ProtocolError] | None
    if whole:
        datas = list(map(_DATA, deliveries))
        results = None if max(map(len, datas)) > MAX_FRAME_BYTES else decode_joined(b"\n".join(datas), count)
    else:
        results = decode_many(list(map(_DATA, deliveries)))
    if results is not None and _all_valid(results):
        return list(deliveries), results, [], whole  # type: ignore[return-value]
    if whole:  # each event on its own: a bad one is dead-lettered alone
        deliveries = each_event(deliveries)  # (every one a Delivery now)
        results = decode_many(list(map(_DATA, deliveries)))
    assert results is not None
    good: list[Fetched] = []
    events: list[Event] = []
    poison: list[tuple[Fetched, ProtocolError]] = []
    for delivery, result in zip(deliveries, results, strict=True):
        if not isinstance(result, ProtocolError):
            try:
                validate(result)
            except ProtocolError as invalid:
                result = invalid
        if isinstance(result, ProtocolError):
            poison.append((delivery, result))
        else:
            good.append(delivery)
            events.append(result)
    return good, events, poison, False


def _all_valid(results: list[Event | ProtocolError]) -> bool:
    """Whether every result is an event :func:`validate` accepts (each distinct ``ts`` read once)."""
    if any(issubclass(kind, ProtocolError) for kind in set(map(type, results))):
        return False
    try:
        for ts in new_timestamps(results):  # (a ts read before is a valid one)
            ts_ms(ts)
    except ProtocolError:
        return False
    return True
