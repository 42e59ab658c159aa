"""Sequencing: one contiguous delivery seq per destination stream.

A :class:`Sequencer` is the single writer's view of one delivery stream:

* it numbers the events it admits 1, 2, 3 … (the *delivery* seq);
* it remembers, per source run, the last *publisher* seq it admitted, so an
  entry the bus delivers twice is dropped and counted (``duplicates``);
* when a source's publisher seq jumps (``seq > last + 1``) it emits an
  ``x.gap`` event naming the missing range before the event, so a client sees
  that something was lost (Koder agent stream §7 T2: "client receiving events out-of-seq
  detects gap").

Publisher seq 0 means "not sequenced by the publisher": such events are
neither deduplicated nor gap-checked.

The state is a msgspec Struct stored atomically with each append to the raw
delivery stream (``bus.append(key, events, state=...)``), so a successor that
loads it (``bus.load_states``) continues exactly where the last writer stopped.
"""

from __future__ import annotations

import msgspec
from msgspec.structs import replace as replace_struct

from ..core.envelope import Event, Gap, GapPayload


class SequencerState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The checkpoint of one destination stream's sequencer."""

    last_seq: int = 0
    """The last delivery seq assigned."""
    sources: dict[str, int] = {}
    """Last publisher seq admitted, per source run."""
    ancestors: list[str] = []
    """The run's parent chain (parent first), so a successor fans in without relearning it."""
    duplicates: int = 0
    gaps: int = 0
    terminal: bool = False
    retired: bool = False
    """The run ended longer ago than its checkpoint is kept (the bus's ``checkpoint_grace_s``):
    what still arrives for it is dropped and counted, its streams stay closed."""
    owned: bool = False
    """Whether ``tenant`` is decided: the first event written to the stream decides it."""
    tenant: str | None = None
    """The tenant that owns the run (its first writer's); another tenant's event is refused."""


def owns(state: SequencerState, tenant: str | None) -> bool:
    """Whether the stream's run is ``tenant``'s: the first event written to it decides, once."""
    if not state.owned:
        state.owned, state.tenant = True, tenant
        return True
    return state.tenant == tenant


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SequencerState)


class Sequencer:
    """Assigns delivery seqs for one stream; dedupes and detects gaps per source run."""

    __slots__ = ("run_id", "state")

    def __init__(self, run_id: str, state: SequencerState | None = None) -> None:
        self.run_id = run_id
        self.state = state if state is not None else SequencerState()

    @classmethod
    def restore(cls, run_id: str, data: bytes | None) -> Sequencer:
        """A sequencer resumed from a stored checkpoint (or fresh when ``data`` is None)."""
        return cls(run_id, _decoder.decode(data) if data else None)

    def dump(self) -> bytes:
        """The checkpoint to store with the next append."""
        return _encoder.encode(self.state)

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    def admit(self, event: Event, source: str) -> list[Event]:
        """Sequence one event from ``source`` (its originating run).

        ``event.seq`` is the publisher's seq. Returns ``[]`` for a duplicate,
        ``[event]`` normally, ``[gap, event]`` after a jump in the publisher seq.
        """
        published = event.seq
        if published == 0:
            return [self.stamp(event)]
        last = self.state.sources.get(source, 0)
        if published <= last:
            self.state.duplicates += 1
            return []
        self.state.sources[source] = published
        if published == last + 1:
            return [self.stamp(event)]
        self.state.gaps += 1
        gap = Gap(
            id=f"{event.id}~gap",
            ts=event.ts,
            run_id=self.run_id,
            seq=0,
            child_ref=event.child_ref,
            tenant=event.tenant,
            payload=GapPayload(run_id=source, first=last + 1, last=published - 1),
        )
        return [self.stamp(gap), self.stamp(event)]

    def stamp(self, event: Event) -> Event:
        """Give ``event`` the next delivery seq (no dedupe: for events runwire makes itself)."""
        state = self.state
        state.last_seq += 1
        return replace_struct(event, seq=state.last_seq)
