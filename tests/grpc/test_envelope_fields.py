"""Every field of the canonical envelope survives every entrance and every exit.

One event with *every* field of :class:`runwire.core.envelope.Envelope` set (the
sample is checked against the Struct's own field list, so a field added there
and not here fails this module) goes in through each ingest entrance — HTTP
NDJSON, Durable Streams ``POST``, gRPC ``Ingest`` — and out through each
exit — SSE, WebSocket, NDJSON, the JSONL export, Durable Streams catch-up,
gRPC ``Stream``. What comes out equals what went in, field for field.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec
import websockets
from msgspec import UNSET

from runwire.bus.base import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb
from runwire.store.base import ReplayLog
from tests.e2e_harness import ndjson, sse
from tests.edge.harness import decoded, event

from .harness import read_all, serve

SAMPLE: dict[str, Any] = {
    "ts": "2026-11-24T10:00:00.250Z",
    "child_id": "kid-1",
    "ext": {"loom": {"node": "n1", "attempt": 2}},
    "span": [1, 1],
    "parent_id": "parent-1",
    "root_id": "root-1",
    "tenant": "acme",
    "thread_id": "thread-1",
}
"""A value for every optional envelope field (and a ts of its own)."""


def full_event(run_id: str, seq: int = 1) -> Event:
    """A ``tool.start`` of ``run_id`` with every envelope field set."""
    sample = envelope.make(
        "tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "x"}},
        id=f"evt_01JX{seq:022d}", run_id=run_id, seq=seq,
        **{k: tuple(v) if k == "span" else v for k, v in SAMPLE.items()},
    )
    unset = [
        field.encode_name for field in msgspec.structs.fields(envelope.Envelope)
        if getattr(sample, field.name) in (None, UNSET)
    ]
    assert unset == [], f"give the sample a value for the envelope's new field(s) {unset}"
    return sample


def as_json(event: Event) -> dict[str, Any]:
    return msgspec.json.decode(envelope.encode(event))


def to_message(fields: dict[str, Any]) -> pb.Event:
    """A canonical JSON envelope as a ``runwire.v1.Event``, field by field (by name)."""
    message = pb.Event()
    for name, value in fields.items():
        if name == "span":
            message.span.first, message.span.last = value
        elif name in ("payload", "ext"):
            setattr(message, name, json.dumps(value))
        else:
            setattr(message, name, value)  # AttributeError: the proto lacks an envelope field
    return message


def from_message(message: pb.Event) -> dict[str, Any]:
    """A ``runwire.v1.Event`` as a canonical JSON envelope (its set fields, by name)."""
    out: dict[str, Any] = {}
    for descriptor, value in message.ListFields():
        if descriptor.name == "span":
            out["span"] = [value.first, value.last]
        elif descriptor.name in ("payload", "ext"):
            out[descriptor.name] = json.loads(value)
        else:
            out[descriptor.name] = value
    return out


async def test_every_envelope_field_reaches_every_exit(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """A delivery stream's event is read with all its fields over SSE, WebSocket, NDJSON, the JSONL
    export, Durable Streams catch-up and gRPC Stream."""
    sample = full_event(run_id)
    end = event(run_id, 2, "run.lifecycle", {"state": "done"})
    await memory_bus.append((run_id, "raw"), [sample, end])
    await store.append([sample, end])
    expected = as_json(sample)
    async with serve(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        stream = f"{edge.http}/v1/runs/{run_id}/stream?detail=full"
        read: dict[str, dict[str, Any]] = {
            "sse": decoded(await sse(http, stream))[0],
            "ndjson": (await ndjson(http, stream))[0],
            "export": json.loads((await http.get(f"{edge.http}/v1/runs/{run_id}/events.jsonl")).text.splitlines()[0]),
            "durable": (await http.get(f"{edge.http}/v1/ds/runs/{run_id}?offset=-1&detail=full")).json()[0],
        }
        async with websockets.connect(stream.replace("http", "ws", 1)) as ws:
            read["websocket"] = json.loads(await ws.recv())
        messages = await read_all(edge.client().stream(run_id, detail="full"))
        read["grpc"] = from_message(messages[0])
    assert read == {exit: expected for exit in read}


async def test_every_envelope_field_passes_every_entrance(memory_bus: Bus, store: ReplayLog, run_id: str) -> None:
    """The same event posted to HTTP ingest (NDJSON), Durable Streams and gRPC Ingest is published
    on the bus with all its fields."""
    runs = {entrance: f"{run_id}-{entrance}" for entrance in ("ndjson", "durable", "grpc")}
    consumer = memory_bus.consumer("fields", "c1")
    async with serve(memory_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        posted = await http.post(
            f"{edge.http}/v1/runs/{runs['ndjson']}/events", content=envelope.encode(full_event(runs["ndjson"]))
        )
        assert posted.status_code == 200, posted.text
        durable = f"{edge.http}/v1/ds/runs/{runs['durable']}"
        json_body = {"Content-Type": "application/json"}
        assert (await http.put(durable, headers=json_body)).status_code == 201
        appended = await http.post(durable, content=envelope.encode(full_event(runs["durable"])), headers=json_body)
        assert appended.status_code in (200, 204), appended.text
        reply = await edge.client().ingest([to_message(as_json(full_event(runs["grpc"])))])
        assert (reply.accepted, list(reply.rejected)) == (1, [])
    published: dict[str, dict[str, Any]] = {}
    async with asyncio.timeout(10):
        while len(published) < len(runs):
            for delivery in await consumer.fetch(100, block_ms=500):
                got = envelope.decode(delivery.data)
                published[next(k for k, v in runs.items() if v == got.run_id)] = as_json(got)
    await consumer.close()
    assert published == {entrance: as_json(full_event(run)) for entrance, run in runs.items()}
