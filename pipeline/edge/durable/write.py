"""Durable Streams, write side: ``PUT`` creates a run, ``POST`` appends to it, onto runwire's ingest.

``PUT /v1/ds/runs/{run_id}`` (``Content-Type: application/json``) creates the
run as a stream (``201``; ``200`` when it already is one; ``409`` for a run
that already has events from another entrance). ``POST`` appends a JSON
message or an array of them (flattened one level, Durable Streams protocol
§9.1.2); each message is one line of any ingest format runwire reads
(``?format=``, else detected, as on ``POST /v1/runs/{run_id}/events``). The
batch is decoded, admitted by the write rule and published exactly like HTTP
ingest (:mod:`.ingest`, :mod:`.authz`), but **all or nothing**: one bad
message refuses the batch (``400`` with every line's error).

The run's own events are numbered by the stream (publisher seqs ``base + 1 …``
reserved in the replay log, :mod:`runwire.store.producers`), whatever their
codec numbered, so batches of any format form one seq space. With
``Producer-Id`` / ``Producer-Epoch`` / ``Producer-Seq`` (§5.2.1): a retried
batch is ``204`` and not applied twice — but a "retry" of the producer's latest
batch with other bytes is ``409`` (one ``(producer, epoch, seq)`` names one
batch) —, a stale epoch ``403`` with the current
``Producer-Epoch``, a gap ``409`` with ``Producer-Expected-Seq``. That state is
in the replay log, so it survives a restart and is shared by every edge.
``Stream-Closed: true`` ends the run: a ``run.lifecycle`` ``done`` follows the
batch unless it ends the run itself.

A ``PUT`` with ``Stream-Forked-From: /v1/ds/runs/{source}`` (and optionally
``Stream-Fork-Offset``, the source's tail when absent) creates the run as a
fork of the source (§4.2): its history is the source's messages before that
offset — an offset is a delivery seq, so the fork's offsets are the source's up
to there and its own after —, made by :func:`.fork.fork_for` (auth, ``404`` for
a source the caller cannot read, ``400`` for an offset past the source's tail,
``409`` for an id taken by another run or fork; the same fork again is ``200``).
The fork is a stream of its own: no producer state is inherited.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from urllib.parse import unquote

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ...core import envelope, limits
from ...core.envelope import Event
from ...core.errors import REQ_BAD_BODY, REQ_QUOTA, RequestError, RunwireError, UnknownRun
from ...core.retry import state_of
from ...core.ulid import new_event_id
from ...store.base import ForkPoint
from ...store.producers import MAX_PRODUCERS, Reservation
from ..fanout.resume import probe
from ..service.auth import Principal
from ..service.authz import admit, authorize_write
from ..service.context import Edge
from ..service.fork import fork_for
from ..service.ingest import decode_body, resolve_format
from ..service.params import bounded_body, canonical_int
from .read import JSON, SAFETY, decode_offset, encode_offset

HOLD_S = 5.0
"""How long a reserved batch holds its stream if its edge dies before publishing it."""
BUSY_WAIT_S = 10.0
MAX_PRODUCER_NUMBER = 2**53 - 1
_json = msgspec.json.Encoder()


class DurableWrite:
    """``PUT`` and ``POST`` on ``/v1/ds/runs/{run_id}``."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def endpoint(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        edge = self.edge
        principal = edge.gate.principal(request.headers, request.query_params)
        await authorize_write(edge.gate, principal, run_id)
        body = await bounded_body(request, edge.settings.max_ingest_bytes,
                                  timeout_s=edge.settings.body_timeout_s, what="append")
        _check_content_type(request, body)
        if request.method == "PUT":
            return await self.create(request, run_id, body, principal)
        return await self.append(request, run_id, body, principal)

    async def create(self, request: Request, run_id: str, body: bytes, principal: Principal | None) -> Response:
        state = await self.edge.store.stream_state(run_id)
        forked = request.headers.get("stream-forked-from")
        if forked is not None:
            if "stream-fork-sub-offset" in request.headers:
                raise RequestError("Stream-Fork-Sub-Offset is not served: an offset here is one whole event")
            at = _fork_offset(request.headers.get("stream-fork-offset"))
            if state is not None and await _fork_of(self.edge, run_id) is None:
                return _plain(409, f"stream {run_id!r} exists and is no fork")
            await fork_for(self.edge, principal, _source_of(forked), at=at, run_id=run_id)
        elif state is None and (await probe(self.edge.bus, self.edge.store, (run_id, "raw"))).published:
            return _plain(409, f"run {run_id!r} already has events from another entrance; "
                               "append to it with POST /v1/runs/{run_id}/events")
        if principal is not None:  # the stream is the caller's tenant's from its creation
            await self.edge.gate.claim(run_id, principal.tenant, run_id)
        created = await self.edge.store.stream_create(run_id)
        if body.strip() not in (b"", b"[]") or _closing(request):
            answer = await self.append(request, run_id, body, principal)
            if answer.status_code >= 300:
                return answer
        state = await self.edge.store.stream_state(run_id)
        base = await _fork_base(self.edge, run_id)
        headers = {"stream-next-offset": encode_offset(base + (state[0] if state else 0)), **SAFETY}
        if state and state[1]:
            headers["stream-closed"] = "true"
        if created:
            headers["location"] = str(request.url.remove_query_params("access_token"))
        return Response(status_code=201 if created else 200, headers=headers, media_type=JSON)

    async def append(self, request: Request, run_id: str, body: bytes, principal: Principal | None) -> Response:
        producer = _producer(request)
        close = _closing(request)
        events = await self._decode(request, run_id, body, close)
        admission = await admit(self.edge.gate, principal, run_id, events)
        if admission.refused:
            return _refused([(i + 1, exc) for i, exc in admission.refused], status=403)
        own = [e for e in admission.events if e.run_id == run_id]
        digest = hashlib.sha256(body).hexdigest() if producer is not None else ""
        decision = await self._reserve(run_id, producer, len(own), close, digest)
        outcome = decision.outcome
        if outcome in ("append", "duplicate") and (outcome == "append" or decision.last_of_producer):
            numbered = _number(admission.events, run_id, decision.base)
            try:
                if numbered:
                    await self.edge.bus.publish(numbered)  # a duplicate again: the workers drop it
                    self.edge.metrics.ingested.inc(len(numbered))
            except RunwireError as exc:
                if exc.retriable:
                    self.edge.metrics.pause(state_of(exc))
                return _plain(503, f"{exc}; retry the batch (it is not applied twice)", retry=True)
            finally:
                if outcome == "append":
                    await self.edge.store.stream_release(run_id)
        base = await _fork_base(self.edge, run_id) if outcome in ("append", "duplicate") else 0
        return _answer(decision, producer, base + decision.base + len(own), close)

    async def _decode(self, request: Request, run_id: str, body: bytes, close: bool) -> list[Event]:
        lines = _messages(body, allow_empty=close)
        ndjson = b"\n".join(lines)
        format_name = resolve_format(request.query_params.get("format"), ndjson)
        lined, errors = (decode_body(ndjson, format_name, run_id, max_events=self.edge.settings.max_ingest_events)
                         if lines else ([], []))
        if errors:
            raise RequestError(
                "; ".join(f"message {e.line}: {e.code}: {e.message}" for e in errors[:10]), code=REQ_BAD_BODY
            )
        events = [event for _, event in lined]
        if close and not any(e.run_id == run_id and envelope.is_terminal(e) for e in events):
            events.append(envelope.make("run.lifecycle", {"state": "done"}, id=new_event_id(),
                                        ts=envelope.now_ts(), run_id=run_id, seq=1))
        return events

    async def _reserve(
        self, run_id: str, producer: tuple[str, int, int] | None, count: int, close: bool, digest: str
    ) -> Reservation:
        deadline = time.monotonic() + BUSY_WAIT_S
        while True:
            decision = await self.edge.store.stream_reserve(run_id, producer, count, close=close, hold_s=HOLD_S,
                                                            digest=digest)
            if decision.outcome != "busy" or time.monotonic() > deadline:
                return decision
            await asyncio.sleep(0.02)


def _number(events: list[Event], run_id: str, base: int) -> list[Event]:
    """The run's own events numbered ``base + 1 …`` in order; other runs' events (children) as they are."""
    out: list[Event] = []
    seq = base
    for event in events:
        if event.run_id == run_id:
            seq += 1
            event = envelope.replace(event, seq=seq)
        out.append(event)
    return out


def _messages(body: bytes, *, allow_empty: bool) -> list[bytes]:
    """The JSON messages of a body, one level of array flattened (§9.1.2), each re-encoded as a line."""
    if not body.strip():
        if allow_empty:
            return []
        raise RequestError("an append needs a body (only a close, Stream-Closed: true, may be empty)")
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}", code=REQ_BAD_BODY) from None
    if isinstance(value, list):
        if not value:
            raise RequestError("an empty JSON array appends nothing (§9.1.3)", code=REQ_BAD_BODY)
        return [_json.encode(item) for item in value]
    return [_json.encode(value)]


def _producer(request: Request) -> tuple[str, int, int] | None:
    """``(Producer-Id, Producer-Epoch, Producer-Seq)``: all three or none (400)."""
    names = ("producer-id", "producer-epoch", "producer-seq")
    values = [request.headers.get(name) for name in names]
    if all(v is None for v in values):
        return None
    producer_id, epoch, seq = values
    if not producer_id or epoch is None or seq is None:
        raise RequestError("Producer-Id, Producer-Epoch and Producer-Seq go together, Producer-Id non-empty")
    if len(producer_id) > limits.ID_CHARS:
        raise RequestError(f"Producer-Id is longer than {limits.ID_CHARS} characters")
    return (producer_id, canonical_int(epoch, "Producer-Epoch", high=MAX_PRODUCER_NUMBER),
            canonical_int(seq, "Producer-Seq", high=MAX_PRODUCER_NUMBER))


def _closing(request: Request) -> bool:
    return request.headers.get("stream-closed", "").lower() == "true"


async def _fork_of(edge: Edge, run_id: str) -> ForkPoint | None:
    """The fork the run is (None: it is no fork)."""
    return next((f for f in await edge.store.fork_points([run_id]) if f.run_id == run_id), None)


async def _fork_base(edge: Edge, run_id: str) -> int:
    """The seqs a fork's history holds before its own messages (0 for a stream that is no fork)."""
    fork = await _fork_of(edge, run_id)
    return 0 if fork is None else fork.at


def _source_of(forked_from: str) -> str:
    """The run a ``Stream-Forked-From`` path names (``…/v1/ds/runs/{run_id}``; UnknownRun: none)."""
    path = forked_from.split("?", 1)[0]
    marker = "/v1/ds/runs/"
    if marker not in path or not path.rsplit(marker, 1)[1]:
        raise UnknownRun(f"no stream at {forked_from[:200]!r}: a fork's source is a /v1/ds/runs/{{run_id}} path")
    return unquote(path.rsplit(marker, 1)[1])


def _fork_offset(raw: str | None) -> int | None:
    """The seq a ``Stream-Fork-Offset`` stands after (None: the source's tail)."""
    if raw is None:
        return None
    at = decode_offset(raw)
    if at is None:  # "now" is not an offset the server returned; it means the tail
        return None
    return at


def _check_content_type(request: Request, body: bytes) -> None:
    media = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if body and media != JSON:
        raise RequestError(f"runwire's streams are JSON mode: Content-Type must be {JSON}, not {media!r}")


def _answer(decision: Reservation, producer: tuple[str, int, int] | None, tail: int, close: bool) -> Response:
    headers = dict(SAFETY)
    outcome = decision.outcome
    if producer is not None:
        headers["producer-epoch"] = str(decision.epoch)
    if outcome == "missing":
        return _plain(404, "no such stream: create it with PUT first")
    if outcome == "new-epoch-seq":
        return _plain(400, "a new Producer-Epoch starts at Producer-Seq 0")
    if outcome == "too-many-producers":
        return Response(_json.encode({
            "error": f"this stream already has {MAX_PRODUCERS} producers; reuse a Producer-Id",
            "code": REQ_QUOTA}), status_code=429, media_type=JSON, headers={**headers, "retry-after": "1"})
    if outcome == "conflict":
        headers["producer-seq"] = str(decision.last_seq)
        return Response(_json.encode({
            "error": f"Producer-Seq {decision.last_seq} of epoch {decision.epoch} was accepted for another "
                     "batch; a retry must send the same bytes (send new messages with the next Producer-Seq)",
            "code": REQ_BAD_BODY}), status_code=409, media_type=JSON, headers=headers)
    if outcome == "stale-epoch":
        return Response(status_code=403, headers=headers)
    if outcome == "gap":
        headers["producer-expected-seq"] = str(decision.last_seq + 1)
        headers["producer-received-seq"] = str(producer[2] if producer else 0)
        return Response(status_code=409, headers=headers)
    if outcome == "busy":
        return _plain(503, "the stream is busy with another batch; retry", retry=True)
    if outcome == "closed":
        headers.update({"stream-closed": "true", "stream-next-offset": encode_offset(decision.base)})
        return Response(status_code=204 if close else 409, headers=headers)
    if producer is not None:
        headers["producer-seq"] = str(decision.last_seq)
    if outcome == "duplicate":
        return Response(status_code=204, headers=headers)
    headers["stream-next-offset"] = encode_offset(tail)
    if close:
        headers["stream-closed"] = "true"
    return Response(status_code=200 if producer is not None else 204, headers=headers)


def _plain(status: int, message: str, *, retry: bool = False) -> Response:
    headers = {**SAFETY, **({"retry-after": "1"} if retry else {})}
    return Response(_json.encode({"error": message}), status_code=status, media_type=JSON, headers=headers)


def _refused(errors: list[tuple[int, RunwireError]], *, status: int) -> Response:
    body = {"error": "the batch was refused", "rejected": [
        {"message": index, "code": exc.code, "error": str(exc)} for index, exc in errors]}
    return Response(_json.encode(body), status_code=status, media_type=JSON, headers=dict(SAFETY))
