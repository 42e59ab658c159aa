"""What the edge serves from a run's replay log whole: its JSONL export and its span tree.

``GET /v1/runs/{run_id}/events.jsonl`` streams the run in any egress format (the bytes
``runwire replay export`` writes). ``GET /v1/runs/{run_id}/spans`` is the run's span tree
(:mod:`runwire.jobs.spans`) as JSON: the page's timeline draws it, and the span exporter sends the
same derivation over OTLP, so what a backend shows and what the page shows cannot drift apart. It
is derived from the log (which has every event a client has seen: the worker writes it first);
spans still open have no ``end_ts``.

The page asks again about once a second while a run is live, so the work per request is bounded:
the edge keeps the trees of the runs asked about lately (:class:`SpanTrees`, a few, least recently
asked dropped first) with the answer last written, and a request folds in only the events logged
since (none: the same bytes again). A tree is derived from at most :data:`SPAN_EVENTS` events and
holds at most :data:`MAX_SPANS` spans; past either the answer says ``"truncated": true`` and stays
what it was (the page says the timeline is cut short; the whole trace is the OTLP export's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ... import protocols
from ...core.errors import UnknownRun
from ...jobs.replay import export_chunks
from ...jobs.spans import SpanTree
from ...store.base import RunInfo
from ..fanout.transports import NDJSON_MEDIA_TYPE
from ..service.context import Edge
from ..service.params import choice

_encoder = msgspec.json.Encoder()

SPAN_EVENTS = 100_000
"""The most events of a run its span tree is derived from (a run's first ones)."""
MAX_SPANS = 5_000
"""The most spans of a run's tree (the first opened): past it, or past :data:`SPAN_EVENTS`, the
answer is truncated."""
CACHED_RUNS = 16
"""Runs whose trees the edge keeps between requests (memory: at most this many × MAX_SPANS spans)."""


async def _readable(edge: Edge, request: Request) -> RunInfo:
    """The run of the request, once the caller may read it and the log has it."""
    run_id: str = request.path_params["run_id"]
    principal = edge.gate.principal(request.headers, request.query_params)
    await edge.gate.check_run(principal, run_id, "read")
    info = await edge.store.run(run_id)
    if info is None:
        raise UnknownRun(f"no run {run_id!r} in the replay log")
    return info


class _Derived:
    """A run's tree as far as it was folded, and the answer written from it."""

    __slots__ = ("body", "events", "lock", "tree", "truncated")

    def __init__(self, run_id: str) -> None:
        self.tree = SpanTree(run_id)
        self.events = 0
        self.truncated = False
        self.body: bytes | None = None
        self.lock = asyncio.Lock()


class SpanTrees:
    """The span trees of the runs asked about lately, each folded on from where it was."""

    def __init__(self, store: Any, size: int = CACHED_RUNS) -> None:
        self.store = store
        self.size = size
        self._runs: OrderedDict[str, _Derived] = OrderedDict()

    async def answer(self, info: RunInfo) -> bytes:
        """The JSON answer of ``GET /v1/runs/{id}/spans`` for the run as the log has it now."""
        run_id = info.run_id
        derived = self._runs.get(run_id)
        if derived is None or derived.tree.last_seq > info.last_seq:  # new, or the log was cut back
            derived = self._runs[run_id] = _Derived(run_id)
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.size:
            self._runs.popitem(last=False)
        async with derived.lock:
            if derived.body is None or (not derived.truncated and info.last_seq > derived.tree.last_seq):
                await self._fold(derived)
                tree = derived.tree
                spans = tree.spans()
                derived.truncated = derived.truncated or len(spans) > MAX_SPANS
                derived.body = _encoder.encode({"run_id": run_id, "trace_id": tree.trace_id, "last_seq": tree.last_seq,
                                                "truncated": derived.truncated, "spans": spans[:MAX_SPANS]})
            return derived.body

    async def _fold(self, derived: _Derived) -> None:
        tree = derived.tree
        async with contextlib.aclosing(self.store.iter_events(tree.root_id, after=tree.last_seq)) as events:
            async for event in events:
                if derived.events >= SPAN_EVENTS or tree.span_count > MAX_SPANS:
                    derived.truncated = True
                    return
                tree.apply(event)
                derived.events += 1


def export_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = (await _readable(edge, request)).run_id
        format_name = choice(request.query_params.get("format", "koder"), tuple(protocols.EGRESS), "format")
        chunks = export_chunks(edge.store, run_id, format=format_name)
        return StreamingResponse((chunk async for chunk, _ in chunks), media_type=NDJSON_MEDIA_TYPE)

    return endpoint


def spans_endpoint(edge: Edge) -> Any:
    trees = SpanTrees(edge.store)

    async def endpoint(request: Request) -> Response:
        info = await _readable(edge, request)
        return Response(await trees.answer(info), media_type="application/json")

    return endpoint
