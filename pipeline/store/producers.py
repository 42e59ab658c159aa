"""Durable Streams write state: which runs were created as streams, and their idempotent producers.

The protocol's producers (Durable Streams protocol §5.2.1) send
``Producer-Id`` / ``Producer-Epoch`` / ``Producer-Seq`` with every batch; the
server fences stale epochs, acknowledges a retried batch without applying it
twice and refuses a sequence gap. That state must outlive an edge and be the
same on every edge, so it lives in the replay log next to the runs
(``stream_reserve``), decided by :func:`decide` in one transaction per batch.

A stream's batches are numbered by the log too: a batch of ``count`` events
reserves publisher seqs ``base + 1 … base + count`` (``next_seq``), so every
format's events carry one contiguous seq space whatever their codec numbered,
and a retried batch is re-published with the *same* seqs (the workers drop
them as duplicates; if the first attempt never reached the bus, this one
does). A reservation holds the stream for ``hold_s`` until
``stream_release``: the next batch waits, so batches reach the bus in the
order they were numbered even when they arrive at different edges.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Outcome = Literal[
    "append", "duplicate", "conflict", "stale-epoch", "gap", "new-epoch-seq", "busy", "closed", "missing",
    "too-many-producers",
]
MAX_PRODUCERS = 64
"""Producers one stream remembers at most: a new producer past it is refused (429), so a writer
can't grow the producers table of a stream without bound by inventing ``Producer-Id`` values."""


class ProducerState(msgspec.Struct, kw_only=True):
    epoch: int
    last_seq: int
    """Highest accepted Producer-Seq in ``epoch`` (-1 before the first)."""
    last_base: int = 0
    """The stream's next_seq before the producer's last accepted batch (its publisher seqs follow it)."""
    last_digest: str = ""
    """A digest of the producer's last accepted batch: a retry of it must be the same bytes."""


class Reservation(msgspec.Struct, kw_only=True, frozen=True):
    """What ``stream_reserve`` decided for one batch."""

    outcome: Outcome
    base: int = 0
    """Publisher seqs of the batch are ``base + 1 …`` (append; a duplicate of the producer's last batch)."""
    epoch: int = 0
    """The producer's current epoch (echoed on success, the fencing epoch on stale-epoch)."""
    last_seq: int = -1
    """The producer's highest accepted seq in ``epoch`` (expected - 1 on a gap)."""
    last_of_producer: bool = False
    """A duplicate of the producer's latest batch (safe to re-publish with ``base``)."""


def decide(state: ProducerState | None, epoch: int, seq: int, digest: str = "") -> Reservation:
    """The protocol's validation (§5.2.1) for a batch ``(epoch, seq)`` given the producer's state.

    A retry of the producer's latest batch whose bytes differ from the accepted
    one (``digest``) is a ``conflict``: one ``(producer, epoch, seq)`` names one
    batch, so a different body under it is refused rather than acknowledged
    and silently dropped.
    """
    if state is None or epoch > state.epoch:
        if seq != 0:
            return Reservation(outcome="new-epoch-seq", epoch=epoch)
        return Reservation(outcome="append", epoch=epoch, last_seq=0)
    if epoch < state.epoch:
        return Reservation(outcome="stale-epoch", epoch=state.epoch, last_seq=state.last_seq)
    if seq <= state.last_seq:
        latest = seq == state.last_seq
        if latest and digest and state.last_digest and digest != state.last_digest:
            return Reservation(outcome="conflict", epoch=epoch, last_seq=state.last_seq)
        return Reservation(outcome="duplicate", epoch=epoch, last_seq=state.last_seq,
                           base=state.last_base if latest else 0, last_of_producer=latest)
    if seq == state.last_seq + 1:
        return Reservation(outcome="append", epoch=epoch, last_seq=seq)
    return Reservation(outcome="gap", epoch=epoch, last_seq=state.last_seq)


def reserve(
    stream: tuple[int, int, float] | None, state: ProducerState | None,
    producer: tuple[str, int, int] | None, now: float, digest: str = "", producers: int = 0,
) -> Reservation:
    """A batch's fate given the stream's ``(next_seq, closed, busy_until)`` row and its producer's state.

    ``append`` carries the base to number from; the caller then stores
    ``next_seq = base + count`` and the producer's new state in the same transaction.
    ``producers`` is how many producers the stream has (counted only for a new one).
    """
    if stream is None:
        return Reservation(outcome="missing")
    if producer is not None and state is None and producers >= MAX_PRODUCERS:
        return Reservation(outcome="too-many-producers")
    next_seq, closed, busy_until = stream
    decision = (decide(state, producer[1], producer[2], digest) if producer is not None
                else Reservation(outcome="append"))
    if decision.outcome != "append":
        return decision  # a duplicate is acknowledged even on a closed stream (the closing batch's retry)
    if closed:
        return Reservation(outcome="closed", base=next_seq)
    if busy_until > now:
        return Reservation(outcome="busy")
    return msgspec.structs.replace(decision, base=next_seq)
