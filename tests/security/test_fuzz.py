"""Property-based: generated frames of every ingest format — valid, malformed, huge, deep, hostile —
at the codec, at HTTP ingest and at a real worker (Redis bus, SQLite replay log).

What must hold for any input (invariant 5, Koder agent stream §8 error codes): no crash;
every bad event reported with a ``KAI-STREAM-*`` code (a per-line error at ingest, a dead-letter
entry in the worker); every valid event delivered exactly once, as sent.

Example counts are sized to finish in well under a minute on a shared CI machine; set
``RUNWIRE_FUZZ_SCALE=10`` (or more) for a longer hunt.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwire import protocols
from runwire.bus import Bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.core.errors import ProtocolError
from runwire.edge.service.ingest import decode_body
from runwire.store import ReplayLog
from runwire.workers.runtime import run_worker
from tests.edge.harness import EdgeServer, serve_edge
from tests.security.fuzzgen import format_line, koder_batch
from tests.security.hostile import publish_raw
from tests.workers.checks import read_all

SCALE = max(1, int(os.environ.get("RUNWIRE_FUZZ_SCALE", "1")))


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large, HealthCheck.large_base_example],
        database=None,
    )


def is_coded(error: ProtocolError) -> bool:
    return error.code.startswith("KAI-STREAM-")


@fuzz(150)
@given(koder_batch("fuzz-run"))
def test_the_codec_gives_every_frame_its_event_or_a_coded_error(
    batch: tuple[list[bytes], list[Event | None]],
) -> None:
    """Batch and single decoding agree, per frame, whatever the neighbours are."""
    frames, expected = batch
    many = envelope.decode_many(frames)
    lines = envelope.decode_lines(b"\n".join(frames))
    assert len(many) == len(lines) == len(frames)
    for frame, want, got, line in zip(frames, expected, many, lines, strict=True):
        if want is None:
            assert isinstance(got, ProtocolError) and is_coded(got), got
            with pytest.raises(ProtocolError):
                envelope.decode(frame)
        else:
            assert got == want == line == envelope.decode(frame)


@fuzz(40)
@given(st.data())
@pytest.mark.parametrize("format_name", sorted(protocols.INGEST))
def test_ingest_decoding_of_every_format_never_crashes_and_codes_every_bad_line(
    format_name: str, data: st.DataObject
) -> None:
    lines = data.draw(st.lists(format_line(format_name), min_size=1, max_size=12))
    body = b"\n".join(lines)
    decoded, errors = decode_body(body, format_name, "fuzz-run")
    assert all(error.code.startswith("KAI-STREAM-") for error in errors), errors
    for _line, event in decoded:
        assert envelope.decode(envelope.encode(event)) == event  # what a worker will read back




@pytest.fixture
async def edge(redis_bus: Bus, store: ReplayLog) -> AsyncIterator[EdgeServer]:
    async with serve_edge(redis_bus, store) as server:
        yield server


@fuzz(20)
@given(st.data())
async def test_http_ingest_and_a_real_worker_deliver_each_valid_event_once_and_code_each_bad_one(
    redis_bus: Bus, store: ReplayLog, edge: EdgeServer, data: st.DataObject
) -> None:
    """Valid lines go in over HTTP; the hostile ones both over HTTP (refused per line) and straight
    onto the bus, as a producer skipping every check would put them (dead-lettered one by one)."""
    run_id = f"fuzz-{uuid.uuid4().hex[:10]}"
    frames, expected = data.draw(koder_batch(run_id))
    hostile = [frame for frame, want in zip(frames, expected, strict=True) if want is None]
    valid = [want for want in expected if want is not None]
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{edge.url}/v1/runs/{run_id}/events?format=koder", content=b"\n".join(frames)
        )
    assert response.status_code == (422 if hostile else 200), response.text
    result = response.json()
    assert result["accepted"] == len(valid)
    assert [r["line"] for r in result["rejected"]] == [
        number for number, want in enumerate(expected, 1) if want is None
    ]
    assert all(r["code"].startswith("KAI-STREAM-") for r in result["rejected"])
    if hostile:
        await publish_raw(redis_bus, run_id, hostile)
    stats = await run_worker(redis_bus, store, group="fuzz", name="w", burst=True)
    assert stats.dead_lettered == len(hostile)
    letters = await redis_bus.dead_letters(limit=len(hostile) or 1)
    assert all("KAI-STREAM-" in letter.reason for letter in letters[: len(hostile)])
    raw = await read_all(redis_bus, run_id)
    assert [(e.id, e.type, e.payload_dict()) for e in raw] == [
        (e.id, e.type, e.payload_dict()) for e in valid
    ]
    assert [e.seq for e in raw] == list(range(1, len(valid) + 1))
    assert [e.id for e in await store.read(run_id)] == [e.id for e in raw]
