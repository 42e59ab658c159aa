"""Ingest, the same for every entrance: a body posted to a run (HTTP ``POST /v1/runs/{run_id}/events``,
gRPC ``Ingest``), for agents that can't reach the bus.

The body is NDJSON in any ingest format (``?format=``, else detected from
the body, else ``koder``). **Partial acceptance**: every valid line is
published, in order; every bad line is reported with its 1-based line
number, its ``KAI-STREAM-*`` code and the reason. The answer is ``200``
when every line was good and ``422`` when any was bad (``accepted`` says how
many events were published anyway). Re-posting the corrected batch is
safe: appends downstream are idempotent on ``(run_id, seq)``, so the lines
already accepted are not duplicated. Every event is held to the limits a
worker decodes with (:func:`runwire.core.envelope.check`: numbers within int64,
nesting, frame size), so nothing accepted here is dead-lettered there. If the bus is down nothing is
published and the answer is ``503`` — retry the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ... import protocols
from ...core import envelope, limits
from ...core.envelope import Event
from ...core.errors import (
    PROTO_MALFORMED,
    ConfigError,
    LineError,
    MalformedFrame,
    ProtocolError,
    RequestError,
    line_error,
)
from ...sdk.runcontext import RunContext
from .auth import Principal
from .authz import admit
from .context import Edge

DEFAULT_FORMAT = "koder"


class IngestResult(msgspec.Struct, kw_only=True):
    format: str
    accepted: int
    rejected: list[LineError]


def detect_format(body: bytes) -> str:
    """The ingest format of a body, from its first lines.

    Bad lines must not hide the format of the good ones (they are reported
    per line later), so when the first lines together fit no single format,
    the first line that fits one on its own decides.
    """
    from ...protocols.detect import detect

    lines = [line for line in body.splitlines()[:20] if line.strip()]
    if not lines:
        return DEFAULT_FORMAT
    try:
        return detect(lines)
    except ConfigError as together:
        for line in lines:
            try:
                return detect([line])
            except ConfigError:
                continue
        raise together from None


def decode_body(
    body: bytes,
    format_name: str,
    run_id: str,
    thread_id: str | None = None,
    context: RunContext | None = None,
    *,
    max_events: int = limits.EVENTS_PER_REQUEST,
) -> tuple[list[tuple[int, Event]], list[LineError]]:
    """Decode an NDJSON body for ``run_id``: ``(line, event)`` pairs and the errors of bad lines.

    Whether the events may be written is :func:`.authz.admit`'s decision.
    ``thread_id`` (the ``Thread-Id`` header or ``?thread_id=``) is stamped on
    the run's own events that have none; one naming another thread is rejected
    (a thread id longer than :data:`runwire.core.limits.ID_CHARS` refuses the request).
    More than ``max_events`` lines or events refuse the whole body (BodyTooLarge).
    ``context`` (the ``Runwire-Run-Context`` header) makes the run a child:
    its own events that name no parent get the token's parent and root.
    """
    if thread_id is not None and len(thread_id) > limits.ID_CHARS:
        raise RequestError(f"the thread id is longer than {limits.ID_CHARS} characters")
    codec = protocols.ingest(format_name, run_id=run_id)
    events: list[tuple[int, Event]] = []
    errors: list[LineError] = []
    chunks = body.splitlines() if codec.line_based else [body]
    limits.check_count(len(chunks), max_events, "the request")
    for number, line in enumerate(chunks, start=1):
        if not line.strip():
            continue
        try:
            decoded = [_in_tree(_thread(envelope.check(e), run_id, thread_id), run_id, context)
                       for e in _feed(codec, line)]
        except ProtocolError as exc:
            errors.append(line_error(number, exc))
            continue
        events.extend((number, event) for event in decoded)
    try:
        events.extend((len(chunks), _in_tree(_thread(envelope.check(e), run_id, thread_id), run_id, context))
                      for e in codec.close())
    except ProtocolError as exc:
        errors.append(line_error(len(chunks), exc))
    limits.check_count(len(events), max_events, "the request")
    return events, errors


@dataclass(frozen=True, slots=True)
class IngestRequest:
    """A body posted to a run, as every ingest entrance (HTTP ``POST …/events``, gRPC
    ``Ingest``) hands it to :func:`publish_body`: the run it is posted to, the body, its ingest
    format, the thread (``Thread-Id``) and the run context (``Runwire-Context``) it came with."""

    run_id: str
    body: bytes
    format: str = DEFAULT_FORMAT
    thread_id: str | None = None
    context: RunContext | None = None


async def publish_body(edge: Edge, principal: Principal | None, request: IngestRequest) -> IngestResult:
    """Decode ``request``'s body, admit its events (the write rule), publish them in order.

    Every ingest entrance's path; the caller has called :func:`.authz.authorize_write` for the
    run. The body is bounded by the edge's ``max_ingest_events``. Raises the replay log's or the
    bus's error (nothing published) when either is down.
    """
    run_id, format_name = request.run_id, request.format
    lined, errors = decode_body(request.body, format_name, run_id, request.thread_id, request.context,
                                max_events=edge.settings.max_ingest_events)
    admission = await admit(edge.gate, principal, run_id, [event for _, event in lined])
    errors.extend(line_error(lined[index][0], exc) for index, exc in admission.refused)
    errors.sort(key=lambda error: error.line)
    events = admission.events
    if events:
        await edge.bus.publish(events)
        edge.metrics.ingested.inc(len(events))
    return IngestResult(format=format_name, accepted=len(events), rejected=errors)


def _in_tree(event: Event, run_id: str, context: RunContext | None) -> Event:
    if context is None or event.run_id != run_id or event.parent_id is not None:
        return event
    return envelope.replace(event, parent_id=context.run, root_id=context.root_id)


def _feed(codec: protocols.Ingest, line: bytes) -> list[Event]:
    """``codec.feed``; a frame nested too deep for any parser is a bad frame, not a crash."""
    try:
        return codec.feed(line)
    except RecursionError:
        raise MalformedFrame(
            f"frame is nested deeper than {envelope.MAX_DEPTH} levels", field="$"
        ) from None


def _thread(event: Event, run_id: str, thread_id: str | None) -> Event:
    """The run's own event with the request's thread (ProtocolError for another thread)."""
    if thread_id is None or event.run_id != run_id:
        return event
    if event.thread_id not in (None, thread_id):
        raise ProtocolError(
            f"event of thread {event.thread_id!r} posted with Thread-Id {thread_id!r}", field="$.thread_id"
        )
    return event if event.thread_id is not None else envelope.replace(event, thread_id=thread_id)


def resolve_format(requested: str | None, body: bytes) -> str:
    """The format to decode with; RequestError for an unknown ``?format=``.

    A body none of whose lines fits any format is decoded as ``koder``, so
    each line is reported with its own code instead of one "cannot detect".
    """
    if not requested:
        try:
            return detect_format(body)
        except ConfigError:
            return DEFAULT_FORMAT
    if requested not in protocols.INGEST:
        raise RequestError(f"unknown ingest format {requested!r}; known: {', '.join(sorted(protocols.INGEST))}")
    return requested


__all__ = [
    "PROTO_MALFORMED", "IngestResult", "LineError", "decode_body", "line_error", "publish_body", "resolve_format",
]
