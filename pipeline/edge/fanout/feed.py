"""A feed: one (stream, format, profile, children) of the hub, and the clients reading it.

A feed owns one egress encoder, so each event is filtered and encoded once per
feed and the same frame goes to every client. An event a format cannot encode
becomes that feed's ``x.runwire.skipped`` frame and nothing else stops
(:func:`frame_or_skip`); a client's catch-up encodes with the same functions,
so live and resumed clients see the same frames.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from ...bus.base import StreamKey
from ...core import envelope
from ...core.envelope import Event, Extension, RunLifecycle, RunLifecyclePayload
from ...core.errors import PROTO_MALFORMED
from ...protocols import egress
from ...protocols.base import Egress
from ..metrics import EdgeMetrics
from .clients import ClientQueue
from .filters import event_filter
from .frames import Batch, Frame, drop_rank

log = logging.getLogger("runwire.edge.fanout.hub")
_json = msgspec.json.Encoder()


class FeedKey(NamedTuple):
    run_id: str
    view: str
    format: str
    profile: str
    children: str

    @property
    def stream(self) -> StreamKey:
        return (self.run_id, "raw" if self.view == "raw" else "shaped")


def is_stateless(format_name: str) -> bool:
    """Formats whose frames depend on the event alone (no priming, no preamble)."""
    return format_name == "koder"


class Feed:
    """One (stream, format, profile, children) and the clients reading it."""

    def __init__(self, key: FeedKey, position: int) -> None:
        self.key = key
        self.encoder: Egress = egress(key.format)
        self.accepts: Callable[[Event], bool] = event_filter(key.profile, key.children)
        self.position = position
        """Last seq this feed has encoded (live frames after it go to clients)."""
        self.clients: set[ClientQueue] = set()
        self.ready = asyncio.Event()
        self.failure: BaseException | None = None
        self.backlog: list[Event] = []
        self.terminal_seq: int | None = None

    def offer(self, event: Event, metrics: EdgeMetrics) -> None:
        """A live event of the stream: encode once, queue for every client."""
        frame = self.accept(event)
        if frame is not None:
            self.fan_out([frame], metrics)

    def accept(self, event: Event) -> Frame | None:
        """Advance past a live event; its frame when there is one to send now."""
        if not self.ready.is_set():
            self.backlog.append(event)
            return None
        if event.seq <= self.position:
            return None
        self.position = event.seq
        return self.encode(event)

    def encode(self, event: Event) -> Frame | None:
        """Filter and encode one event with this feed's encoder (updating its state).

        An event this feed's format cannot encode (an encoder bug, or a payload
        too deep for a recursive encoder) is skipped by this feed alone: its
        clients get a coded ``x.runwire.skipped`` frame in its place (same seq,
        so a resume continues after it), and the stream's other feeds, other
        runs and this feed's later events go on.
        """
        if not self.accepts(event):
            return None
        terminal = ends_stream(event)
        if terminal:
            self.terminal_seq = event.seq
        return frame_or_skip(self.encoder, event, terminal, self.key.format)

    def fan_out(self, frames: list[Frame], metrics: EdgeMetrics) -> None:
        """Queue a batch of frames for every client: one call and one wake (or one direct write)
        per client per batch."""
        batch = Batch(frames)
        for client in self.clients:
            for dropped in client.put_many(batch):
                metrics.dropped(dropped.event_type)

    def drain_backlog(self, metrics: EdgeMetrics) -> None:
        backlog, self.backlog = self.backlog, []
        self.ready.set()
        for event in backlog:
            self.offer(event, metrics)


SKIPPED_TYPE = "x.runwire.skipped"


def skipped_event(event: Event, format_name: str, error: BaseException) -> Extension:
    """An extension event telling a feed's clients which event they will not see, and why."""
    return Extension(
        id=event.id, ts=event.ts, type=SKIPPED_TYPE, run_id=event.run_id, seq=event.seq,
        child_ref=event.child_ref,
        payload={
            "code": PROTO_MALFORMED,
            "message": f"event {event.seq} ({event.type}) cannot be encoded as {format_name}: "
                       f"{type(error).__name__}; the other formats have it",
            "seq": event.seq,
            "event_type": event.type,
        },
    )


def frame_or_skip(encoder: Egress, event: Event, terminal: bool, format_name: str) -> Frame:
    """:func:`encode_frame`, or the ``x.runwire.skipped`` frame when the format cannot encode the event.

    Used by the feeds and by a client's catch-up alike, so a client sees the
    same frames whether it followed the run live or resumed it.
    """
    try:
        return encode_frame(encoder, event, terminal)
    except Exception as error:  # isolate the failure to this format and this event
        log.warning("edge hub: %s seq %d of %s cannot be encoded as %s: %r; skipped in that format",
                    event.type, event.seq, event.run_id, format_name, error)
        notice = skipped_event(event, format_name, error)
    try:
        payloads = encoder.encode(notice)
    except Exception:
        payloads = []
    if not payloads:  # a format with no place for extension events: the format-neutral shape
        payloads = [_json.encode({"type": "error", **notice.payload})]
    return Frame(payloads, seq=event.seq, event_type=notice.type, terminal=terminal)


def encode_preamble(encoder: Egress) -> list[bytes]:
    """The format's preamble frames, leaving out any its state cannot encode (see :func:`frame_or_skip`)."""
    out: list[bytes] = []
    for frame in encoder.preamble():
        try:
            out.append(_json.encode(frame))
        except Exception as error:
            log.warning("edge hub: a %s preamble frame cannot be encoded: %r; left out",
                        encoder.name, error)
    return out


def ends_stream(event: Event) -> bool:
    """The run's own terminal ``run.lifecycle`` (a child's, fanned in with ``child_id``, is not)."""
    return event.child_id is None and envelope.is_terminal(event)


def encode_frame(encoder: Egress, event: Event, terminal: bool) -> Frame:
    """One event's frame; a terminal lifecycle keeps a way to re-encode it with ``dropped_count``."""
    variant = _dropped_variant(encoder, event) if terminal else None
    payloads = encoder.encode(event)
    return Frame(
        payloads,
        seq=event.seq,
        rank=drop_rank(event, len(payloads)),
        terminal=terminal,
        event_type=event.type,
        variant=variant,
    )


def _dropped_variant(encoder: Egress, event: Event) -> Callable[[int], list[bytes]] | None:
    try:
        snapshot = copy.deepcopy(encoder)
    except RecursionError:  # state holding a value too deep to copy: the frame goes without a variant
        return None

    def render(dropped: int) -> list[bytes]:
        assert isinstance(event, RunLifecycle)
        previous = event.payload.dropped_count or 0
        payload = RunLifecyclePayload(
            state=event.payload.state, reason=event.payload.reason, dropped_count=previous + dropped
        )
        return copy.deepcopy(snapshot).encode(envelope.replace(event, payload=payload))

    return render
